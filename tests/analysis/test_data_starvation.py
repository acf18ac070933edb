"""data_starvation: who starves, and how many DataLoader workers the fix asks for."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.loading import CPU, IO
from auditor.analysis.rules import data_starvation
from auditor.analysis.rules.data_starvation import KIND
from auditor.analysis.workers import CORES, CORES_ASSUMED
from tests.helpers.jobs import NodeSpec, balanced, ddp_snapshot, starved_rank3, with_rank

RULE = data_starvation.RULE


def _only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    return findings[0]


def _new_workers(f: Finding, rank: int, old: int) -> int | None:
    """The ``num_workers`` the finding's fix asks of ``rank`` (from ``old``); None: no raise."""
    fixes = [x for x in f.fixes if x.rank == rank and x.lever == "num_workers"]
    if not fixes:
        return None
    (fix,) = fixes
    assert fix.current == old, fix
    assert isinstance(fix.proposed, int)
    return fix.proposed


def _no_free_cpu(f: Finding, rank: int) -> None:
    """No worker fits on a host without CPU for CPU-bound loading: the fix is cheaper loading
    (the report: "no free CPU on this host for more DataLoader workers")."""
    starved = f.facts.ranks[rank]
    assert starved.workers is None and starved.loading != IO, starved
    assert next(x.lever for x in f.fixes if x.rank == rank) == "loading_cost"
    assert Fix("loading_cost", rank, None, None, f.predicted_speedup, (KIND,)) in f.fixes


def test_blames_exactly_the_starved_rank() -> None:
    f = _only(RULE(ddp_snapshot(starved_rank3())))
    assert f.kind == "data_starvation"
    assert f.ranks == (3,)
    assert set(f.facts.ranks) == {3}
    assert {fix.rank for fix in f.fixes} == {3}
    assert all(fix.answers == (KIND,) for fix in f.fixes)
    assert f.evidence["per_rank"]["3"]["data_wait_ratio"] == pytest.approx(0.60, abs=0.01)
    assert f.severity in ("warning", "critical")


def test_no_other_finding_blames_the_waiting_ranks() -> None:
    findings = analyze(ddp_snapshot(starved_rank3()))
    assert [f.kind for f in findings] == ["data_starvation"]
    assert all(set(f.ranks) <= {3} for f in findings)


def test_fix_raises_num_workers_to_keep_up() -> None:
    # Per-batch load time with 2 workers that cannot keep up: L = 2 * step = 2 * 0.26 = 0.52 s.
    # Target pace: the rank's own work, 0.1 s. b = ceil(1.25 * 0.52 / 0.1) = ceil(6.5) = 7.
    # 64-core host, ~15 busy: plenty of free cores, so nothing caps it.
    f = _only(RULE(ddp_snapshot(starved_rank3())))
    assert f.fixes == (Fix("num_workers", 3, 2, 7, f.predicted_speedup, (KIND,)),)
    assert f.evidence["per_rank"]["3"]["recommended_workers"] == 7
    assert f.facts.ranks[3].workers == 7
    assert f.facts.ranks[3].limited_by is None  # not capped
    assert f.evidence["per_rank"]["3"]["speedup_basis"] == data_starvation.WORKERS_KEEP_UP


def test_predicted_speedup_matches_barrier_model() -> None:
    # By hand, barrier model with nominal values: before = slowest local (rank 3: 156 ms wait +
    # 100 ms work) + comm floor 4 ms = 260 ms. With 7 workers a batch arrives every
    # 520/7 = 74 ms < 100 ms of work, so rank 3's wait drops to 0 and its local time to 100 ms;
    # the slowest local is then another rank's 101 ms (1 ms wait + 100 ms): after = 105 ms.
    # 260 / 105 = 2.476.
    f = _only(RULE(ddp_snapshot(starved_rank3())))
    assert f.predicted_speedup is not None
    assert f.predicted_speedup == pytest.approx(260 / 105, rel=0.02)
    assert f.severity == "critical"


def test_workers_capped_by_free_cores_when_worker_cpu_unmeasured() -> None:
    # 32-core host with 31 busy: 1 idle core. Worker CPU unmeasured -> one core per worker,
    # so only 1 more worker fits: 2 -> 3, and the fix says it is capped.
    specs = starved_rank3(worker_cpu=None)
    snap = ddp_snapshot(specs, nodes={"node0": NodeSpec(cores=32, busy_cores=31)})
    f = _only(RULE(snap))
    assert f.ranks == (3,)
    assert _new_workers(f, 3, 2) == 3
    assert f.facts.ranks[3].limited_by == CORES  # "as many as the free cores allow"
    assert f.evidence["per_rank"]["3"]["limited_by"] == CORES


