"""compute_straggler: the rank everyone waits for, including a delay hidden inside backward."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import compute_straggler
from auditor.analysis.rules.compute_straggler import KIND
from auditor.analysis.snapshot import Snapshot
from tests.helpers.jobs import (
    RankSpec,
    backward_straggler,
    balanced,
    ddp_snapshot,
    forward_straggler,
    with_rank,
)
from tests.helpers.snapshots import collective_ops
from tests.helpers.stalls import StallSpec, stall_snapshot


def _only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    return findings[0]


@pytest.mark.parametrize(
    ("specs", "slow_rank", "phase"),
    [
        pytest.param(forward_straggler(), 2, "forward", id="forward-rank2-of-4"),
        pytest.param(backward_straggler(), 1, "backward", id="inside-backward-rank1-of-2"),
        pytest.param(
            with_rank(balanced(8), 5, backward=0.130),
            5,
            "backward",
            id="inside-backward-rank5-of-8",
        ),
        pytest.param(with_rank(balanced(4), 0, h2d=0.050), 0, "h2d", id="h2d-rank0-of-4"),
        pytest.param(
            with_rank(balanced(4), 3, optimizer=0.050),
            3,
            "optimizer",
            id="optimizer-rank3-of-4",
        ),
    ],
)
def test_blames_the_slow_rank_and_names_the_phase(specs: list, slow_rank: int, phase: str) -> None:
    f = _only(compute_straggler.RULE(ddp_snapshot(specs)))
    assert f.ranks == (slow_rank,)
    assert {fix.rank for fix in f.fixes} == {slow_rank}
    assert f.facts.ranks[slow_rank].phase == phase
    assert f.evidence["per_rank"][str(slow_rank)]["phase"] == phase
    assert f.fixes[0] == Fix("rank_work", slow_rank, phase, None, f.predicted_speedup, (KIND,))
    # No other finding blames a rank that only waits.
    for other in analyze(ddp_snapshot(specs)):
        assert set(other.ranks) <= {slow_rank}, other.to_dict()


def test_slow_backward_found_with_the_wait_carved_out() -> None:
    snap = ddp_snapshot(backward_straggler())
    views = {v.info.rank: v for v in snap.ranks}
    # Exclusive phases: backward holds each rank's own work only (120 ms against 60 ms)...
    bwd = {r: statistics.median(s.backward_s for s in v.steps) for r, v in views.items()}
    assert bwd[1] == pytest.approx(2 * bwd[0], rel=0.05)
    # ...and the wait at the all-reduce is apart: ~64 ms on rank 0, ~4 ms on rank 1.
    wait = {r: snap.stats[r].collective_wait_s for r in views}
    assert wait[0] == pytest.approx(0.064, rel=0.1)
    assert wait[1] == pytest.approx(0.004, rel=0.1)

    f = _only(compute_straggler.RULE(snap))
    assert f.ranks == (1,)
    assert f.evidence["per_rank"]["1"]["phase"] == "backward"
    # Own backward compute: 120 ms against 60 ms.
    assert f.evidence["per_rank"]["1"]["phase_ms"] == pytest.approx(120, rel=0.05)
    assert f.evidence["per_rank"]["1"]["peer_phase_ms"] == pytest.approx(60, rel=0.05)
    for finding in analyze(snap):
        assert 0 not in finding.ranks, finding.to_dict()
        assert all(fix.rank != 0 for fix in finding.fixes), finding.to_dict()


def test_predicted_speedup_matches_barrier_model() -> None:
    # By hand: rank 2's local time is 1 + 5 + 70 + 60 + 5 = 141 ms, peers' 101 ms, comm floor
    # 4 ms. Before: 141 + 4 = 145 ms; after (rank 2 at its peers' median local): 101 + 4 = 105 ms.
    # 145 / 105 = 1.381.
    f = _only(compute_straggler.RULE(ddp_snapshot(forward_straggler())))
    assert f.predicted_speedup == pytest.approx(145 / 105, rel=0.02)
    assert f.severity == "warning"


def test_two_stragglers_are_both_blamed() -> None:
    # Rank 0 very slow (backward 260 ms), rank 1 moderately (backward 100 ms), ranks 2-3 normal.
    specs = with_rank(with_rank(balanced(4), 0, backward=0.260), 1, backward=0.100)
    f = _only(compute_straggler.RULE(ddp_snapshot(specs)))
    assert f.ranks == (0, 1)
    assert {fix.rank for fix in f.fixes} == {0, 1}


def test_batch_size_alternative_for_a_slower_device() -> None:
    # Rank 2 computes 1.4x slower per sample: 32 * 100 / 140 = 22.9 -> 23.
    f = _only(compute_straggler.RULE(ddp_snapshot(forward_straggler())))
    batch = [fix for fix in f.fixes if fix.lever == "batch_size"]
    assert batch == [Fix("batch_size", 2, 32, 23, f.predicted_speedup, (KIND,))]


@pytest.mark.parametrize(
    ("specs", "thresholds", "expected_ranks"),
    [
        pytest.param(forward_straggler(), {}, (2,), id="defaults"),
        # Rank 2's compute is 140 ms against 100 ms: excess 1.4.
        pytest.param(forward_straggler(), {"min_excess": 1.5}, (), id="excess-threshold"),
        # Rank 2's extra local time is 40 ms of a 145 ms step (28%).
        pytest.param(forward_straggler(), {"min_gap_ratio": 0.3}, (), id="gap-threshold"),
        pytest.param(forward_straggler(), {"min_steps": 25}, (), id="too-few-steps"),
        # 10% slower forward only: compute 104 vs 100 ms, under the 1.25 default.
        pytest.param(with_rank(balanced(4), 2, forward=0.034), {}, (), id="small-excess"),
        pytest.param(balanced(2), {}, (), id="balanced-2"),
        pytest.param(balanced(8), {}, (), id="balanced-8"),
        # A single rank has no peers to compare with.
        pytest.param(with_rank(balanced(1), 0, forward=0.2), {}, (), id="single-rank"),
        # Data wait is data_starvation's business, not compute.
        pytest.param(with_rank(balanced(4), 2, data_wait=0.1), {}, (), id="data-wait-only"),
    ],
)
def test_decision_table(specs: list, thresholds: dict, expected_ranks: tuple[int, ...]) -> None:
    findings = compute_straggler.RULE(ddp_snapshot(specs), **thresholds)
    assert tuple(r for f in findings for r in f.ranks) == expected_ranks


def test_never_blames_a_waiting_rank_when_waits_are_unmeasured() -> None:
    # Measured, the job has one straggler: rank 2 (forward 70 ms against 30 ms).
    measured = analyze(ddp_snapshot(forward_straggler()))
    assert [(f.kind, f.ranks) for f in measured if f.kind == "compute_straggler"] == [
        ("compute_straggler", (2,))
    ]
    # Without the collective wait (every rank's script registered a builtin comm hook) each
    # rank's backward wall time includes the barrier, so every rank computes the same ~144 ms
    # per step (rank 2: forward 70 + backward 64; the others: forward 30 + backward 104) and
    # the straggler cannot be told from the ranks that wait for it. Nothing is blamed: neither
    # a rank that only waits nor, by a guess, rank 2.
    snap = ddp_snapshot([replace(s, measure_wait=False) for s in forward_straggler()])
    assert {r: s.collective_wait_s for r, s in snap.stats.items()} == dict.fromkeys(range(4))
    assert [(f.kind, f.ranks) for f in analyze(snap)] == []


def test_a_rank_with_unmeasured_wait_that_only_waits_is_not_blamed() -> None:
    # Rank 2 is the forward straggler; rank 0's collective wait could not be measured (its
    # script registered a builtin comm hook), ranks 1-3 are measured and show rank 2 waits
    # least. Rank 0 spends ~40 ms a step waiting inside backward and must not be blamed.
    specs = forward_straggler()
    specs[0] = replace(specs[0], measure_wait=False)
    findings = compute_straggler.RULE(ddp_snapshot(specs))
    assert [f.ranks for f in findings] == [(2,)]


def test_silent_below_min_steps() -> None:
    assert compute_straggler.RULE(ddp_snapshot(forward_straggler(), steps=7)) == []
    f = _only(compute_straggler.RULE(ddp_snapshot(forward_straggler(), steps=8)))
    assert f.ranks == (2,)


def test_names_the_collectives_the_others_wait_in() -> None:
    """The probe names each collective: the finding says where the peers wait for the straggler
    (the same words data_starvation uses), and its evidence carries each rank's wait by op."""
    snap = ddp_snapshot(forward_straggler())
    for r in (0, 1, 3):  # the peers wait for rank 2 mostly in the gradient all-reduce
        snap = collective_ops(snap, r, {"ddp_allreduce": 30, "all_gather_object": 10})
    snap = collective_ops(snap, 2, {"ddp_allreduce": 1})
    f = _only(compute_straggler.RULE(snap))
    assert f.ranks == (2,)
    assert f.facts.waiting_in == ("ddp_allreduce", "all_gather_object")
    ops = f.evidence["collective_ops_ms"]
    assert set(ops) == {"0", "1", "2", "3"}
    assert set(ops["0"]) == {"ddp_allreduce", "all_gather_object"}
    assert ops["0"]["ddp_allreduce"] == pytest.approx(3 * ops["0"]["all_gather_object"], rel=0.01)
    assert sum(ops["0"].values()) == pytest.approx(f.evidence["collective_wait_ms"]["0"], abs=0.2)


