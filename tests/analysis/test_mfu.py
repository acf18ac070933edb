"""FLOP/s and MFU per rank against the peak table, and the job's gap split into the time account's
parts and the device's own inefficiency (:mod:`auditor.analysis.mfu`, :mod:`.peaks`)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from auditor.analysis import SampleStore
from auditor.analysis.accounting import Account
from auditor.analysis.mfu import GAP_PARTS, RUN, STEP, figures, job_mfu, rank_flops
from auditor.analysis.peaks import DEVICE_PEAKS, PEAK_DTYPES, device_peaks, peak_flops
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.samples import Batch, DeviceSample, FlopCount, RankInfo, StepSample
from auditor.telemetry.recorded import read_recording

DATA = Path(__file__).resolve().parents[1] / "data"
H100 = "NVIDIA H100 80GB HBM3"


# --- the table -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "card", "bf16", "fp32"),
    [
        (H100, "H100 SXM", 989.4e12, 67e12),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756e12, 51e12),
        ("NVIDIA H100 NVL", "H100 NVL", 835.5e12, 60e12),
        ("NVIDIA H200", "H200 SXM", 989.4e12, 67e12),
        ("NVIDIA H200 NVL", "H200 NVL", 835.5e12, 60e12),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM", 312e12, 19.5e12),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 312e12, 19.5e12),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe", 312e12, 19.5e12),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 312e12, 19.5e12),
        ("NVIDIA L40S", "L40S", 362.05e12, 91.6e12),
        ("NVIDIA L4", "L4", 121e12, 30.3e12),
        ("NVIDIA A10G", "A10G", 125e12, 31.2e12),
        ("NVIDIA A10", "A10", 125e12, 31.2e12),
        ("Tesla V100-SXM2-32GB", "V100 SXM2", None, 15.7e12),
        ("Tesla V100-PCIE-16GB", "V100 PCIe", None, 14e12),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe", None, 16.4e12),
        ("Tesla T4", "T4", None, 8.1e12),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2e12, 82.6e12),
        ("NVIDIA GeForce RTX 3090", "RTX 3090", 71e12, 35.6e12),
        ("NVIDIA RTX A6000", "RTX A6000", 154.8e12, 38.7e12),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", 364.2e12, 91.1e12),
    ],
)
def test_nvml_names_find_their_card_and_its_dense_peaks(
    name: str, card: str, bf16: float | None, fp32: float
) -> None:
    entry = device_peaks(name)
    assert entry is not None and entry.card == card
    assert peak_flops(name, "bf16") == (None if bf16 is None else pytest.approx(bf16))
    assert peak_flops(name, "fp32") == pytest.approx(fp32)


def test_the_recorded_gpus_are_in_the_table() -> None:
    names = set()
    for scenario in ("h100_live/verdict_none.jsonl", "idle_allocated_gpu/recording.jsonl"):
        names |= {d.model for d in read_recording(DATA / scenario).batch.devices}
    assert names == {H100, "NVIDIA H200"}
    for name in names:
        assert peak_flops(name, "bf16") == pytest.approx(
            989.4e12
        )  # dense: the datasheet's 1,979* halved


@pytest.mark.parametrize(
    "name", [None, "", "NVIDIA B200", "NVIDIA GeForce RTX 3090 Ti", "AMD Instinct MI300X"]
)
def test_an_unknown_device_has_no_peak(name: str | None) -> None:
    assert device_peaks(name) is None
    assert peak_flops(name, "bf16") is None


def test_every_figure_is_dense_and_ordered_as_the_hardware_is() -> None:
    for entry in DEVICE_PEAKS:
        peaks = entry.peaks
        assert set(peaks) <= set(PEAK_DTYPES), entry.card
        assert "fp32" in peaks, entry.card
        # Tensor-core dtypes run at least as fast as the CUDA cores' fp32 ...
        for dtype in ("tf32", "bf16", "fp16", "fp8", "int8"):
            if dtype in peaks:
                assert peaks[dtype] >= peaks["fp32"], (entry.card, dtype)
        if "bf16" in peaks:
            assert peaks["bf16"] == peaks["fp16"], entry.card
            assert peaks.get("tf32", 0) <= peaks["bf16"], entry.card
        # ... and no figure is a "with sparsity" one: the largest card's bf16 is H100 SXM's.
        assert peaks.get("bf16", 0) <= 989.4e12, entry.card


# --- one rank --------------------------------------------------------------------------------


def count(
    rank: int, flops: float, by_dtype: dict[str, float] | None = None, **kw: object
) -> FlopCount:
    values: dict[str, object] = {
        "rank": rank,
        "time": 0.0,
        "step": 10,
        "flops": flops,
        "by_dtype": by_dtype if by_dtype is not None else {"bf16": flops},
        "micro_batches": 1,
        "samples": 64,
        "device": "cuda",
        "cost_s": 0.02,
    }
    values.update(kw)
    return FlopCount(**values)  # type: ignore[arg-type]


def test_mfu_of_a_dtype_mix_is_its_ideal_time_over_the_step() -> None:
    c = count(0, 4e12, {"bf16": 3e12, "fp32": 1e12})
    f = figures(c, 0.5, [H100])
    ideal = 3e12 / 989.4e12 + 1e12 / 67e12
    assert f.ideal_s == pytest.approx(ideal)
    assert f.mfu == pytest.approx(ideal / 0.5)
    assert f.flops_per_s == pytest.approx(8e12)
    assert f.peak_flops_per_s == pytest.approx(4e12 / ideal)
    assert f.flops_per_s is not None and f.peak_flops_per_s is not None
    assert f.flops_per_s / f.peak_flops_per_s == pytest.approx(f.mfu)
    assert f.dtype == "bf16" and f.device_name == H100
    # The fp32 FLOPs at the bf16 peak, and at TF32.
    assert f.half_ideal_s == pytest.approx(4e12 / 989.4e12)
    assert f.tf32_ideal_s == pytest.approx(3e12 / 989.4e12 + 1e12 / 494.7e12)


def test_cpu_and_unknown_devices_get_flops_per_second_only() -> None:
    cpu = figures(count(0, 1e9, {"fp32": 1e9}, device="cpu"), 0.1, [])
    assert cpu.flops_per_s == pytest.approx(1e10)
    assert cpu.mfu is None and cpu.peak_flops_per_s is None and cpu.device_name is None
    unknown = figures(count(0, 1e12), 0.1, ["NVIDIA B200"])
    assert unknown.flops_per_s == pytest.approx(1e13) and unknown.mfu is None


def test_flops_in_a_dtype_the_card_lacks_leave_the_mfu_unsaid() -> None:
    # A V100 has no bf16 peak: bf16 matmuls there are emulated, no figure would be honest.
    v100 = figures(count(0, 1e12), 0.1, ["Tesla V100-SXM2-16GB"])
    assert v100.mfu is None and v100.flops_per_s == pytest.approx(1e13)
    # A sliver of "other" FLOPs (under 1%) is left out of the ideal time.
    c = count(0, 1e12, {"bf16": 0.995e12, "other": 0.005e12})
    assert figures(c, 0.1, [H100]).mfu == pytest.approx(0.995e12 / 989.4e12 / 0.1)


def test_shared_and_several_gpus_share_and_add_their_peaks() -> None:
    c = count(0, 1e12)
    one = figures(c, 0.1, [H100])
    assert one.mfu is not None
    half = figures(c, 0.1, [H100], shares=[0.5])
    assert half.mfu == pytest.approx(2 * one.mfu)
    two = figures(c, 0.1, [H100, H100])  # DataParallel: one process, two GPUs
    assert two.mfu == pytest.approx(one.mfu / 2)


# --- a recorded GPU job ----------------------------------------------------------------------


def recorded(name: str, flops: dict[int, FlopCount]) -> Snapshot:
    rec = read_recording(DATA / "h100_live" / f"{name}.jsonl")
    store = SampleStore(job=rec.job)
    store.add(rec.batch)
    store.add(Batch(flops=tuple(flops.values())))
    now = store.latest_time()
    assert now is not None
    return store.snapshot(now=now, window_s=10.0)


def test_mfu_from_a_recorded_h100_run_against_the_table() -> None:
    flops = 2.4e12  # bf16 FLOPs per step on each rank
    snap = recorded("verdict_none", {r: count(r, flops) for r in (0, 1)})
    got = rank_flops(snap)
    assert sorted(got) == [0, 1]
    for r, f in got.items():
        step = snap.paced[r].step_s
        assert f.device_name == H100 and f.step_s == step
        assert f.flops_per_s == pytest.approx(flops / step)
        # Both ranks share the one H100: half its bf16 peak each.
        assert f.peak_flops_per_s == pytest.approx(989.4e12 / 2)
        assert f.mfu == pytest.approx(flops / step / (989.4e12 / 2))
        assert f.counted_step == 10 and f.count_cost_s == 0.02
    job = job_mfu(snap)
    assert job is not None and job.basis == RUN and job.gpu
    assert job.mfu is not None and 0 < job.mfu < 1
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)
    assert set(job.gap) <= set(GAP_PARTS)


def test_the_starved_rank_books_the_gap_to_data_wait() -> None:
    snap = recorded("verdict_starve", {r: count(r, 2.4e12) for r in (0, 1)})
    job = job_mfu(snap)
    assert job is not None and job.mfu is not None
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)
    waits = job.gap.get("data_wait", 0.0) + job.gap.get("collective_wait", 0.0)
    assert waits == max(job.gap.values()) or waits > 0.3


# --- the split adds up to the gap ------------------------------------------------------------

UUID = "GPU-0"


def gpu_snapshot(
    accounts: dict[int, Account] | None,
    *,
    flops: float = 20e12,
    by_dtype: dict[str, float] | None = None,
    step: StepSample | None = None,
    device: str = "cuda",
    samples: int = 256,
    micro_batches: int = 1,
    model: str = H100,
) -> Snapshot:
    base = step or StepSample(
        rank=0, step=0, time=0.0, step_s=0.1, data_wait_s=0.02, h2d_s=0.005,
        forward_s=0.02, backward_s=0.04, optimizer_s=0.005, collective_wait_s=0.005,
        batch_size=samples,
    )  # fmt: skip
    ranks = []
    devices = []
    for r in (0, 1):
        info = RankInfo(
            rank=r, world_size=2, host="n", device=f"{device}:{r}" if device == "cuda" else "cpu",
            parallel_mode="ddp", device_uuids=(f"{UUID}{r}",) if device == "cuda" else (),
        )  # fmt: skip
        steps = tuple(replace(base, rank=r, step=i, time=float(i)) for i in range(20))
        c = count(r, flops, by_dtype, device=device, samples=samples, micro_batches=micro_batches)
        ranks.append(RankView(info=info, steps=steps, flops=c))
        if device == "cuda":
            devices.append(
                DeviceSample(node="n", index=r, uuid=f"{UUID}{r}", time=1.0, model=model)
            )
    return Snapshot(
        job="j", start=0.0, end=20.0, ranks=tuple(ranks), devices=tuple(devices),
        accounts=accounts or {},
    )  # fmt: skip


def account(rank: int, **parts: float) -> Account:
    """200 steps: 32 s of compute phases, 4 s of checkpoints, and the rest."""
    values = {
        "startup_s": 10.0, "data_wait_s": 20.0, "h2d_s": 1.0, "forward_s": 10.0,
        "backward_s": 20.0, "optimizer_s": 2.0, "collective_wait_s": 5.0,
        "other_s": 3.0, "gaps_s": 1.0, "teardown_s": 2.0,
    }  # fmt: skip
    values.update(parts)
    wall = sum(values.values()) + 4.0
    return Account(rank=rank, wall_s=wall, steps=200, outside={"checkpoint": 4.0}, **values)  # type: ignore[arg-type]


def test_the_split_of_the_whole_run_adds_up_to_the_gap() -> None:
    snap = gpu_snapshot({0: account(0), 1: account(1, startup_s=30.0)})
    job = job_mfu(snap)
    assert job is not None and job.basis == RUN and job.mfu is not None
    ideal = 200 * 20e12 / 989.4e12
    walls = account(0).booked_s + account(1, startup_s=30.0).booked_s
    assert job.mfu == pytest.approx(2 * ideal / walls)
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)
    assert job.gap["startup"] == pytest.approx(40.0 / walls)
    assert job.gap["data_wait"] == pytest.approx(40.0 / walls)
    assert job.gap["stalls"] == pytest.approx(10.0 / walls)  # checkpoints and gaps
    assert job.gap["host_overhead"] == pytest.approx(6.0 / walls)
    assert job.gap["device"] == pytest.approx(2 * (32.0 - ideal) / walls)
    assert "small_batch" not in job.gap
    # bf16 already: nothing for the precision lever.
    assert job.precision == 0.0 and job.tf32 == 0.0
    # The job's FLOP/s over the run, every rank's added.
    assert job.flops_per_s == pytest.approx(
        200 * 20e12 * (1 / account(0).booked_s + 1 / account(1, startup_s=30.0).booked_s)
    )


def test_without_an_account_the_split_is_over_one_step_at_the_pace() -> None:
    snap = gpu_snapshot(None)
    job = job_mfu(snap)
    assert job is not None and job.basis == STEP and job.mfu is not None
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)
    assert job.gap["data_wait"] == pytest.approx(0.02 / 0.1)
    assert rank_flops(snap)[0].mfu == pytest.approx(job.mfu)


def test_fp32_matmuls_book_the_precision_lever_apart_from_the_gap() -> None:
    snap = gpu_snapshot({0: account(0), 1: account(1)}, flops=2e12, by_dtype={"fp32": 2e12})
    job = job_mfu(snap)
    assert job is not None and job.mfu is not None
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)
    # The compute phases (32 s of each run) ran the fp32 FLOPs; in bf16 they would take
    # 67/989.4 of that, at the same efficiency.
    wall = account(0).booked_s
    assert job.precision == pytest.approx(32.0 * (1 - 67 / 989.4) / wall)
    assert job.tf32 == pytest.approx(32.0 * (1 - 67 / 494.7) / wall)
    assert job.tf32 < job.precision


def test_a_micro_batch_too_small_to_fill_the_device_books_small_batch() -> None:
    # 2 GFLOPs per step: 2 microseconds at the H100's bf16 peak, in 32 s of compute phases.
    snap = gpu_snapshot({0: account(0), 1: account(1)}, flops=2e9, samples=8)
    job = job_mfu(snap)
    assert job is not None and job.mfu is not None
    assert job.small_batch_ranks == (0, 1)
    assert "device" not in job.gap and job.gap["small_batch"] > 0
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)
    assert job.precision == 0.0  # launches, not arithmetic: no precision gain claimed


def test_flops_beyond_the_compute_phases_book_no_device_part() -> None:
    # FLOPs that at peak would take longer than the compute phases measured.
    snap = gpu_snapshot({0: account(0), 1: account(1)}, flops=200e12)
    job = job_mfu(snap)
    assert job is not None and job.mfu is not None and job.mfu < 1
    assert "device" not in job.gap and "small_batch" not in job.gap
    assert sum(job.gap.values()) == pytest.approx(1 - job.mfu)


def test_a_cpu_job_has_flops_per_second_and_no_mfu() -> None:
    snap = gpu_snapshot({0: account(0), 1: account(1)}, device="cpu", by_dtype={"fp32": 20e12})
    assert all(f.mfu is None for f in rank_flops(snap).values())
    job = job_mfu(snap)
    assert job is not None and not job.gpu
    assert job.mfu is None and job.gap == {}
    assert job.flops_per_s is not None and job.flops_per_s > 0


def test_no_count_no_figures() -> None:
    snap = gpu_snapshot(None)
    snap = replace(snap, ranks=tuple(replace(v, flops=None) for v in snap.ranks))
    assert rank_flops(snap) == {} and job_mfu(snap) is None


def test_the_gap_never_goes_negative() -> None:
    for flops in (1e9, 1e11, 1e13, 1e14, 3e14):
        for dtype in ("bf16", "fp32", "tf32", "fp8"):
            snap = gpu_snapshot(
                {0: account(0), 1: account(1)}, flops=flops, by_dtype={dtype: flops}
            )
            job = job_mfu(snap)
            assert job is not None and job.mfu is not None
            assert all(v >= 0 and math.isfinite(v) for v in job.gap.values())
            # Past the peak (a wrong figure, or FLOPs the card does not count alike): the MFU
            # is said as measured, with no gap to split.
            expected = max(0.0, 1 - job.mfu)
            assert sum(job.gap.values()) == pytest.approx(expected, abs=1e-9)
