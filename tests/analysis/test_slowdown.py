"""slowdown: a rank that turned slow is named with the step and time it changed at, before and
after, and what the job lost since; one spike, noise, a slowdown every rank has alike, a rank
that only waits and a rank that got faster are not blamed.

The runs are series of real :class:`StepSample` rows under the DDP barrier (each rank's own work,
then the wait for the slowest at the all-reduce), folded into each rank's
:class:`RankHistory` as the sample store does."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.history import RankHistory
from auditor.analysis.rules import slowdown
from auditor.analysis.rules.slowdown import Facts
from auditor.analysis.snapshot import Snapshot
from auditor.audit import Audit
from auditor.samples import StepSample
from auditor.telemetry.recorded import read_recording

# Every rank's own work per step: data 1 + h2d 5 + forward 30 + backward 60 + optimizer 5 ms;
# the all-reduce costs 4 ms.
BASE = {"data_wait": 0.001, "h2d": 0.005, "forward": 0.030, "backward": 0.060, "optimizer": 0.005}
COMM = 0.004
START = 1_700_000_000.0
DATA = Path(__file__).resolve().parents[1] / "data"

Phases = Mapping[str, float]


def run(
    world: int,
    steps: int,
    phases: Callable[[int, int], Phases] = lambda r, k: BASE,
    *,
    jitter: float = 0.02,
    comm: Callable[[int], float] = lambda k: COMM,
    seed: int = 0,
    max_buckets: int = 512,
    wait: bool = True,
    batch: Callable[[int], int] = lambda k: 32,
) -> Snapshot:
    """``steps`` steps of ``world`` ranks, each rank's phases at step ``k`` given by
    ``phases(rank, k)`` (each with multiplicative jitter), as a snapshot holding only the
    ranks' histories (what the rule reads)."""
    rng = random.Random(seed)
    rows: dict[int, list[StepSample]] = {r: [] for r in range(world)}
    now = START
    for k in range(steps):
        own = [
            {n: v * (1 + rng.uniform(-jitter, jitter)) for n, v in phases(r, k).items()}
            for r in range(world)
        ]
        local = [sum(p.values()) for p in own]
        step_s = max(local) + comm(k)
        now += step_s
        for r, p in enumerate(own):
            rows[r].append(
                StepSample(
                    rank=r,
                    step=k,
                    time=now,
                    step_s=step_s,
                    data_wait_s=p["data_wait"],
                    h2d_s=p["h2d"],
                    forward_s=p["forward"],
                    backward_s=p["backward"],
                    optimizer_s=p["optimizer"],
                    collective_wait_s=step_s - local[r] if wait else None,
                    batch_size=batch(k),
                )
            )
    history = {r: RankHistory.of(r, s, max_buckets=max_buckets) for r, s in rows.items()}
    return Snapshot(job="test", start=START, end=now, ranks=(), history=history)


def slower(rank: int, at: int, **phases: float) -> Callable[[int, int], Phases]:
    """``rank``'s phases changed to ``phases`` from step ``at`` on."""
    changed = {**BASE, **phases}
    return lambda r, k: changed if r == rank and k >= at else BASE


def _one(findings: list[Finding]) -> tuple[Finding, Facts]:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    (f,) = findings
    assert isinstance(f.facts, Facts)
    return f, f.facts


def _started(snap: Snapshot, step: int) -> float:
    """When ``step`` started (wall clock), from rank 0's history."""
    (b,) = [b for b in snap.history[0].buckets if b.first_step == step]
    return b.start


