"""memory_pressure: a GPU nearly full and still filling."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.rules import memory_pressure
from auditor.analysis.snapshot import Snapshot
from auditor.report.phrasing import phrase
from tests.helpers.gpus import H100_TOTAL, GpuSpec, attach_gpus
from tests.helpers.jobs import JobBuilder, balanced
from tests.helpers.snapshots import batch_ramp
from tests.helpers.units import GIB, MIB

# 73 GiB of 79.65 (92%) rising 200 MiB/s: about 0.5 GiB over the 2.5 s run.
LEAKING = GpuSpec(mem_used=73 * GIB, mem_slope=200 * MIB)


def two_ranks(gpu1: GpuSpec, *, steps: int = 24, owners: list[list[int]] | None = None) -> Snapshot:
    job = JobBuilder(balanced(2)).run(steps)
    attach_gpus(job, [GpuSpec(mem_used=70 * GIB), gpu1], owners=owners)
    return job.snapshot()


def test_rising_memory_on_a_nearly_full_gpu() -> None:
    findings = analyze(two_ranks(LEAKING))
    assert [f.kind for f in findings] == ["memory_pressure"]
    (f,) = findings
    assert f.severity == "warning"
    assert f.ranks == (1,)
    assert f.evidence["gpus"][0]["index"] == 1
    assert f.evidence["mem_recent_trend_bytes_per_s"] == pytest.approx(200 * MIB, rel=0.01)
    peak = f.evidence["mem_used_max_bytes"]
    assert f.evidence["mem_ratio_max"] == pytest.approx(peak / H100_TOTAL, abs=1e-4)
    assert f.evidence["minutes_to_full"] == pytest.approx(
        (H100_TOTAL - peak) / (200 * MIB) / 60, rel=0.02
    )
    fix = phrase(f).fixes[1]
    assert fix.startswith("node0 GPU 1 peaks at 92% of 79.6 GiB and rises 12000 MiB/min")
    # Constant batch while memory rose: the leak comes first.
    assert "the batch stayed at 32 while memory rose" in fix
    # No fit (one batch size): proportional, floor(32 * 0.85 * total / peak).
    suggested = int(32 * 0.85 * H100_TOTAL / peak)
    assert f"batch_size 32 -> {suggested}" in fix
    assert f.evidence["per_rank"]["1"]["basis"].startswith("memory assumed in proportion")
    assert "gradient checkpointing" in fix
    assert "torch.autocast" in fix
    assert f.predicted_speedup is None


@pytest.mark.parametrize(
    ("gpu1", "kwargs", "expected"),
    [
        pytest.param(LEAKING, {}, [((1,), "warning")], id="92%-rising"),
        pytest.param(
            replace(LEAKING, mem_used=int(77.5 * GIB)), {}, [((1,), "critical")], id="97%-rising"
        ),
        # Full but flat: the caching allocator keeps what it reserved; normal.
        pytest.param(replace(LEAKING, mem_slope=0.0), {}, [], id="95%-flat"),
        pytest.param(replace(LEAKING, mem_used=60 * GIB), {}, [], id="75%-rising"),
        # Rose during the first second, flat since: warm-up, not pressure.
        pytest.param(replace(LEAKING, mem_slope=600 * MIB, mem_rise_s=0.8), {}, [], id="plateau"),
        pytest.param(LEAKING, {"min_rise_bytes": 2 * GIB}, [], id="rise-threshold"),
        pytest.param(LEAKING, {"min_ratio": 0.95}, [], id="ratio-threshold"),
        pytest.param(LEAKING, {"critical_ratio": 0.9}, [((1,), "critical")], id="critical-at"),
        pytest.param(LEAKING, {"min_steps": 25}, [], id="too-few-steps"),
        pytest.param(replace(LEAKING, mem_total=None), {}, [], id="total-unknown"),
    ],
)
def test_decision_table(gpu1: GpuSpec, kwargs: dict, expected: list) -> None:
    findings = memory_pressure.detect(two_ranks(gpu1), **kwargs)
    assert [(f.ranks, f.severity) for f in findings] == expected


def test_unowned_gpu_is_named_without_ranks() -> None:
    (f,) = memory_pressure.detect(two_ranks(LEAKING, owners=[[0], []]))
    assert f.ranks == ()
    assert phrase(f).fixes == {}
    assert f.evidence["gpus"][0]["index"] == 1
    assert phrase(f).notes["fix"].startswith("node0 GPU 1 peaks at 92%")


def test_batch_from_the_fitted_model_when_the_batch_varied() -> None:
    # A ramp to 64 with 6 + 1.05 GiB per sample: 74.2 GiB at 64 (93%), rising with the batch.
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=1.05)
    findings = analyze(snap)
    pressure = [f for f in findings if f.kind == "memory_pressure"]
    assert [f.ranks for f in pressure] == [(0,), (1,)]
    f = pressure[0]
    row = f.evidence["per_rank"]["0"]
    assert row["basis"] == "fitted memory = a + b * batch"
    # floor((0.85 * 79.65 - 6 - 1) / 1.05) = 57.
    assert row["suggested_batch"] == int((0.85 * H100_TOTAL / GIB - 7.0) / 1.05)
    assert "the batch stayed" not in phrase(f).fixes[0]
    # memory_headroom leaves the pressured ranks alone.
    assert not [f for f in findings if f.kind == "memory_headroom"]
