"""Recordings of real jobs on an H200 (``python bench/gpu_validate.py``, tests/data/h200_live/).

Two ranks on the one GPU (gloo over CUDA tensors), or one rank of the matmul job, under
``auditor run --no-ray --record``, each replayed through the final verdict as the run ended
with it (:meth:`Audit.final`: the whole run): the findings with exact ranks, the figures
against what the jobs measured of themselves on the device. The run judged over time (a long
start-up, a rank that leaks, a rank that turns slow) and the work done (MFU) are here, as the
GPU produced them.
"""

from __future__ import annotations

import pytest

from auditor.analysis.findings import Finding
from auditor.analysis.snapshot import Snapshot
from auditor.audit import Audit
from auditor.telemetry.recorded import read_recording
from tests.helpers.units import MIB

from .test_h100_live import DATA as H100

DATA = H100.parent / "h200_live"
UUID = "GPU-835a8c48-267b-4106-47c2-2390c2ca3c93"
# The matmul job: 4 bias-free Linear(8192) at batch 8192, forward and backward.
MATMUL_FLOPS = 2 * 8192 * 8192 * 8192 * (3 * 4 - 1)


def final(name: str) -> tuple[Snapshot, list[Finding]]:
    rec = read_recording(DATA / f"{name}.jsonl")
    assert rec.problems == []
    audit = Audit(rec.job, window_s=None)
    audit.add(rec.batch)
    return audit.final()


def warnings_of(findings: list[Finding]) -> dict[str, tuple[int, ...]]:
    return {f.kind: f.ranks for f in findings if f.severity in ("warning", "critical")}


def one(findings: list[Finding], kind: str) -> Finding:
    (f,) = [f for f in findings if f.kind == kind]
    return f


def test_a_long_start_up_holding_device_memory_is_no_fault() -> None:
    """Each rank holds 1 GiB on the device and waits until 10 s after its start, then trains."""
    snap, findings = final("over_time_startup")
    assert warnings_of(findings) == {}
    assert "idle_device" not in {f.kind for f in findings}
    assert dict(snap.owners) == {UUID: (0, 1)}


def test_a_leaking_rank_is_found_with_its_rate_and_time_to_full() -> None:
    """Rank 1 keeps every step's loss with its graph: 2.5 MiB a step by the saved activations'
    sizes, the slope its own ``torch.cuda.memory_allocated()`` measured on the H200."""
    _, findings = final("over_time_leak")
    assert warnings_of(findings) == {"memory_growth": (1,)}
    growth = one(findings, "memory_growth").evidence["per_rank"]["1"]
    assert growth["where"] == "device" and growth["series"] == "allocated"
    assert growth["bytes_per_step"] == pytest.approx(2.5 * MIB, rel=0.05)
    assert growth["full_in_s"] == pytest.approx(656, rel=0.1)
    # No larger batch for the rank that leaks; rank 0 may have one.
    advised = {fix.rank for f in findings if f.kind == "memory_headroom" for fix in f.fixes}
    assert advised == {0}


def test_a_rank_that_turns_slow_is_found_at_the_step_it_turned() -> None:
    """Rank 1 adds 30 ms of matrix products to its forward from step 659 on (its own count, of
    810). Earlier, at step 395, every rank's step went from 7.1 to 8.8 ms (their gloo wait grew
    alike): a change of the job's pace, said as such (info) and blamed on no rank."""
    _, findings = final("over_time_slowdown")
    (slow,) = [f for f in findings if f.kind == "slowdown" and f.ranks]
    assert slow.ranks == (1,) and slow.severity == "critical"
    assert slow.evidence["step"] == pytest.approx(659, abs=0.05 * 810)
    for f in findings:
        if f.kind == "slowdown" and f is not slow:
            assert f.severity == "info" and f.ranks == () and "every_rank" in f.evidence, f
    assert slow.evidence["per_rank"]["1"]["phase"] == "forward"
    # Rank 1 the straggler at its slow pace, with the range its parts predicted. The whole run
    # (its statistics weighted by time: the slow steps are most of it) finds it as critical as
    # the steps since the change do, so it is the whole run's; one found only since the change
    # says so (``since_step``).
    straggler = one(findings, "compute_straggler")
    assert straggler.ranks == (1,) and straggler.severity == "critical"
    local = straggler.evidence["local_ms"]
    assert local["1"] > 4 * local["0"], local
    assert straggler.evidence.get("since_step", slow.evidence["step"]) == slow.evidence["step"]
    assert straggler.predicted_range is not None
    lo, hi = straggler.predicted_range
    assert lo <= (straggler.predicted_speedup or 0) <= hi


@pytest.mark.parametrize("name, dtype", [("mfu_bf16", "bf16"), ("mfu_fp32", "fp32")])
def test_the_counted_flops_are_the_exact_count_in_the_jobs_dtype(name: str, dtype: str) -> None:
    snap, _ = final(name)
    (view,) = snap.ranks
    assert view.flops is not None
    assert view.flops.flops == pytest.approx(MATMUL_FLOPS, rel=0.001)
    assert set(view.flops.by_dtype) == {dtype}


def test_fp32_matmuls_are_told_to_run_in_bf16() -> None:
    _, findings = final("mfu_fp32")
    low = one(findings, "low_mfu")
    assert low.severity == "warning" and low.ranks == ()
    assert low.predicted_speedup is not None and low.predicted_speedup > 1.5
    _, fed = final("mfu_bf16")
    assert "low_mfu" not in {f.kind for f in fed}


def test_the_starved_ranks_on_the_device_get_workers_and_a_range() -> None:
    _, findings = final("verdict_starve")
    assert warnings_of(findings) == {"data_starvation": (1,)}
    starved = one(findings, "data_starvation")
    assert starved.predicted_range is not None
    lo, hi = starved.predicted_range
    assert lo <= (starved.predicted_speedup or 0) <= hi
    _, forward = final("verdict_forward")
    assert warnings_of(forward) == {"compute_straggler": (1,), "utilization_imbalance": (1,)}