@pytest.mark.parametrize("world", [2, 8])
def test_a_shift_on_rank_1_is_found_at_its_step(world: int) -> None:
    # Rank 1's forward goes from 30 to 150 ms at step 180 of 300: the job from 105 to 225 ms.
    snap = run(world, 300, slower(1, 180, forward=0.150))
    f, facts = _one(slowdown.RULE(snap))
    assert f.ranks == (1,)
    assert facts.step == 180
    assert facts.time == pytest.approx(_started(snap, 180))
    c = facts.ranks[1]
    assert c.phase == "forward"
    assert c.before_s == pytest.approx(0.030, rel=0.02)
    assert c.after_s == pytest.approx(0.150, rel=0.02)
    assert c.own_before_s == pytest.approx(0.101, rel=0.03)
    assert c.own_after_s == pytest.approx(0.221, rel=0.03)
    # The job's step before and since: every rank's step rose (the others' by waiting).
    assert facts.before_s == pytest.approx(0.105, rel=0.03)
    assert facts.now_s == pytest.approx(0.225, rel=0.03)
    assert facts.slowdown == pytest.approx(225 / 105, rel=0.04)
    # Back at its earlier pace, the job gives the time back (barrier model).
    assert f.predicted_speedup == pytest.approx(225 / 105, rel=0.04)
    assert f.severity == "critical"
    assert [(x.lever, x.rank, x.answers) for x in f.fixes] == [("rank_work", 1, ("slowdown",))]
    assert f.evidence["step"] == 180 and f.evidence["per_rank"]["1"]["phase"] == "forward"


def test_the_engine_runs_it_and_a_rank_that_only_waits_is_not_blamed() -> None:
    # Rank 0's step rose as much as rank 1's, all of it waiting at the all-reduce.
    snap = run(2, 300, slower(1, 150, backward=0.200))
    found = [f for f in analyze(snap) if f.kind == "slowdown"]
    f, facts = _one(found)
    assert f.ranks == (1,) and 0 not in facts.ranks
    assert facts.ranks[1].phase == "backward"


def test_a_slower_collective_blames_no_rank() -> None:
    # The all-reduce goes from 4 to 100 ms at step 150: every rank waits longer, none works more.
    snap = run(4, 300, comm=lambda k: COMM if k < 150 else 0.100)
    f, facts = _one(slowdown.RULE(snap))
    assert f.ranks == () and f.severity == "info" and f.predicted_speedup is None
    assert facts.step == 150
    assert facts.every_rank is not None and facts.every_rank.phase == "collective_wait"


def test_a_shift_alike_on_every_rank_blames_none() -> None:
    snap = run(4, 300, lambda r, k: {**BASE, "forward": 0.030 if k < 200 else 0.120})
    f, facts = _one(slowdown.RULE(snap))
    assert f.ranks == () and f.severity == "info" and not f.fixes
    assert facts.step == 200
    assert facts.every_rank is not None and facts.every_rank.phase == "forward"
    assert facts.slowdown == pytest.approx(195 / 105, rel=0.05)


def test_one_spike_is_not_a_shift() -> None:
    # Rank 1 takes 3 s in three steps in a row (a garbage-collection pause, a checkpoint): a
    # spike, not a change; nor is it one at the end of the run.
    for at in (150, 295):
        spiked = {**BASE, "forward": 3.0}
        spike = lambda r, k: spiked if r == 1 and at <= k < at + 3 else BASE  # noqa: E731, B023
        assert slowdown.RULE(run(2, 300, spike)) == [], at


def test_noisy_steps_are_not_a_shift() -> None:
    # Every phase of every rank varies by up to +-60% from step to step (a busy host).
    for seed in range(5):
        snap = run(2, 400, jitter=0.6, seed=seed)
        assert slowdown.RULE(snap) == [], seed


def test_heavy_tailed_noise_on_one_rank_is_not_a_shift() -> None:
    # Rank 1's forward is 30 ms in most steps and 5x that in a random tenth of them, all run.
    rng = random.Random(3)
    slow = {**BASE, "forward": 0.150}
    snap = run(2, 400, lambda r, k: slow if r == 1 and rng.random() < 0.1 else BASE)
    assert slowdown.RULE(snap) == []