def test_workers_capped_by_free_cores_when_worker_cpu_measured() -> None:
    # 32-core host with 31 busy (1 idle core, the node's busy figure includes rank 3's workers).
    # Rank 3's 2 workers use 0.5 cores each: the cores its workers may use are 1 idle + 1.0 it
    # uses now = 2.0 cores, i.e. 2.0 / 0.5 = 4 workers at most. Needed (uncapped) is 7.
    snap = ddp_snapshot(starved_rank3(), nodes={"node0": NodeSpec(cores=32, busy_cores=31)})
    f = _only(RULE(snap))
    b = _new_workers(f, 3, 2)
    assert b is not None
    assert 2 < b <= 4
    assert f.facts.ranks[3].limited_by == CORES


def test_workers_capped_by_one_assumed_core_where_the_host_was_never_sampled() -> None:
    # No node CPU samples: the free cores are unknown, one is assumed. Rank 3's workers use
    # 0.5 cores each: 1 / 0.5 = 2 workers fit, no more than it runs: none added.
    snap = replace(ddp_snapshot(starved_rank3(worker_cpu=0.5)), nodes=())
    f = _only(RULE(snap))
    assert f.evidence["per_rank"]["3"]["free_cores"] is None
    assert f.facts.ranks[3].limited_by == CORES_ASSUMED
    assert f.evidence["per_rank"]["3"]["limited_by"] == CORES_ASSUMED


def test_saturated_host_without_prior_finding_does_not_raise_workers() -> None:
    snap = ddp_snapshot(starved_rank3(), nodes={"node0": NodeSpec(cores=16, busy_cores=16)})
    f = _only(RULE(snap))
    assert _new_workers(f, 3, 2) is None
    _no_free_cpu(f, 3)
    assert f.evidence["per_rank"]["3"]["speedup_basis"] == data_starvation.CHEAPER_LOADING


def _oversubscription(ranks: tuple[int, ...]) -> Finding:
    return Finding(
        kind="cpu_oversubscription",
        severity="warning",
        ranks=ranks,
        predicted_speedup=1.3,
    )


def test_saturated_host_with_prior_oversubscription_does_not_raise_workers() -> None:
    snap = ddp_snapshot(starved_rank3(), nodes={"node0": NodeSpec(cores=16, busy_cores=16)})
    f = _only(RULE(snap, explained=[_oversubscription((3,))]))
    assert f.ranks == (3,)
    assert _new_workers(f, 3, 2) is None
    _no_free_cpu(f, 3)


def test_oversubscribed_rank_gets_no_workers_even_where_the_cores_look_free() -> None:
    # The same job uncapped would go 2 -> 7 (next test); cpu_oversubscription's verdict on
    # rank 3's host is enough on its own: the engine's input, not the free-cores cap, holds it.
    snap = ddp_snapshot(starved_rank3())
    f = _only(RULE(snap, explained=[_oversubscription((3,))]))
    assert f.ranks == (3,)
    assert _new_workers(f, 3, 2) is None, f.fixes
    _no_free_cpu(f, 3)


def test_prior_oversubscription_of_another_rank_does_not_block_the_raise() -> None:
    snap = ddp_snapshot(starved_rank3())
    f = _only(RULE(snap, explained=[_oversubscription((5,))]))
    assert _new_workers(f, 3, 2) == 7


def test_saturated_host_through_the_engine_does_not_raise_workers() -> None:
    # 8 ranks x (main 0.9 + 2 workers x 0.9 cores) = 24 busy processes on a saturated 16-core
    # host: cpu_oversubscription runs first and blames every rank, rank 3 included.
    specs = [replace(s, worker_cpu=0.9) for s in starved_rank3()]
    snap = ddp_snapshot(specs, nodes={"node0": NodeSpec(cores=16, busy_cores=16)})
    by_kind = {f.kind: f for f in analyze(snap)}
    assert 3 in by_kind["cpu_oversubscription"].ranks
    starving = by_kind["data_starvation"]
    assert starving.ranks == (3,)
    assert _new_workers(starving, 3, 2) is None
    _no_free_cpu(starving, 3)


@pytest.mark.parametrize(
    ("device", "pin_memory", "mentions_pin"),
    [
        pytest.param("cuda:3", False, True, id="cuda-unpinned"),
        pytest.param("cuda:3", True, False, id="cuda-pinned"),
        pytest.param("cpu", False, False, id="cpu-unpinned"),
    ],
)
def test_pin_memory_advice(device: str, pin_memory: bool, mentions_pin: bool) -> None:
    snap = ddp_snapshot(starved_rank3(device=device, pin_memory=pin_memory))
    f = _only(RULE(snap))
    assert f.facts.ranks[3].set_pin_memory is mentions_pin
    pin = Fix("pin_memory", 3, False, True, f.predicted_speedup, (KIND,))
    assert (pin in f.fixes) is mentions_pin
    assert _new_workers(f, 3, 2) == 7


