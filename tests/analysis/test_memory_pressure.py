"""memory_pressure: a GPU nearly full and still filling."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import memory_pressure
from auditor.analysis.rules.memory_pressure import KIND
from auditor.analysis.snapshot import Snapshot
from tests.helpers.gpus import H100_TOTAL, GpuSpec, attach_gpus, gpu_uuid
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
    assert f.gpus == (gpu_uuid("node0", 1),)
    assert f.facts.gpu == "node0 GPU 1"
    assert f.facts.peak_ratio == pytest.approx(0.92, abs=0.01)
    relief = f.facts.ranks[1]
    # Constant batch while memory rose: something is kept across steps.
    assert relief.kept_across_steps and relief.batch == 32
    # No fit (one batch size): proportional, floor(32 * 0.85 * total / peak).
    suggested = int(32 * 0.85 * H100_TOTAL / peak)
    assert relief.smaller_batch == suggested
    assert relief.basis == "proportional"
    assert f.evidence["per_rank"]["1"]["basis"] == "proportional"
    assert f.evidence["speedup_model"] == "not_predicted"
    # The leak first, the smaller batch, then checkpointing and mixed precision.
    assert f.fixes == (
        Fix("retained_tensors", 1, answers=(KIND,)),
        Fix("batch_size", 1, 32, suggested, None, (KIND,)),
        Fix("gradient_checkpointing", 1, None, True, None, (KIND,)),
        Fix("autocast_bf16", 1, None, True, None, (KIND,)),
    )
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
    findings = memory_pressure.RULE(two_ranks(gpu1), **kwargs)
    assert [(f.ranks, f.severity) for f in findings] == expected


def test_unowned_gpu_is_named_without_ranks() -> None:
    (f,) = memory_pressure.RULE(two_ranks(LEAKING, owners=[[0], []]))
    assert f.ranks == ()
    assert f.facts.ranks == {}
    assert f.evidence["gpus"][0]["index"] == 1
    # The fixes name the GPU, no rank.
    gpu1 = gpu_uuid("node0", 1)
    assert f.fixes == (
        Fix("gradient_checkpointing", None, None, True, None, (KIND,), gpu1),
        Fix("autocast_bf16", None, None, True, None, (KIND,), gpu1),
    )


def test_batch_from_the_fitted_model_when_the_batch_varied() -> None:
    # A ramp to 64 with 6 + 1.05 GiB per sample: 74.2 GiB at 64 (93%), rising with the batch.
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=1.05)
    findings = analyze(snap)
    pressure = [f for f in findings if f.kind == "memory_pressure"]
    assert [f.ranks for f in pressure] == [(0,), (1,)]
    f = pressure[0]
    row = f.evidence["per_rank"]["0"]
    assert row["basis"] == "fit"
    # floor((0.85 * 79.65 - 6 - 1) / 1.05) = 57.
    assert row["suggested_batch"] == int((0.85 * H100_TOTAL / GIB - 7.0) / 1.05)
    assert not f.facts.ranks[0].kept_across_steps
    assert [(x.lever, x.current, x.proposed) for x in f.fixes] == [
        ("batch_size", 64, row["suggested_batch"]),
        ("gradient_checkpointing", None, True),
        ("autocast_bf16", None, True),
    ]
    # memory_headroom leaves the pressured ranks alone.
    assert not [f for f in findings if f.kind == "memory_headroom"]