def test_a_rank_that_got_faster_is_not_a_slowdown() -> None:
    # Rank 1 was the straggler (forward 150 ms) and is as fast as rank 0 from step 150 on.
    fast = lambda r, k: {**BASE, "forward": 0.150} if r == 1 and k < 150 else BASE  # noqa: E731
    assert slowdown.RULE(run(2, 300, fast)) == []


def test_a_slowdown_that_went_away_is_not_named() -> None:
    def episode(r: int, k: int) -> Phases:
        return {**BASE, "forward": 0.150} if r == 1 and 100 <= k < 200 else BASE

    assert slowdown.RULE(run(2, 300, episode)) == []


def test_warm_up_is_skipped_and_a_short_run_is_not_judged() -> None:
    # Slow first steps (workers starting, allocators warming) are not a change.
    warm = lambda r, k: {**BASE, "forward": 0.5} if k < 5 else BASE  # noqa: E731
    assert slowdown.RULE(run(2, 200, warm)) == []
    # Too few buckets after the change to call it lasting: not yet.
    assert slowdown.RULE(run(2, 160, slower(1, 155, forward=0.150))) == []


def test_the_latest_shift_after_the_largest_is_named_too() -> None:
    def twice(r: int, k: int) -> Phases:
        if r != 1 or k < 150:
            return BASE
        return {**BASE, "forward": 0.250 if k < 300 else 0.350}

    findings = slowdown.RULE(run(2, 450, twice))
    assert [(f.ranks, f.facts.step) for f in findings] == [((1,), 150), ((1,), 300)]
    first, latest = (f.facts for f in findings)
    # Both measured against the job now; each against the job's step before it.
    assert first.now_s == latest.now_s
    assert first.slowdown > latest.slowdown > 1.2
    assert findings[0].predicted_speedup > findings[1].predicted_speedup  # type: ignore[operator]


def test_a_long_run_folded_into_buckets_places_the_change_within_a_bucket() -> None:
    # 3,000 steps in at most 64 buckets per rank (64 steps wide): the change within one.
    snap = run(2, 3000, slower(1, 2003, forward=0.150), max_buckets=64)
    assert snap.history[0].width == 64
    f, facts = _one(slowdown.RULE(snap, min_segment_s=0.0))
    assert f.ranks == (1,)
    assert abs(facts.step - 2003) <= 64


def test_ranks_folded_to_different_widths_are_read_on_one_grid() -> None:
    # Rank 0's history is folded twice as wide as rank 1's (buckets of 2 and 1 steps).
    snap = run(2, 300, slower(1, 180, forward=0.150))
    snap.history[0] = RankHistory.of(0, _steps(snap, 0), max_buckets=256)
    assert (snap.history[0].width, snap.history[1].width) == (2, 1)
    f, facts = _one(slowdown.RULE(snap))
    assert f.ranks == (1,) and facts.step == 180


def test_a_rank_whose_history_lacks_a_step_is_still_read_after_it() -> None:
    # Rank 1's step 181 is not in its history (the store leaves out the step whose FLOPs the
    # probe counted), so once folded two steps a bucket its buckets are offset by one from
    # rank 0's (the grid's) from there on; each still falls in one grid bucket (read off the
    # grid, rank 1 had no step after step 181, and the job's step was rank 0's alone).
    snap = run(2, 300, slower(1, 200, forward=0.150))
    steps = {r: _steps(snap, r) for r in (0, 1)}
    steps[1] = [s for s in steps[1] if s.step != 181]
    snap.history = {r: RankHistory.of(r, s, max_buckets=256) for r, s in steps.items()}
    assert snap.history[1].width == 2
    inputs = slowdown.measure(snap, slowdown.Thresholds())
    assert inputs is not None and None not in inputs.ranks[1]
    f, facts = _one(slowdown.RULE(snap))
    assert f.ranks == (1,) and facts.step == 200 and facts.ranks[1].phase == "forward"