def test_persistent_workers_advice() -> None:
    f = _only(RULE(ddp_snapshot(starved_rank3(persistent_workers=False))))
    assert f.facts.ranks[3].set_persistent_workers
    assert f.fixes[-1] == Fix("persistent_workers", 3, False, True, f.predicted_speedup, (KIND,))
    f = _only(RULE(ddp_snapshot(starved_rank3())))
    assert not f.facts.ranks[3].set_persistent_workers
    assert "persistent_workers" not in {fix.lever for fix in f.fixes}


def test_main_process_loading_gets_workers() -> None:
    # num_workers=0: the main process loads, so the load time per batch is the wait itself
    # (140 ms); own work 100 ms: b = ceil(1.25 * 0.14 / 0.1) = ceil(1.75) = 2.
    snap = ddp_snapshot(with_rank(balanced(8), 3, data_wait=0.140, num_workers=0))
    f = _only(RULE(snap))
    assert f.ranks == (3,)
    assert _new_workers(f, 3, 0) == 2


@pytest.mark.parametrize(
    ("specs", "thresholds", "expected_ranks"),
    [
        pytest.param(starved_rank3(), {}, (3,), id="defaults"),
        pytest.param(starved_rank3(), {"min_wait_ratio": 0.7}, (), id="ratio-above-60pct"),
        pytest.param(starved_rank3(), {"min_wait_s": 0.2}, (), id="wait-above-156ms"),
        pytest.param(starved_rank3(), {"min_steps": 25}, (), id="too-few-steps"),
        # 12% of the step waiting for data: under the 15% default.
        pytest.param(with_rank(balanced(8), 3, data_wait=0.014), {}, (), id="mild-wait"),
        pytest.param(
            with_rank(balanced(8), 3, data_wait=0.014),
            {"min_wait_ratio": 0.1},
            (3,),
            id="mild-wait-lower-threshold",
        ),
        # Two starved ranks on one host.
        pytest.param(
            with_rank(starved_rank3(), 6, data_wait=0.150),
            {},
            (3, 6),
            id="two-starved",
        ),
        pytest.param(balanced(8), {}, (), id="balanced"),
    ],
)
def test_decision_table(specs: list, thresholds: dict, expected_ranks: tuple[int, ...]) -> None:
    findings = RULE(ddp_snapshot(specs, steps=24), **thresholds)
    assert tuple(r for f in findings for r in f.ranks) == expected_ranks


def test_silent_below_min_steps() -> None:
    assert RULE(ddp_snapshot(starved_rank3(), steps=7)) == []
    assert _only(RULE(ddp_snapshot(starved_rank3(), steps=8))).ranks == (3,)


@pytest.mark.parametrize(
    ("worker_cpu", "busy", "raises"),
    [
        # 8 workers at 0.45 cores each on a saturated 16-core host where 30 job processes
        # compete: a CPU-bound process gets 16 / 30 = 0.53 cores, and these use 84% of that.
        # CPU-bound workers sharing what little is left: more would only oversubscribe the host.
        pytest.param(0.45, 16.0, False, id="cpu-bound-saturated-host"),
        # 0.09 cores each on the same saturated host is 17% of the 0.53 a CPU-bound worker
        # would get: they wait on storage, and more of them need memory, not cores. (Before
        # issue 11 the saturated host alone refused any raise.)
        pytest.param(0.09, 16.0, True, id="io-bound-saturated-host"),
        # The same low CPU per worker with 8 idle cores: they wait on storage; more help.
        pytest.param(0.09, 8.0, True, id="io-bound-idle-cores"),
    ],
)
def test_low_cpu_per_worker_is_io_bound_when_well_under_the_fair_share(
    worker_cpu: float, busy: float, raises: bool
) -> None:
    specs = starved_rank3(num_workers=8, worker_cpu=worker_cpu)
    snap = ddp_snapshot(specs, nodes={"node0": NodeSpec(cores=16, busy_cores=busy)})
    f = _only(RULE(snap))
    new = _new_workers(f, 3, 8)
    if raises:
        assert new is not None and new > 8, f.fixes
        assert f.evidence["per_rank"]["3"]["loading"]["kind"] == "io"
        assert f.facts.ranks[3].loading == IO
    else:
        assert new is None, f.fixes
        _no_free_cpu(f, 3)
        assert f.evidence["per_rank"]["3"]["loading"]["kind"] == "cpu"
        assert f.facts.ranks[3].loading == CPU
