"""cpu_oversubscription: too many busy DataLoader workers for the host's cores."""

from __future__ import annotations

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import cpu_oversubscription
from auditor.analysis.rules.cpu_oversubscription import KIND, NOT_PREDICTED, Oversubscribed
from tests.helpers.jobs import NodeSpec, RankSpec, balanced, ddp_snapshot, oversubscribed_2core

RULE = cpu_oversubscription.RULE


def _only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    return findings[0]


TWO_CORES = {"node0": NodeSpec(cores=2.0, busy_cores=2.0)}


@pytest.mark.parametrize(
    ("specs", "nodes", "expected_ranks", "expected_new"),
    [
        # Mains 0.15 cores, rank 0's worker 0.2, rank 1's 8 workers 0.4 each (3.2 in all):
        # free = 2 - 0.3 = 1.7 cores for 9 workers; rank 1 needs ceil(1.25 * 3.2) = 4 by CPU
        # but its share of the free cores is floor(1.7 / 2) -> at least 1: 8 -> 1.
        pytest.param(*oversubscribed_2core(), (1,), {1: 1}, id="light-mains"),
        # Busy mains (0.9 each) leave 0.2 cores: 8 -> 1.
        # Rank 0's single worker is never lowered (a rank keeps at least one).
        pytest.param(
            [
                RankSpec(num_workers=1, main_cpu=0.9, worker_cpu=0.4),
                RankSpec(num_workers=8, main_cpu=0.9, worker_cpu=0.4),
            ],
            TWO_CORES,
            (1,),
            {1: 1},
            id="busy-mains",
        ),
        # Both ranks with 4 busy workers on a 2-core host: both blamed, each down to 1.
        pytest.param(
            balanced(2, num_workers=4, main_cpu=0.15, worker_cpu=0.4),
            TWO_CORES,
            (0, 1),
            {0: 1, 1: 1},
            id="both-ranks",
        ),
        # A roomy host with few free cores left: the data needs ceil(1.25 * 8 * 0.3) = 3 workers,
        # and the free cores (16 - 10) / 1 rank allow 6: 8 -> 3.
        pytest.param(
            [RankSpec(num_workers=8, main_cpu=10.0, worker_cpu=0.3)],
            {"node0": NodeSpec(cores=16.0, busy_cores=15.0)},
            (0,),
            {0: 3},
            id="sized-by-need",
        ),
    ],
)
def test_blames_the_rank_with_too_many_workers_and_lowers_them(
    specs: list, nodes: dict, expected_ranks: tuple[int, ...], expected_new: dict[int, int]
) -> None:
    f = _only(RULE(ddp_snapshot(specs, nodes=nodes)))
    assert f.ranks == expected_ranks
    assert set(f.facts.ranks) == set(expected_ranks)
    assert f.fixes == tuple(
        Fix("num_workers", r, specs[r].num_workers, expected_new[r], None, (KIND,))
        for r in expected_ranks
    )
    for r in expected_ranks:
        rank = f.facts.ranks[r]
        assert (rank.workers, rank.recommended) == (specs[r].num_workers, expected_new[r])
        assert 1 <= rank.recommended < rank.workers  # lowers, never raises
        assert f.evidence["recommended_workers"][str(r)] == expected_new[r]


def test_speedup_is_not_predicted_and_severity_follows_the_excess() -> None:
    # 9 workers for 1.7 free cores: 5.3x the free cores, above severe_ratio=2 -> warning.
    specs, nodes = oversubscribed_2core()
    f = _only(RULE(ddp_snapshot(specs, nodes=nodes)))
    assert f.predicted_speedup is None
    assert all(fix.speedup is None for fix in f.fixes)
    assert f.severity == "warning"
    assert f.evidence["free_cores_for_workers"] == pytest.approx(1.7)
    assert f.evidence["speedup_model"] == NOT_PREDICTED
    # Counted: rank 1's 8 workers (rank 0's single worker uses under min_worker_cpu).
    assert (f.facts.host, f.facts.cores, f.facts.workers) == ("node0", 2.0, 8)
    assert f.facts.free_cores == pytest.approx(1.7)
    assert f.facts.ranks == {1: Oversubscribed(8, 1, pytest.approx(3.2))}
    mild = _only(RULE(ddp_snapshot(specs, nodes=nodes), severe_ratio=10))
    assert mild.severity == "info"


