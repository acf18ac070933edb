"""utilization_imbalance: a 90% / 50% busy spread, attributed to its cause, never to the waiters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import utilization_imbalance
from auditor.analysis.rules.utilization_imbalance import KIND
from auditor.analysis.snapshot import Snapshot
from tests.helpers.jobs import RankSpec, balanced, ddp_snapshot
from tests.helpers.snapshots import collective_ops

# Busy 50%: 50 ms of compute in a 100 ms step (6 ms data wait, 4 ms comm, 40 ms waiting for the
# slow rank). Busy 90%: 90 ms of compute in the same 100 ms step.
NORMAL = RankSpec(
    data_wait=0.006, h2d=0.003, forward=0.014, backward=0.030, optimizer=0.003, batch_size=20
)
# 1.8x the work: the same compute per sample on a 36-sample batch...
BIG_BATCH = NORMAL.scaled(1.8, batch_size=36)
# ...or 1.8x slower per sample on the same batch.
SLOW = NORMAL.scaled(1.8)


def busy_90_50(slow: RankSpec, rank: int, world: int = 4) -> list[RankSpec]:
    specs = [NORMAL] * world
    specs[rank] = slow
    return specs


def _only(findings: list[Finding], kind: str) -> Finding:
    found = [f for f in findings if f.kind == kind]
    assert len(found) == 1, [f.to_dict() for f in findings]
    return found[0]


def _prior(snap: Snapshot) -> tuple[Finding, ...]:
    """The explaining rules' findings, in ``explained_by`` order (as the engine hands them)."""
    found = analyze(snap)
    return tuple(
        f for kind in utilization_imbalance.RULE.explained_by for f in found if f.kind == kind
    )


@pytest.mark.parametrize(
    ("specs", "slow_rank", "cause"),
    [
        pytest.param(busy_90_50(BIG_BATCH, 1), 1, "batch_split", id="uneven-batch-rank1"),
        pytest.param(busy_90_50(SLOW, 2), 2, "compute_straggler", id="straggler-rank2"),
        pytest.param(
            busy_90_50(SLOW, 0, world=2), 0, "compute_straggler", id="straggler-rank0-of-2"
        ),
        pytest.param(
            busy_90_50(BIG_BATCH, 7, world=8), 7, "batch_split", id="uneven-batch-rank7-of-8"
        ),
    ],
)
def test_attributed_to_the_cause_found_earlier(specs: list, slow_rank: int, cause: str) -> None:
    findings = analyze(ddp_snapshot(specs))
    f = _only(findings, "utilization_imbalance")
    assert f.cause == cause
    assert f.ranks == (slow_rank,)
    busy = f.evidence["busy_ratio"]
    assert busy[str(slow_rank)] == pytest.approx(0.90, abs=0.02)
    for r, b in busy.items():
        if int(r) != slow_rank:
            assert b == pytest.approx(0.50, abs=0.02)
    # Fixes and speed-up are the cause's, for the blamed rank only, answering both findings.
    source = _only(findings, cause)
    assert f.facts.cause == source
    assert f.fixes and f.fixes == tuple(
        replace(fix, answers=(cause, KIND)) for fix in source.fixes if fix.rank == slow_rank
    )
    assert f.predicted_speedup == source.predicted_speedup
    # The symptom stays below critical; the cause carries the weight.
    assert f.severity != "critical"
    # Nobody blames the ranks that only wait.
    for finding in findings:
        assert set(finding.ranks) == {slow_rank}, finding.to_dict()


def test_without_a_cause_it_blames_the_slow_rank_and_asks_to_profile() -> None:
    f = utilization_imbalance.RULE(ddp_snapshot(busy_90_50(SLOW, 2)))[0]
    assert f.cause is None and f.facts.cause is None
    assert f.ranks == (2,)
    # Barrier model by hand: before 96 ms local + 4 ms floor = 100 ms; rank 2 at its peers'
    # 56 ms local: 60 ms. 100 / 60 = 1.667.
    assert f.predicted_speedup == pytest.approx(100 / 60, rel=0.02)
    # Profile rank 2: busy 90% of each step while its peers wait for it.
    assert f.fixes == (Fix("rank_work", 2, None, None, f.predicted_speedup, (KIND,)),)
    assert set(f.facts.busy) == {2}
    assert f.facts.busy[2] == pytest.approx(0.90, abs=0.02)
    spread = f.facts.spread
    assert (spread.high, spread.gpus) == (2, False)
    assert spread.high_busy == pytest.approx(0.90, abs=0.02)
    assert spread.low_busy == pytest.approx(0.50, abs=0.02)


