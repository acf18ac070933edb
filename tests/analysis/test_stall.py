"""stall: a rank whose own work spikes (every N steps, or now and then) while its peers wait at
the next collective is named with its period, cost and share; a stall every rank has alike is
not blamed on one; balanced jobs, jitter and starved ranks give nothing."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.rules import RULES, stall
from auditor.analysis.rules.stall import Facts, Stall
from auditor.analysis.snapshot import WARMUP_STEPS, RankView, SampleStore, Snapshot
from auditor.samples import Batch, NodeCpu, StepSample
from auditor.telemetry.recorded import read_recording
from tests.helpers.jobs import balanced, ddp_snapshot, starved_rank3, with_rank
from tests.helpers.stalls import StallSpec, stall_snapshot

DATA = Path(__file__).resolve().parents[1] / "data" / "stall_cpu"
# Every rank's step: data 1 + h2d 5 + forward 30 + backward 60 + optimizer 5 ms, comm 4 ms.
STEP = 0.105


def _one(findings: list[Finding]) -> tuple[Finding, Facts]:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    (f,) = findings
    assert isinstance(f.facts, Facts)
    return f, f.facts


def _levers(f: Finding) -> list[tuple[str, int | None, object, object]]:
    return [(x.lever, x.rank, x.current, x.proposed) for x in f.fixes]


def test_a_periodic_checkpoint_on_rank_0_is_named_with_its_period_and_share() -> None:
    # Rank 0 saves 1.2 s every 5 steps after its optimizer step: rank 1 waits for it at the
    # next step's all-reduce. 8 saves in 40 steps.
    snap = stall_snapshot(
        balanced(2), {0: StallSpec(1.2, every=5, first=3, name="checkpoint")}, steps=40
    )
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == (0,)
    assert facts.every_rank is None
    s = facts.ranks[0]
    assert (s.work, s.period, s.occurrences) == ("checkpoint", 5, 8)
    assert s.steps == (3, 8, 13, 18, 23, 28, 33, 38)
    assert s.cost_s == pytest.approx(1.2, rel=0.03)
    assert s.peer_wait_s == pytest.approx(1.2, rel=0.03)
    # 8 x 1.2 s of a window of 40 x 105 ms + 9.6 s.
    assert s.share == pytest.approx(9.6 / (40 * STEP + 9.6), rel=0.03)
    assert f.severity == "critical"
    # Saved asynchronously, or every N steps so that it costs 5% of the run.
    interval = s.interval
    assert interval is not None and interval > 5
    assert 1.2 / (interval * STEP + 1.2) == pytest.approx(0.05, rel=0.05)
    # Saving every ``interval`` steps first (what it saves is each save's cost but once per
    # interval), or off the step.
    assert _levers(f) == [
        ("checkpoint_interval", 0, 5, interval),
        ("checkpoint_async", 0, False, True),
    ]
    assert all(x.answers == ("stall",) for x in f.fixes)
    rarer = (40 * STEP + 9.6) / (40 * STEP + 9.6 * 5 / interval)
    assert f.predicted_speedup == pytest.approx(rarer, rel=0.05)
    assert f.fixes[0].speedup == f.predicted_speedup
    # No host sampled: the save moved off the step costs the ranks nothing; under the barrier
    # model the job gives back the saves: (4.2 + 9.6) / 4.2 s.
    assert f.fixes[1].speedup == pytest.approx((40 * STEP + 9.6) / (40 * STEP), rel=0.05)
    assert f.evidence["per_rank"]["0"]["period_steps"] == 5


def _busy_host(cores: float, busy: float) -> SampleStore:
    store = SampleStore(job="test", warmup_steps=0)
    host = balanced(2)[0].host
    store.add(Batch(nodes=(NodeCpu(host, 1_000.0, cores, busy, busy),)))
    return store


@pytest.mark.parametrize(
    ("cores", "busy", "taken"),
    [(2.0, 2.0, 0.5), (2.0, 0.8, 0.5), (4.0, 3.5, 0.125), (8.0, 2.0, 0.0)],
)
def test_a_save_moved_off_the_step_still_takes_cpu_from_a_busy_host(
    cores: float, busy: float, taken: float
) -> None:
    # Rank 0 saves 1.2 s every 5 steps. Moved to a thread, the save still needs a core: on a
    # host whose 2 cores are busy it takes 1/2 of its work from the ranks (3 threads share 2
    # cores). The window's busy cores understate a host whose ranks waited through the saves:
    # each working rank keeps a core busy, so 0.8 busy cores of 2 count as 2. Half a core free
    # of 4: an eighth; cores to spare: nothing.
    spec = {0: StallSpec(1.2, every=5, first=3, name="checkpoint")}
    snap = stall_snapshot(balanced(2), spec, steps=40, store=_busy_host(cores, busy))
    f, _ = _one(stall.RULE(snap))
    assert f.fixes[1].lever == "checkpoint_async"
    left = 9.6 * taken
    assert f.fixes[1].speedup == pytest.approx((40 * STEP + 9.6) / (40 * STEP + left), rel=0.05)


def test_an_evaluation_spread_over_every_rank_leaves_each_its_share() -> None:
    # Rank 0 of 4 evaluates 0.8 s every 8 steps; spread over 4 ranks each evaluates 0.2 s.
    snap = stall_snapshot(balanced(4), {0: StallSpec(0.8, every=8, name="evaluation")}, steps=48)
    f, _ = _one(stall.RULE(snap))
    assert f.fixes[0].lever == "evaluation_on_all_ranks"
    stalls = 6 * 0.8
    assert f.predicted_speedup == pytest.approx(
        (48 * STEP + stalls) / (48 * STEP + stalls / 4), rel=0.05
    )


def test_a_stall_that_began_midway_is_judged_on_the_steps_it_slows() -> None:
    # Rank 1 pauses 0.5 s every 10 steps from step 60 of 120: the 70 steps since one period
    # before the first pause hold all 6, and removing them gives back what they cost there,
    # not the whole window's average (120 steps: 1.24x).
    snap = stall_snapshot(balanced(2), {1: StallSpec(0.5, every=10, first=60)}, steps=120)
    f, _ = _one(stall.RULE(snap))
    assert f.evidence["since_stalls_began"] == 50
    assert f.predicted_speedup == pytest.approx((70 * STEP + 3.0) / (70 * STEP), rel=0.05)


def test_a_stall_inside_forward_is_waited_for_in_the_same_step() -> None:
    # Rank 2 of 4 stalls 400 ms in forward every 6 steps: its peers wait at that step's
    # all-reduce. Nothing named it: unnamed work, the rank's own work is the lever.
    specs = balanced(4)
    snap = stall_snapshot(specs, {2: StallSpec(0.4, every=6, where="forward")}, steps=36)
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == (2,)
    s = facts.ranks[2]
    assert (s.work, s.period, s.occurrences) == (None, 6, 6)
    assert _levers(f) == [("rank_work", 2, None, None)]
    assert f.severity in ("warning", "critical")


def test_irregular_stalls_are_named_irregular() -> None:
    # Rank 1 pauses 300 ms now and then (a GC pause, a rank that stalls now and then).
    snap = stall_snapshot(balanced(2), {1: StallSpec(0.3, steps=(7, 19, 23, 41, 44))}, steps=50)
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == (1,)
    s = facts.ranks[1]
    assert (s.period, s.occurrences, s.steps) == (None, 5, (7, 19, 23, 41, 44))
    assert s.work is None


@pytest.mark.parametrize(
    ("name", "lever"),
    [("evaluation", "evaluation_on_all_ranks"), ("logging", "logging_off_step")],
)
def test_the_named_work_picks_the_lever(name: str, lever: str) -> None:
    snap = stall_snapshot(balanced(3), {0: StallSpec(0.5, every=8, name=name)}, steps=48)
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == (0,)
    assert facts.ranks[0].work == name
    assert _levers(f) == [(lever, 0, False, True)]


def test_named_seconds_that_cover_little_of_the_stall_leave_it_unnamed() -> None:
    # 10 ms of logging inside a 500 ms stall: the rest is something the probe did not name.
    stalls = [StallSpec(0.49, every=8), StallSpec(0.01, every=8, name="logging")]
    snap = stall_snapshot(balanced(2), {0: stalls}, steps=48)
    _, facts = _one(stall.RULE(snap))
    assert facts.ranks[0].work is None


def test_a_stall_every_rank_has_alike_is_not_blamed_on_one() -> None:
    # Every rank evaluates 500 ms every 7 steps (a busy but even evaluation on all ranks).
    specs = balanced(4)
    snap = stall_snapshot(
        specs, {r: StallSpec(0.5, every=7, name="evaluation") for r in range(4)}, steps=42
    )
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == ()
    assert facts.ranks == {}
    every = facts.every_rank
    assert isinstance(every, Stall)
    assert (every.work, every.period, every.occurrences) == ("evaluation", 7, 6)
    assert every.peer_wait_s is None
    assert (f.severity, f.predicted_speedup, f.fixes) == ("info", None, ())
    # Nothing in the whole analysis blames a rank for it.
    assert [g.to_dict() for g in analyze(snap) if g.ranks] == []


def test_alike_stalls_one_step_off_on_a_rank_are_still_alike() -> None:
    # Rank 1 reaches the same save one step boundary later (where its loop asks for a batch).
    snap = stall_snapshot(
        balanced(2),
        {0: StallSpec(0.6, every=8, first=2), 1: StallSpec(0.6, every=8, first=3)},
        steps=48,
    )
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == () and facts.every_rank is not None


def test_unequal_stalls_on_every_rank_blame_the_longest() -> None:
    # Both ranks save, rank 0 a full state (1 s), rank 1 a small one (100 ms): rank 1 waits.
    snap = stall_snapshot(
        balanced(2),
        {0: StallSpec(1.0, every=6, name="checkpoint"), 1: StallSpec(0.1, every=6)},
        steps=36,
    )
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == (0,)
    assert facts.ranks[0].peer_wait_s == pytest.approx(0.9, rel=0.05)


@pytest.mark.parametrize("jitter", [0.02, 0.3])
def test_balanced_and_jittery_jobs_give_nothing(jitter: float) -> None:
    for seed in range(3):
        snap = stall_snapshot(balanced(4), {}, steps=60, jitter=jitter, seed=seed)
        assert stall.RULE(snap) == []
    assert stall.RULE(ddp_snapshot(balanced(8), steps=60)) == []


def test_a_starved_rank_is_not_a_stall() -> None:
    # Rank 1 waits 400 ms for a batch every 4 steps (workers delivering in rounds); its peers
    # wait for it at the all-reduce. That is data_starvation's, not a stall.
    snap = stall_snapshot(balanced(2), {1: StallSpec(0.4, every=4, where="data")}, steps=48)
    assert stall.RULE(snap) == []
    assert stall.RULE(ddp_snapshot(starved_rank3(), steps=40)) == []


def test_cheap_or_frequent_spikes_are_not_stalls() -> None:
    # 30 ms every 20 steps: 1.4% of the window.
    cheap = stall_snapshot(balanced(2), {0: StallSpec(0.11, every=20)}, steps=60)
    assert stall.RULE(cheap) == []
    # Every other step: a steadily slower rank (compute_straggler's), not a stall.
    often = stall_snapshot(balanced(2), {0: StallSpec(0.3, every=2, where="forward")}, steps=40)
    assert stall.RULE(often) == []


def test_live_the_finding_appears_with_the_second_occurrence() -> None:
    one = stall_snapshot(balanced(2), {0: StallSpec(1.0, every=10, first=5)}, steps=14)
    assert stall.RULE(one) == []
    # The second save falls in step 15; rank 1 waits for it in step 16.
    two = stall_snapshot(balanced(2), {0: StallSpec(1.0, every=10, first=5)}, steps=17)
    f, facts = _one(stall.RULE(two))
    assert f.ranks == (0,)
    assert (facts.ranks[0].occurrences, facts.ranks[0].period) == (2, 10)


def test_unnamed_stalls_on_an_oversubscribed_host_are_left_to_that_finding() -> None:
    snap = stall_snapshot(balanced(2), {1: StallSpec(0.3, steps=(7, 19, 23, 41))}, steps=50)
    cause = Finding(kind="cpu_oversubscription", severity="warning", ranks=(1,))
    assert stall.RULE(snap, [cause]) == []
    named = stall_snapshot(
        balanced(2), {1: StallSpec(0.3, steps=(7, 19, 23, 41), name="checkpoint")}, steps=50
    )
    assert _one(stall.RULE(named, [cause]))[0].ranks == (1,)


def _with_steps(snap: Snapshot, change: Callable[[StepSample], StepSample]) -> Snapshot:
    ranks = tuple(
        RankView(v.info, tuple(map(change, v.steps)), v.cpu, v.ended, v.memory) for v in snap.ranks
    )
    return Snapshot(job=snap.job, start=snap.start, end=snap.end, ranks=ranks)


def test_silent_on_per_scrape_means_and_unmeasured_waits() -> None:
    snap = stall_snapshot(balanced(2), {0: StallSpec(1.0, every=5)}, steps=30)
    assert stall.RULE(snap)
    # serve's samples stand for a scrape interval's mean step: no single step in them.
    assert stall.RULE(_with_steps(snap, lambda s: replace(s, count=30))) == []
    # Without the collective wait a rank's waiting reads as its own work.
    assert stall.RULE(_with_steps(snap, lambda s: replace(s, collective_wait_s=None))) == []


def test_the_whole_analysis_names_the_checkpointing_rank_and_blames_no_waiter() -> None:
    snap = stall_snapshot(
        balanced(2), {0: StallSpec(1.2, every=5, first=3, name="checkpoint")}, steps=40
    )
    found = analyze(snap)
    stalls = [f for f in found if f.kind == "stall"]
    assert [f.ranks for f in stalls] == [(0,)]
    assert found[0].kind == "stall"
    for f in found:
        assert 1 not in f.ranks, f.to_dict()


def test_a_stalling_rank_that_is_slower_besides_is_also_a_compute_straggler() -> None:
    # Rank 0 computes 30% slower per sample and saves 1.2 s every 4 steps. Alone,
    # compute_straggler would blame it with the saves as its extra local time (the
    # duration-weighted medians lean on the long steps). The stall explains those figures, not
    # the rank's typical step: its forward takes 60 ms against 30 ms in every step, so it is
    # a straggler as well, judged on its typical step (a stall never explains a persistent
    # straggler away).
    specs = with_rank(balanced(2), 0, forward=0.06)
    snap = stall_snapshot(specs, {0: StallSpec(1.2, every=4, first=3, name="checkpoint")}, steps=40)
    (alone,) = RULES["compute_straggler"](snap)
    assert alone.evidence["per_rank"]["0"]["extra_local_ms"] > 500
    found = analyze(snap)
    assert [(f.kind, f.ranks) for f in found] == [("stall", (0,)), ("compute_straggler", (0,))]
    (straggler,) = [f for f in found if f.kind == "compute_straggler"]
    row = straggler.evidence["per_rank"]["0"]
    assert row["phase"] == "forward"
    assert row["phase_ms"] == pytest.approx(60, rel=0.05)
    assert row["peer_phase_ms"] == pytest.approx(30, rel=0.05)
    assert row["extra_local_ms"] == pytest.approx(30, rel=0.1)
    # The speed-up of the compute fix alone: (135 + 4) / (105 + 4) ms, the saves not counted.
    assert straggler.predicted_speedup == pytest.approx(139 / 109, rel=0.03)
    # Without the slower forward the stall explains everything.
    snap = stall_snapshot(
        balanced(2), {0: StallSpec(1.2, every=4, first=3, name="checkpoint")}, steps=40
    )
    assert [(f.kind, f.ranks) for f in analyze(snap)] == [("stall", (0,))]


def test_symmetric_jitter_is_nobodys_stall() -> None:
    # Each rank spikes now and then, the other waiting in turn (a busy host): nobody's stall.
    stalls = {
        0: StallSpec(0.25, steps=(6, 17, 29, 44, 51)),
        1: StallSpec(0.25, steps=(9, 22, 35, 40, 57)),
    }
    assert stall.RULE(stall_snapshot(balanced(2), stalls, steps=60)) == []
    # Named work is not jitter: the probe saw what it was.
    named = {r: replace(s, name="logging") for r, s in stalls.items()}
    found = stall.RULE(stall_snapshot(balanced(2), named, steps=60))
    assert [f.ranks for f in found] == [(0, 1)]


def _recorded(name: str) -> Snapshot:
    rec = read_recording(DATA / name)
    store = SampleStore(job=rec.job, warmup_steps=WARMUP_STEPS)
    store.add(rec.batch)
    now = store.latest_time()
    assert now is not None
    return store.snapshot(now, None)


def test_a_real_checkpoint_on_rank_0_is_named() -> None:
    # torchrun, gloo, 2 ranks: rank 0 saves 64 MiB every 5 steps (tests/data/stall_cpu).
    snap = _recorded("checkpoint_rank0.jsonl")
    f, facts = _one(stall.RULE(snap))
    assert f.ranks == (0,)
    s = facts.ranks[0]
    assert (s.work, s.period) == ("checkpoint", 5)
    assert s.share > 0.2
    # Less often first where an interval is proposed, off the step in any case.
    first = "checkpoint_interval" if s.interval is not None else "checkpoint_async"
    assert f.fixes[0].lever == first
    assert "checkpoint_async" in {x.lever for x in f.fixes}
    found = analyze(snap)
    assert found[0].kind == "stall"
    assert all(1 not in g.ranks for g in found if g.severity != "info")


@pytest.mark.parametrize("name", ["balanced_busy_host_1.jsonl", "balanced_busy_host_2.jsonl"])
def test_a_real_balanced_job_on_a_busy_host_has_no_stall(name: str) -> None:
    assert stall.RULE(_recorded(name)) == []


# --- noise is not a stall -----------------------------------------------------------------------


def noisy_straggler(world: int, slow: int, *, seed: int = 0, steps: int = 80) -> Snapshot:
    """A busy host under a persistent straggler: rank ``slow``'s forward takes 150 ms against
    30 ms on its peers in every step (its peers wait about half their run), and the host
    deschedules each rank now and then for about as long as its own work again (12% of the
    slow rank's steps, 4% of the others'). What read "balanced" on a real CPU job: the stall
    rule took the slow rank's noisy steps for irregular stalls, which explained
    compute_straggler away."""
    rng = random.Random(seed)
    specs = with_rank(balanced(world), slow, forward=0.150)
    stalls = {}
    for r in range(world):
        p = 0.12 if r == slow else 0.04
        at = tuple(k for k in range(steps) if rng.random() < p)
        stalls[r] = StallSpec(0.26 if r == slow else 0.13, steps=at, where="forward")
    return stall_snapshot(specs, stalls, steps=steps, jitter=0.1, seed=seed)


@pytest.mark.parametrize(("world", "slow"), [(2, 1), (8, 5)])
@pytest.mark.parametrize("seed", range(3))
def test_a_noisy_persistent_straggler_is_not_stalling(world: int, slow: int, seed: int) -> None:
    snap = noisy_straggler(world, slow, seed=seed)
    assert stall.RULE(snap) == []
    # The rule that made it so: a rank slower than its peers in most of its steps is a
    # straggler whatever its spread (without it the noisy steps read as stalls, as before).
    assert [f.ranks for f in stall.RULE(snap, straggler_margin=10.0)] == [(slow,)]
    found = analyze(snap)
    assert [(f.kind, f.ranks) for f in found if f.kind in ("stall", "compute_straggler")] == [
        ("compute_straggler", (slow,))
    ]
    (f,) = [f for f in found if f.kind == "compute_straggler"]
    assert f.severity in ("warning", "critical")
    assert f.facts.ranks[slow].phase == "forward"


def test_a_straggler_that_saves_checkpoints_stalls_too() -> None:
    # Named work is a stall on any rank: the probe saw what it was.
    specs = with_rank(balanced(2), 1, forward=0.150)
    snap = stall_snapshot(specs, {1: StallSpec(1.0, every=6, name="checkpoint")}, steps=48)
    found = analyze(snap)
    assert {(f.kind, f.ranks) for f in found if f.kind in ("stall", "compute_straggler")} == {
        ("stall", (1,)),
        ("compute_straggler", (1,)),
    }
    (s,) = [f for f in found if f.kind == "stall"]
    assert (s.facts.ranks[1].work, s.facts.ranks[1].period) == ("checkpoint", 6)


@pytest.mark.parametrize("world", [2, 8])
def test_slow_spells_are_not_separate_stalls(world: int) -> None:
    # Rank 1 is slow for two spells of 5 steps (the host busy for a while): a run of spikes is a
    # slow spell, not stalls; the rule named 10 "irregular stalls" in it before.
    spells = tuple(range(20, 25)) + tuple(range(50, 55))
    snap = stall_snapshot(
        balanced(world), {1: StallSpec(0.3, steps=spells, where="forward")}, steps=80
    )
    assert stall.RULE(snap) == []
    assert [f.ranks for f in stall.RULE(snap, max_run=1000)] == [(1,)]
    # Separate stalls beside a spell are still named: the spell's steps do not count.
    apart = (*spells, 8, 37, 66)
    snap = stall_snapshot(
        balanced(world), {1: StallSpec(0.3, steps=apart, where="forward")}, steps=80
    )
    (f,) = stall.RULE(snap)
    assert f.ranks == (1,) and f.facts.ranks[1].steps == (8, 37, 66)


def test_a_spike_stands_out_of_the_ranks_own_spread() -> None:
    # A rank whose own work wobbles between 10 and 170 ms around 90 ms in a 100 ms step: its
    # wobbles exceed one median step over its median now and then, but not three times its
    # spread (median absolute deviation 40 ms: 59 ms as a standard deviation). A 900 ms pause
    # does, and the pauses do not move the spread they are judged against.
    rng = random.Random(3)
    work = [0.09 + rng.uniform(-0.08, 0.08) for _ in range(60)]
    work[21] = work[44] = 0.99
    rs = stall.RankSteps(
        step=tuple(range(60)),
        step_s=(0.05,) * 60,
        work_s=tuple(work),
        wait_s=(0.0,) * 60,
        outside=(None,) * 60,
    )
    t = stall.Thresholds()
    assert set(stall._spikes(rs, t)) == {21, 44}
    wobbles = set(stall._spikes(rs, replace(t, spread_k=0.0))) - {21, 44}
    assert wobbles  # without the spread, the wobbles above one step (50 ms) counted too


@pytest.mark.parametrize(("world", "rank"), [(2, 1), (8, 3)])
def test_work_in_no_phase_every_step_is_no_stall(world: int, rank: int) -> None:
    from tests.analysis.test_compute_straggler import other_work_snapshot

    snap = other_work_snapshot(world, rank)
    assert stall.RULE(snap) == []
    assert [(f.kind, f.ranks) for f in analyze(snap) if f.kind == "compute_straggler"] == [
        ("compute_straggler", (rank,))
    ]