def test_without_named_collectives_the_wait_is_at_the_all_reduce() -> None:
    f = _only(compute_straggler.RULE(ddp_snapshot(forward_straggler())))
    assert f.facts.waiting_in == ()
    assert "collective_ops_ms" not in f.evidence


def test_a_starved_rank_with_a_little_slower_compute_is_data_starvation_only() -> None:
    """The starved example on two busy cores (a live window of tests/e2e's operator stack):
    rank 1 waits 117 ms a step for data and its compute runs 1.3x its peer's, its own loader
    taking CPU. Its extra local time is the data wait, not compute: compute_straggler stays
    silent (it said "critical" for the whole wait before), data_starvation names it."""
    cpu = {"h2d": 0.0005, "forward": 0.004, "backward": 0.008, "optimizer": 0.0008}
    specs = with_rank(balanced(2, num_workers=1, **cpu), 1, data_wait=0.117, forward=0.008)
    snap = ddp_snapshot(specs)
    s0, s1 = snap.stats[0], snap.stats[1]
    assert s1.compute_s / s0.compute_s > 1.25  # slower per sample, past min_excess
    assert compute_straggler.RULE(snap) == []
    kinds = {(f.kind, f.ranks) for f in analyze(snap) if f.severity != "info"}
    assert ("data_starvation", (1,)) in kinds
    assert all(k != "compute_straggler" for k, _ in kinds)