def test_engine_blames_only_the_oversubscribing_rank() -> None:
    specs, nodes = oversubscribed_2core()
    findings = analyze(ddp_snapshot(specs, nodes=nodes))
    assert [f.kind for f in findings] == ["cpu_oversubscription"]
    assert findings[0].ranks == (1,)


def test_only_the_saturated_host_is_judged() -> None:
    # Ranks 0-1 on a saturated 2-core host, ranks 2-3 on a 64-core host with the same loaders.
    specs, _ = oversubscribed_2core()
    specs = [
        *specs,
        RankSpec(num_workers=1, main_cpu=0.15, worker_cpu=0.2, host="node1"),
        RankSpec(num_workers=8, main_cpu=0.15, worker_cpu=0.4, host="node1"),
    ]
    nodes = {"node0": NodeSpec(cores=2.0, busy_cores=2.0), "node1": NodeSpec(cores=64.0)}
    f = _only(RULE(ddp_snapshot(specs, nodes=nodes)))
    assert f.ranks == (1,)
    assert f.evidence["host"] == "node0"
    assert f.facts.host == "node0"


@pytest.mark.parametrize(
    ("specs", "nodes", "thresholds", "expected_ranks"),
    [
        pytest.param(*oversubscribed_2core(), {}, (1,), id="defaults"),
        # The host is only half busy.
        pytest.param(
            oversubscribed_2core()[0],
            {"node0": NodeSpec(cores=2.0, busy_cores=1.0)},
            {},
            (),
            id="host-not-busy",
        ),
        pytest.param(*oversubscribed_2core(), {"min_host_busy": 1.01}, (), id="busy-threshold"),
        # Rank 1's workers (3.2 cores together) are not counted under a 5-core threshold.
        pytest.param(
            *oversubscribed_2core(), {"min_worker_cpu": 5.0}, (), id="worker-cpu-threshold"
        ),
        pytest.param(*oversubscribed_2core(), {"min_samples": 25}, (), id="few-host-samples"),
        pytest.param(*oversubscribed_2core(), {"min_steps": 25}, (), id="too-few-steps"),
        # On a saturated host 0.05 cores per worker proves nothing (8 CPU-bound workers share
        # what is left): 8 workers using 0.4 cores for 0.4 free cores are still lowered.
        pytest.param(
            [
                RankSpec(num_workers=1, main_cpu=0.2, worker_cpu=0.05),
                RankSpec(num_workers=8, main_cpu=0.2, worker_cpu=0.05, data_wait=0.08),
            ],
            TWO_CORES,
            {},
            (1,),
            id="low-cpu-workers-on-saturated-host",
        ),
        # Worker CPU not measured: nothing to judge the workers by.
        pytest.param(
            [RankSpec(num_workers=8, main_cpu=0.2, worker_cpu=None)] * 2,
            TWO_CORES,
            {},
            (),
            id="worker-cpu-unmeasured",
        ),
        pytest.param(balanced(8), {}, {}, (), id="balanced-big-host"),
    ],
)
def test_decision_table(
    specs: list, nodes: dict, thresholds: dict, expected_ranks: tuple[int, ...]
) -> None:
    findings = RULE(ddp_snapshot(specs, nodes=nodes), **thresholds)
    assert tuple(r for f in findings for r in f.ranks) == expected_ranks


def test_silent_below_min_steps() -> None:
    specs, nodes = oversubscribed_2core()
    assert RULE(ddp_snapshot(specs, steps=7, nodes=nodes)) == []
    f = _only(RULE(ddp_snapshot(specs, steps=8, nodes=nodes)))
    assert f.ranks == (1,)