def test_cause_is_taken_from_prior_findings_passed_in() -> None:
    snap = ddp_snapshot(busy_90_50(BIG_BATCH, 1))
    f = utilization_imbalance.RULE(snap, explained=_prior(snap))[0]
    assert f.cause == "batch_split"
    # A prior finding about other ranks is not a cause.
    other = Finding(kind="compute_straggler", severity="warning", ranks=(3,))
    f = utilization_imbalance.RULE(snap, explained=(other,))[0]
    assert f.cause is None
    assert f.ranks == (1,)
    assert [fix.lever for fix in f.fixes] == ["rank_work"]


@pytest.mark.parametrize(
    ("specs", "thresholds", "expected_ranks"),
    [
        pytest.param(busy_90_50(SLOW, 2), {}, (2,), id="defaults"),
        pytest.param(busy_90_50(SLOW, 2), {"min_spread": 0.5}, (), id="spread-threshold"),
        pytest.param(busy_90_50(SLOW, 2), {"min_steps": 25}, (), id="too-few-steps"),
        # 60% against 50%: a 10 point spread.
        pytest.param(busy_90_50(NORMAL.scaled(1.2), 2), {}, (), id="small-spread"),
        pytest.param(balanced(2), {}, (), id="balanced-2"),
        pytest.param(balanced(8), {}, (), id="balanced-8"),
    ],
)
def test_decision_table(specs: list, thresholds: dict, expected_ranks: tuple[int, ...]) -> None:
    findings = utilization_imbalance.RULE(ddp_snapshot(specs), **thresholds)
    assert tuple(r for f in findings for r in f.ranks) == expected_ranks


def test_a_rank_with_unmeasured_wait_that_only_waits_is_not_blamed() -> None:
    # Rank 0's probe could not hook the all-reduce (e.g. the script registered its own comm
    # hook); the others' waits are measured and show that everyone waits for rank 2. Rank 0
    # only waits (40 ms a step), so it must not be blamed.
    specs = busy_90_50(SLOW, 2)
    specs[0] = replace(specs[0], measure_wait=False)
    findings = utilization_imbalance.RULE(ddp_snapshot(specs))
    assert [f.ranks for f in findings] == [(2,)]
    # Rank 0's wait was not measured: its waiting may read as busy time.
    (f,) = findings
    assert f.facts.unmeasured == (0,)
    assert f.evidence["not_measured"] == ["collective_wait"]
    assert "0" not in f.evidence["collective_wait_ms"]


def test_silent_below_min_steps() -> None:
    assert utilization_imbalance.RULE(ddp_snapshot(busy_90_50(SLOW, 2), steps=7)) == []
    assert len(utilization_imbalance.RULE(ddp_snapshot(busy_90_50(SLOW, 2), steps=8))) == 1


def test_names_the_collectives_the_others_wait_in() -> None:
    """Where the probe named the collectives, the finding says where the others wait for the
    blamed rank (largest wait first), as compute_straggler and data_starvation do."""
    snap = ddp_snapshot(busy_90_50(SLOW, 2))
    for r in (0, 1, 3):
        snap = collective_ops(snap, r, {"all_reduce": 1, "ddp_allreduce": 9})
    snap = collective_ops(snap, 2, {"ddp_allreduce": 1})
    f = _only(analyze(snap), "utilization_imbalance")
    assert f.ranks == (2,)
    assert f.facts.waiting_in == ("ddp_allreduce", "all_reduce")
    assert f.facts.peers
    assert set(f.evidence["collective_ops_ms"]) == {"0", "1", "2", "3"}
    # Unnamed (an older probe): only who is waited for.
    plain = _only(analyze(ddp_snapshot(busy_90_50(SLOW, 2))), "utilization_imbalance")
    assert plain.facts.waiting_in == ()
    assert "collective_ops_ms" not in plain.evidence