def test_a_slow_rank_that_also_waits_for_data_is_blamed_for_its_compute_only() -> None:
    """Slow compute and a data wait on one rank: blamed, and the speed-up is for the compute
    alone (its data wait stays, data_starvation's to fix)."""
    specs = with_rank(balanced(4), 2, forward=0.090, data_wait=0.040)
    f = _only(compute_straggler.RULE(ddp_snapshot(specs)))
    assert f.ranks == (2,)
    # Before: 40 (data) + 5 + 90 + 60 + 5 = 200 ms of local time; the fix brings its own
    # work to the peers' 100 ms and keeps its 40 ms data wait: 140 ms, about 200 / 140.
    assert f.predicted_speedup == pytest.approx(0.200 / 0.140, rel=0.05)


# --- own work in no phase; a straggler no stall explains away ------------------------------------

# A CPU rank's small step: 0.5 ms data, forward 2 ms, backward 4 ms, optimizer 0.5 ms, 1 ms comm.
SMALL = RankSpec(
    data_wait=0.0005, h2d=0.0, forward=0.002, backward=0.004, optimizer=0.0005, device="cpu"
)


def other_work_snapshot(world: int, rank: int = 1, other_s: float = 0.008) -> Snapshot:
    """Rank ``rank``'s every step carries ``other_s`` of its own work in no phase (after its
    optimizer step: a metric, a debug check), which its peers wait for at the next all-reduce:
    about half of their run. Its phases are its peers'."""
    specs = [SMALL] * world
    return stall_snapshot(
        specs, {rank: StallSpec(other_s, every=1, where="other")}, steps=60, comm=0.001
    )


