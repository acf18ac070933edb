"""memory_headroom: memory = a + b * batch fitted per rank, and the batch that fits."""

from __future__ import annotations

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.measures import fit_memory
from auditor.analysis.rules import memory_headroom
from auditor.analysis.rules.memory_headroom import KIND
from tests.analysis import test_budget as budgets
from tests.helpers.gpus import H100_TOTAL, gpu_uuid
from tests.helpers.snapshots import batch_ramp
from tests.helpers.units import GIB

TOTAL_GIB = H100_TOTAL / GIB  # 79.65


def _only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    return findings[0]


def test_underused_memory_says_the_largest_batch_that_fits() -> None:
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35)
    f = _only(memory_headroom.RULE(snap))
    assert f.kind == "memory_headroom"
    assert f.severity == "info"
    assert f.ranks == (0, 1)
    assert [g["index"] for g in f.evidence["gpus"]] == [0, 1]
    assert f.gpus == (gpu_uuid("node0", 0), gpu_uuid("node0", 1))
    assert f.evidence["speedup_model"] == "not_predicted"
    row = f.evidence["per_rank"]["0"]
    assert row["fixed_bytes"] == pytest.approx(6 * GIB, rel=1e-6)
    assert row["per_sample_bytes"] == pytest.approx(0.35 * GIB, rel=1e-6)
    assert row["r2"] == pytest.approx(1.0)
    assert row["batch_sizes"] == [16, 32, 48, 64]
    assert row["source"] == "probe mem_peak_bytes"
    # NVML's peak 6 + 1 + 0.35 * 64 = 29.4 GiB against the fitted 28.4: 1 GiB overhead.
    assert row["overhead_bytes"] == pytest.approx(GIB, rel=0.01)
    assert row["current_batch"] == 64
    # floor((0.9 * 79.65 - 6 - 1) / 0.35) = floor(184.8) = 184.
    assert row["largest_batch"] == int((0.9 * TOTAL_GIB - 7.0) / 0.35)
    assert f.facts.verdict == "roomy"
    assert f.facts.ranks[0].gpu == "node0 GPU 0"
    assert f.facts.ranks[0].largest_batch == row["largest_batch"]
    # Each rank: its batch to the largest that fits, on its GPU.
    assert f.fixes == tuple(
        Fix("batch_size", r, 64, row["largest_batch"], None, (KIND,), gpu_uuid("node0", r))
        for r in (0, 1)
    )
    assert f.predicted_speedup is None


def test_the_engine_adds_nothing_else_for_a_healthy_ramp() -> None:
    findings = analyze(batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35))
    assert [(f.kind, f.severity) for f in findings] == [("memory_headroom", "info")]


def test_tight_memory_suggests_checkpointing_and_mixed_precision_with_numbers() -> None:
    # At batch 64: 20 + 1 + 0.85 * 64 = 75.4 GiB > 0.9 * 79.65 = 71.7 GiB.
    snap = batch_ramp([48, 56, 64], fixed_gib=20.0, per_sample_gib=0.85)
    f = _only(memory_headroom.RULE(snap))
    assert f.severity == "warning"
    assert f.ranks == (0, 1)
    row = f.evidence["per_rank"]["1"]
    budget = 0.9 * TOTAL_GIB
    assert row["largest_batch"] == int((budget - 21.0) / 0.85)
    assert row["largest_batch_checkpointing"] == int((budget - 21.0) / (0.85 / 4))
    assert row["largest_batch_mixed_precision"] == int((budget - 21.0) / (0.85 / 2))
    rank = f.facts.ranks[1]
    assert f.facts.verdict == "tight" and not rank.model_is_lever
    assert rank.largest_batch_checkpointing == row["largest_batch_checkpointing"]
    assert rank.largest_batch_mixed_precision == row["largest_batch_mixed_precision"]
    gpu1 = gpu_uuid("node0", 1)
    assert [x for x in f.fixes if x.rank == 1] == [
        Fix("gradient_checkpointing", 1, None, True, None, (KIND,), gpu1),
        Fix("autocast_bf16", 1, None, True, None, (KIND,), gpu1),
        Fix("batch_size", 1, 64, row["largest_batch"], None, (KIND,), gpu1),
    ]


def test_a_dominant_model_part_points_at_optimizer_state_not_the_batch() -> None:
    snap = batch_ramp([48, 56, 64], fixed_gib=45.0, per_sample_gib=0.45)
    f = _only(memory_headroom.RULE(snap))
    assert f.severity == "warning"
    rank = f.facts.ranks[0]
    assert rank.model_is_lever
    assert rank.model_bytes == pytest.approx(46 * GIB, rel=0.01)
    # Not the batch: less optimizer state, or sharding.
    assert [(x.lever, x.proposed) for x in f.fixes if x.rank == 0] == [
        ("optimizer", None),
        ("sharding", True),
    ]


