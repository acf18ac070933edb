"""Recordings of real jobs on an H100 (``python bench/gpu_validate.py``, tests/data/h100_live/).

Two ranks on the one GPU (gloo over CUDA tensors) under ``auditor run --no-ray --record``, each
replayed through the whole analysis as ``auditor replay`` reads it (the run's last 10 s window):
the findings are the ones the live run printed, with exact ranks. The probe timed these steps
with CUDA events on the device's timeline, so they are what the GPU paths produce, not what a
generator thought they would.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from auditor.analysis import SampleStore, analyze
from auditor.analysis.findings import Finding
from auditor.analysis.snapshot import Snapshot
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