@pytest.mark.parametrize(("world", "rank"), [(2, 1), (8, 3)])
def test_own_work_in_no_phase_is_a_stragglers(world: int, rank: int) -> None:
    snap = other_work_snapshot(world, rank)
    peers = [r for r in range(world) if r != rank]
    # The peers wait about half of their steps; the rank's phases equal theirs.
    for q in peers:
        s = snap.stats[q]
        assert (s.collective_wait_s or 0) / s.step_s > 0.45
        assert s.compute_s == pytest.approx(snap.stats[rank].compute_s, rel=0.1)
    f = _only(compute_straggler.RULE(snap))
    assert f.ranks == (rank,)
    slow = f.facts.ranks[rank]
    assert slow.phase == "other"
    assert slow.phase_s == pytest.approx(0.008, rel=0.05)
    assert slow.peer_phase_s == pytest.approx(0.0, abs=1e-4)
    # Its fix points at the loop's own code; a smaller batch does not shrink that work.
    assert f.fixes == (Fix("rank_work", rank, "other", None, f.predicted_speedup, (KIND,)),)
    assert slow.batch_share is None
    assert f.severity in ("warning", "critical")
    # Nothing else blames the peers that wait for it.
    for other in analyze(snap):
        assert set(other.ranks) <= {rank}, other.to_dict()


@pytest.mark.parametrize(("world", "slow"), [(2, 1), (8, 5)])
def test_a_stall_does_not_explain_a_persistent_straggler_away(world: int, slow: int) -> None:
    from tests.analysis.test_stall import noisy_straggler

    snap = noisy_straggler(world, slow)
    stalled = Finding(kind="stall", severity="info", ranks=(slow,))
    # Its typical (median) own work is past its peers': blamed all the same, on its typical
    # step (forward 150 ms against 30 ms).
    f = _only(compute_straggler.RULE(snap, [stalled]))
    assert f.ranks == (slow,)
    assert f.facts.ranks[slow].phase == "forward"
    assert f.facts.ranks[slow].phase_s == pytest.approx(0.150, rel=0.1)
    assert f.facts.ranks[slow].peer_phase_s == pytest.approx(0.030, rel=0.1)
    # A rank whose typical step is its peers' is the stall's alone.
    calm = stall_snapshot(balanced(world), {slow: StallSpec(1.0, every=5)}, steps=40)
    assert compute_straggler.RULE(calm, [stalled]) == []


def test_peers_that_differ_as_much_among_themselves_hide_no_straggler() -> None:
    # 8 ranks of a mixed fleet: own work 60, 70, 80, 90, 100, 105, 110 ms on ranks 0-6 (their
    # median absolute deviation 15 ms: 22 ms as a standard deviation), and 145 ms on rank 7:
    # 1.6x its peers' median, but 55 ms over it is within three of their spreads (67 ms). Not
    # blamed; with the spread left out it would be, and it alone.
    backward = [0.020, 0.030, 0.040, 0.050, 0.060, 0.065, 0.070, 0.105]
    specs = [replace(balanced(1)[0], backward=b) for b in backward]
    snap = ddp_snapshot(specs)
    assert compute_straggler.RULE(snap) == []
    assert [f.ranks for f in compute_straggler.RULE(snap, spread_k=0.0)] == [(7,)]
    # With 2 ranks the peer has no spread: the ratio and the gap decide alone.
    pair = ddp_snapshot([specs[0], specs[7]])
    assert [f.ranks for f in compute_straggler.RULE(pair)] == [(1,)]


def test_own_work_with_an_object_gather_predicts_the_gather_gone() -> None:
    """Rank 1's extra work is its own code and every rank pays an object gather each step (a
    metrics gather in the loop): taking it off the step removes the gather too, so the
    prediction is the barrier model with the gather's floor gone; the range's low end is the
    rank's own code gone alone."""
    snap = other_work_snapshot(2, 1)
    for r in (0, 1):
        snap = collective_ops(snap, r, {"ddp_allreduce": 1, "all_gather_object": 1})
    f = _only(compute_straggler.RULE(snap))
    assert f.ranks == (1,) and f.predicted_speedup is not None and f.predicted_range is not None
    lo, hi = f.predicted_range
    assert lo < f.predicted_speedup == hi
    assert hi == pytest.approx(f.evidence["speedup_if_object_collectives_go"], abs=1e-3)
    assert all(x.speedup == hi for x in f.fixes)
    # The low end: rank 1's own work brought to rank 0's, the gather kept.
    plain = _only(compute_straggler.RULE(other_work_snapshot(2, 1)))
    assert lo == pytest.approx(plain.predicted_speedup, rel=0.02)
    # The floor is the least wait (rank 1's, ~1 ms); half of it is the gather, on every rank.
    local = f.evidence["local_ms"]
    floor = min(f.evidence["collective_wait_ms"].values())
    after = local["0"] + floor / 2  # rank 1's own work brought to rank 0's
    assert hi == pytest.approx((max(local.values()) + floor) / after, rel=0.02)