@pytest.mark.parametrize(
    ("kwargs", "rule_kwargs", "expected"),
    [
        pytest.param({}, {}, "info", id="ramp"),
        # One batch size: nothing to fit.
        pytest.param({"batches": [32]}, {}, None, id="one-batch-size"),
        # Fitted from NVML alone (no probe memory): the same answer.
        pytest.param({"probe": None}, {}, "info", id="nvml-only"),
        pytest.param({"probe": "mem_allocated_bytes"}, {}, "info", id="allocated"),
        # No GPU sampled: the total is unknown.
        pytest.param({"gpus": False}, {}, None, id="no-gpu-total"),
        # Peak 29.4 GiB is 37% of the GPU: above a 30% "underused" mark.
        pytest.param({}, {"underused": 0.3}, None, id="underused-threshold"),
        pytest.param({"noise": 0.3}, {"min_r2": 0.99}, None, id="noisy-fit"),
        pytest.param({}, {"min_steps": 40}, None, id="too-few-steps"),
    ],
)
def test_decision_table(kwargs: dict, rule_kwargs: dict, expected: str | None) -> None:
    args = {"batches": [16, 32, 48, 64], "fixed_gib": 6.0, "per_sample_gib": 0.35, **kwargs}
    findings = memory_headroom.RULE(batch_ramp(**args), **rule_kwargs)
    assert [f.severity for f in findings] == ([expected] if expected else [])


def test_nvml_only_fit_recovers_the_model() -> None:
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35, probe=None)
    row = _only(memory_headroom.RULE(snap)).evidence["per_rank"]["0"]
    assert row["source"] == "nvml mem_used_bytes"
    # NVML includes the 1 GiB overhead in the fixed part.
    assert row["fixed_bytes"] == pytest.approx(7 * GIB, rel=0.01)
    assert row["per_sample_bytes"] == pytest.approx(0.35 * GIB, rel=0.01)


def test_memory_pressure_ranks_are_left_to_it() -> None:
    snap = batch_ramp([48, 56, 64], fixed_gib=20.0, per_sample_gib=0.85)
    prior = [Finding(kind="memory_pressure", severity="warning", ranks=(0,))]
    f = _only(memory_headroom.RULE(snap, explained=prior))
    assert f.ranks == (1,)
    assert {x.rank for x in f.fixes} == {1}


def test_fit_memory_needs_two_batch_sizes() -> None:
    snap = batch_ramp([32], fixed_gib=6.0, per_sample_gib=0.35, gpus=False)
    assert fit_memory(snap.ranks[0], None) is None
    snap = batch_ramp([16, 32], fixed_gib=6.0, per_sample_gib=0.35, gpus=False)
    fit = fit_memory(snap.ranks[0], None)
    assert fit is not None
    assert fit.predict(100) == pytest.approx((6.0 + 35.0) * GIB)
    assert fit.largest_batch(41.0 * GIB) == 100


GROWING_0 = [Finding(kind="memory_growth", severity="critical", ranks=(0,))]


def test_a_rank_whose_memory_climbs_gets_no_larger_batch_and_says_why() -> None:
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35)
    roomy, held = memory_headroom.RULE(snap, explained=GROWING_0)
    # Rank 1 keeps its advice; rank 0's is held back, with the reason, proposing nothing.
    assert roomy.ranks == (1,) and {x.rank for x in roomy.fixes} == {1}
    assert held.kind == KIND and held.severity == "info" and held.ranks == (0,)
    assert held.fixes == ()
    row = held.facts.ranks[0]
    assert row.verdict == "roomy" and row.reason == memory_headroom.HELD_BY_GROWTH
    assert row.batch == 64
    assert row.largest_batch == roomy.evidence["per_rank"]["1"]["largest_batch"]
    assert held.evidence["held_back"] == {
        "0": {
            "reason": "memory_growth",
            "verdict": "roomy",
            "current_batch": 64,
            "largest_batch": row.largest_batch,
        }
    }


def test_a_tight_rank_whose_memory_climbs_is_held_back_too() -> None:
    snap = batch_ramp([48, 56, 64], fixed_gib=20.0, per_sample_gib=0.85)
    tight, held = memory_headroom.RULE(snap, explained=GROWING_0)
    assert tight.ranks == (1,) and held.ranks == (0,)
    assert held.facts.ranks[0].verdict == "tight"
    # A rank memory_pressure already has is left to it, growing or not.
    both = [*GROWING_0, Finding(kind="memory_pressure", severity="warning", ranks=(0,))]
    (only,) = memory_headroom.RULE(snap, explained=both)
    assert only.ranks == (1,)


def test_a_measured_budget_is_held_back_on_a_climbing_rank() -> None:
    b = budgets
    roomy, held = memory_headroom.RULE(
        b.snap(b.view(0, b.adam()), b.view(1, b.adam(rank=1))), explained=GROWING_0
    )
    assert roomy.ranks == (1,) and [x.rank for x in roomy.fixes] == [1]
    assert held.ranks == (0,) and held.fixes == ()
    assert held.facts.ranks[0].verdict == "roomy"
    assert held.facts.ranks[0].batch == 8


def test_memory_growth_explains_headroom() -> None:
    assert "memory_growth" in memory_headroom.RULE.explained_by
