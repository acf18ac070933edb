"""Recordings of real jobs on an H100 (``python bench/gpu_validate.py``, tests/data/h100_live/).

Two ranks on the one GPU (gloo over CUDA tensors) under ``auditor run --no-ray --record``, each
replayed through the whole analysis as ``auditor replay`` reads it (the run's last 10 s window):
the findings are the ones the live run printed, with exact ranks. The probe timed these steps
with CUDA events on the device's timeline, so they are what the GPU paths produce, not what a
generator thought they would.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from auditor.analysis import SampleStore, analyze
from auditor.analysis.findings import Finding
from auditor.analysis.rules import idle_device
from auditor.analysis.snapshot import WARMUP_STEPS, Snapshot
from auditor.telemetry.recorded import read_recording

DATA = Path(__file__).resolve().parents[1] / "data" / "h100_live"
UUID = "GPU-fafad6c6-e0e4-5c9b-0e2f-1c8434912385"


def replay(name: str) -> tuple[Snapshot, list[Finding]]:
    rec = read_recording(DATA / f"{name}.jsonl")
    assert rec.problems == []
    store = SampleStore(job=rec.job)
    store.add(rec.batch)
    now = store.latest_time()
    assert now is not None
    snap = store.snapshot(now=now, window_s=10.0)
    return snap, analyze(snap)


def warnings_of(findings: list[Finding]) -> dict[str, tuple[int, ...]]:
    return {f.kind: f.ranks for f in findings if f.severity in ("warning", "critical")}


def test_the_recordings_hold_real_cuda_ranks_on_one_gpu() -> None:
    for name in ("verdict_starve", "verdict_forward", "verdict_none"):
        snap, _ = replay(name)
        assert {r: v.info.device for r, v in snap.view_of.items()} == {0: "cuda:0", 1: "cuda:0"}
        assert dict(snap.owners) == {UUID: (0, 1)}  # both ranks on GPU 0: shared
        gpu = dict(snap.gpus_in_place)[UUID]
        assert gpu.model == "NVIDIA H100 80GB HBM3"


def test_starved_rank_gets_workers_and_pinned_memory() -> None:
    _, findings = replay("verdict_starve")
    assert warnings_of(findings) == {"data_starvation": (1,)}
    (f,) = [f for f in findings if f.kind == "data_starvation"]
    rank1 = f.facts.ranks[1]
    assert rank1.num_workers == 0 and rank1.workers > 0
    assert rank1.set_pin_memory  # pageable host memory on a CUDA rank
    assert rank1.loading == "io"
    # The device idles while both ranks wait: that is the starvation, not an idle GPU.
    assert "idle_device" not in {x.kind for x in findings}


def test_device_side_forward_straggler_is_found_on_the_device_timeline() -> None:
    snap, findings = replay("verdict_forward")
    assert warnings_of(findings) == {"compute_straggler": (1,), "utilization_imbalance": (1,)}
    stats = snap.stats
    # The slow rank waits least at the all-reduce (its own queued work is not a wait) and the
    # fast rank waits for it: 30 ms of matrix products in rank 1's forward.
    assert stats[1].forward_s > 0.025 > stats[0].forward_s
    assert (stats[1].collective_wait_s or 0) < 0.01 < (stats[0].collective_wait_s or 0)


def test_balanced_job_on_a_shared_gpu_raises_no_warning() -> None:
    snap, findings = replay("verdict_none")
    assert warnings_of(findings) == {}
    for s in snap.stats.values():  # every step's figures add up on the device's timeline
        booked = s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0)
        assert booked <= s.step_s * 1.02


def test_memory_budget_and_the_batch_that_fits() -> None:
    _, findings = replay("memory")
    (f,) = [f for f in findings if f.kind == "memory_headroom"]
    row = f.evidence["per_rank"]["0"]
    params = 24 * (1024 * 1024 + 1024) * 4  # 24 Linear(1024, 1024) in fp32
    assert (row["param_bytes"], row["grad_bytes"]) == (params, params)
    assert row["optimizer_bytes_by_kind"] == {"exp_avg": params, "exp_avg_sq": params, "step": 192}
    assert row["device"] == "cuda:0"
    # The advice that bench/gpu_validate.py ran on the H100: 573,113 samples, 81% of the GPU.
    assert row["largest_batch"] == 573_113


@pytest.mark.parametrize("name", ["verdict_starve", "verdict_forward", "verdict_none"])
def test_phases_never_exceed_the_step(name: str) -> None:
    rec = read_recording(DATA / f"{name}.jsonl")
    steps = [s for s in rec.batch.steps if s.step > 5]
    assert steps
    over = [
        s
        for s in steps
        if s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0) > s.step_s * 1.02 + 1e-4
    ]
    assert over == []


def long_startup(seconds: float, *, util: float | None = None) -> Snapshot:
    """The balanced recording (``verdict_none``: 20 s of training) as the final verdict judges it
    (the whole run, warm-up skipped), after a start-up of ``seconds``: NVML samples at 0% once a
    second, each rank's process holding its CUDA context and model (the recording's own
    start-up sample, 549 MB each, repeated), and each rank's process start reported that long
    before its first step. ``util`` replaces every recorded utilisation (None: as recorded)."""
    rec = read_recording(DATA / "verdict_none.jsonl")
    batch = rec.batch
    first = min(s.time - s.step_s for s in batch.steps)
    held = next(d for d in sorted(batch.devices, key=lambda d: d.time) if len(d.processes) == 2)
    start = first - seconds
    before = tuple(
        replace(held, time=start + k, gpu_util=0.0)
        for k in range(int(seconds))
        if start + k < min(d.time for d in batch.devices)
    )
    devices = before + tuple(
        d if util is None else replace(d, gpu_util=util) for d in batch.devices
    )
    infos = tuple(replace(i, started_at=start) for i in batch.infos)
    store = SampleStore(job=rec.job, warmup_steps=WARMUP_STEPS)
    store.add(replace(batch, infos=infos, devices=devices))
    now = store.latest_time()
    assert now is not None
    return store.snapshot(now=now, window_s=None)


@pytest.mark.parametrize("seconds", [12.0, 40.0])
def test_a_long_start_up_is_no_idle_gpu(seconds: float) -> None:
    # 40 s of start-up against 20 s of training: over the whole run NVML's median reads 0%
    # busy with 1.6 GiB held (what read "ranks 0, 1 hold the job back (idle_device)" on an
    # H200). The GPU is judged over the time its owners trained: 65% busy.
    snap = long_startup(seconds)
    gpu = dict(snap.gpus_in_place)[UUID]
    if seconds > 20:
        assert gpu.gpu_util == 0.0 and gpu.processes
    findings = analyze(snap)
    assert "idle_device" not in {f.kind for f in findings}
    assert warnings_of(findings) == {}
    # The start-up is booked as such, with what each rank held on the GPU meanwhile.
    for rank, pid_bytes in ((0, 622_854_144), (1, 549_453_824)):
        account = snap.accounts[rank]
        assert account.startup_s == pytest.approx(seconds, abs=0.1)
        assert account.startup_gpu_bytes == pid_bytes


def test_ranks_computing_on_the_device_outrank_nvml() -> None:
    # NVML reads 0% all along (as a GPU NVML cannot see into would), yet both ranks time their
    # phases on the device with CUDA events: 2.3 ms of each 5.7 ms step. Never idle.
    snap = long_startup(12.0, util=0.0)
    assert dict(snap.gpus_in_place)[UUID].gpu_util == 0.0
    assert all(s.busy_ratio > 0.2 and s.device == "cuda:0" for s in snap.stats.values())
    assert idle_device.RULE(snap) == []
    # Without the ranks' word (their device time not on a CUDA timeline) it would be idle.
    cpu = Snapshot(
        job=snap.job,
        start=snap.start,
        end=snap.end,
        ranks=tuple(replace(v, info=replace(v.info, device="cpu")) for v in snap.ranks),
        devices=snap.devices,
        history=snap.history,
    )
    assert [f.ranks for f in idle_device.RULE(cpu)] == [(0, 1)]