@pytest.mark.parametrize("ops", [{"ddp_allreduce": 1}, None])
def test_without_an_object_gather_no_range_from_the_rule(ops: dict[str, float] | None) -> None:
    snap = other_work_snapshot(2, 1)
    if ops:
        for r in (0, 1):
            snap = collective_ops(snap, r, ops)
    f = _only(compute_straggler.RULE(snap))
    assert f.predicted_range is None and "speedup_if_object_collectives_go" not in f.evidence
    # A straggler in a phase: its fix is that phase's work, not the loop's own code.
    snap = ddp_snapshot(forward_straggler())
    for r in range(4):
        snap = collective_ops(snap, r, {"ddp_allreduce": 1, "all_gather_object": 1})
    assert _only(compute_straggler.RULE(snap)).predicted_range is None


def _on_cpus(rank2_cpu: float, rank2_wait: float, peers_wait: float = 0.02) -> Snapshot:
    """forward_straggler's ranks on the CPU: rank 2's forward takes 40 ms more than its
    peers'; the CPU each main thread used (cores; the peers, waiting at the barrier, 0.5) and
    the time it waited for a core (seconds a second)."""
    specs = [
        replace(s, device="cpu", main_cpu=0.5, main_wait=peers_wait) for s in forward_straggler()
    ]
    specs[2] = replace(specs[2], main_cpu=rank2_cpu, main_wait=rank2_wait)
    return ddp_snapshot(specs)


def test_a_rank_that_waited_for_a_core_is_short_of_cores_not_slow_work() -> None:
    # Rank 2 used about the CPU its peers did (0.55 against 0.5 cores) and waited for a core
    # 0.25 s a second (about 50 ms of its step) against 0.02: the extra is the host's CPU.
    f = _only(compute_straggler.RULE(_on_cpus(0.55, 0.25)))
    assert f.ranks == (2,)
    slow = f.facts.ranks[2]
    assert slow.short_of_cores and slow.phase == "forward"
    assert slow.core_wait_s is not None and slow.peer_core_wait_s is not None
    assert slow.core_wait_s - slow.peer_core_wait_s >= 0.5 * 0.040
    assert slow.batch_size is None  # no smaller batch: it would queue for the same cores
    assert f.fixes == (Fix("host_cores", 2, None, None, f.predicted_speedup, (KIND,)),)
    assert f.evidence["per_rank"]["2"]["short_of_cores"] is True


@pytest.mark.parametrize(
    ("cpu", "wait", "peers_wait"),
    [
        # More CPU than its peers (0.9 against 0.5 cores): more work, which on a busy host
        # also waits for cores in proportion.
        pytest.param(0.9, 0.25, 0.02, id="more-cpu-is-more-work"),
        # Every rank waited for a core alike: its extra forward is its own.
        pytest.param(0.55, 0.25, 0.25, id="waits-like-its-peers"),
        # Not measured: judged as before.
        pytest.param(0.55, None, None, id="unmeasured"),
    ],
)
def test_a_slow_rank_is_slow_work_unless_its_cores_explain_it(
    cpu: float, wait: float | None, peers_wait: float | None
) -> None:
    f = _only(compute_straggler.RULE(_on_cpus(cpu, wait, peers_wait)))  # type: ignore[arg-type]
    assert not f.facts.ranks[2].short_of_cores
    assert f.fixes[0] == Fix("rank_work", 2, "forward", None, f.predicted_speedup, (KIND,))


def test_a_rank_on_a_gpu_is_never_judged_short_of_cores() -> None:
    # The host thread's CPU on a GPU rank is launches and spin-waits, not the rank's work.
    specs = [replace(s, main_cpu=0.5, main_wait=0.02) for s in forward_straggler()]
    specs[2] = replace(specs[2], main_cpu=0.55, main_wait=0.25)
    f = _only(compute_straggler.RULE(ddp_snapshot(specs)))
    assert not f.facts.ranks[2].short_of_cores