def _steps(snap: Snapshot, rank: int) -> list[StepSample]:
    """The steps back from a history of single-step buckets."""
    out = []
    for b in snap.history[rank].buckets:
        assert b.steps == 1
        out.append(
            StepSample(
                rank=rank,
                step=b.first_step,
                time=b.end,
                step_s=b.step_s,
                data_wait_s=b.data_wait_s,
                h2d_s=b.h2d_s,
                forward_s=b.forward_s,
                backward_s=b.backward_s,
                optimizer_s=b.optimizer_s,
                collective_wait_s=b.collective_wait_s,
            )
        )
    return out


def test_silent_without_history_or_without_measured_waits() -> None:
    assert slowdown.RULE(Snapshot(job="test", start=0.0, end=1.0, ranks=())) == []
    # The wait not measured (a builtin comm hook): own time cannot be told from waiting.
    assert slowdown.RULE(run(2, 300, slower(1, 150, forward=0.150), wait=False)) == []


def test_a_data_wait_that_rose_points_at_loading() -> None:
    snap = run(2, 300, slower(1, 150, data_wait=0.100))
    f, facts = _one(slowdown.RULE(snap))
    assert f.ranks == (1,) and facts.ranks[1].phase == "data_wait"
    assert [x.lever for x in f.fixes] == ["loading_cost"]


def test_a_larger_batch_is_told_never_blamed() -> None:
    # Every rank's batch doubles at step 150 (a batch ramp), and its step with it: no rank is
    # blamed and nothing is predicted, but the change is placed (the final verdict judges the
    # steps since it on their own).
    double = lambda r, k: {n: v * (2 if k >= 150 else 1) for n, v in BASE.items()}  # noqa: E731
    snap = run(2, 300, double, batch=lambda k: 64 if k >= 150 else 32)
    f, facts = _one(slowdown.RULE(snap))
    assert f.severity == "info" and f.ranks == () and f.predicted_speedup is None
    assert f.fixes == ()
    assert facts.step == 150 and facts.time == _started(snap, 150)
    assert facts.batches == {0: (32, 64), 1: (32, 64)}
    assert facts.ranks == {} and facts.every_rank is None
    assert f.evidence["batch_per_step"] == {"0": [32, 64], "1": [32, 64]}


def test_a_batch_ramp_is_told_once_at_its_latest_rise() -> None:
    # Batch 32 -> 48 -> 64 at steps 100 and 200, the step with it: one finding, the latest.
    def ramp(k: int) -> int:
        return 32 + 16 * min(2, k // 100)

    grown = lambda r, k: {n: v * ramp(k) / 32 for n, v in BASE.items()}  # noqa: E731
    snap = run(2, 300, grown, batch=ramp)
    f, facts = _one(slowdown.RULE(snap))
    assert f.severity == "info" and facts.step == 200
    assert facts.batches == {0: (48, 64), 1: (48, 64)}


def test_a_rank_switched_to_a_larger_batch_is_told_as_a_batch_change() -> None:
    # torchrun, gloo, 2 ranks (tests/data/uneven_batch_switch): rank 1 switches to a loader of
    # twice the batch at step 408, its first step at the new shape (409) counted its FLOPs and
    # is not in its history. Read off the grid, rank 1's history ended at its switch step (37 ms
    # of worker start-up outside the phases), and the final verdict blamed it for a slowdown
    # "outside the phases, 0.6 -> 19 ms" (a warning) rather than its batch.
    rec = read_recording(DATA / "uneven_batch_switch" / "recording.jsonl")
    audit = Audit(rec.job)
    audit.add(rec.batch)
    _, findings = audit.final()
    warned = {(f.kind, f.ranks) for f in findings if f.severity != "info"}
    assert warned == {("batch_split", (1,)), ("utilization_imbalance", (1,))}, findings
    (f,) = [f for f in findings if f.kind == "slowdown"]
    assert isinstance(f.facts, Facts) and f.ranks == ()
    assert f.facts.batches == {1: (32, 64)} and abs(f.facts.step - 409) <= 2
