"""slowdown: a rank that turned slow at step N, named with when, and what the job lost since.

The other rules judge a window of medians: a rank that was fast for an hour and slow for the
last ten minutes is, to them, whatever the window shows. This rule reads the whole run
(:attr:`Snapshot.history`: each rank's steps folded into at most 512 buckets) as series over
steps and finds the *lasting* changes: a level shift, not one spike and not noise.

Where: the job's step (per bucket, the median over the ranks of their mean step: under the DDP
barrier every rank's step is the job's) is split into segments by binary segmentation. A split
is the best of the rank-based CUSUM (the rank sums either side in standard errors,
Mann-Whitney's statistic: one spike moves a rank by one, whatever its size; its largest falls on
a change, a staircase's too), with at least ``min_segment`` buckets and ``min_segment_s``
seconds on either side, then placed to the bucket (the split that puts the most buckets on
their side of the midpoint between the two levels). It is kept where the two segments' medians
differ by ``min_rise_share`` of the lower, by ``min_z`` robust standard errors (the median
absolute deviation of both segments around their medians), and where it persists:
``persistence`` of the buckets on each side sit on their side of that midpoint. Each kept
segment is split again, at most ``max_changes`` times; buckets of the first ``warmup_steps``
steps are skipped.

Which rank: at a change where the job's step rose and stayed up (no later segment falls back
below the midpoint), each rank's own time (its step less its collective wait: its phases, its
data wait and its time in no phase), as the medians over the segments either side. A rank
whose own time rose by ``min_rise_share`` of the job's step before and by at least
``alike_ratio`` of the largest rise, its own time or the phase of it that moved most
``min_ratio`` times, led the change. Its peers' steps rose too, but only by waiting at the
collectives: a rank that only waits never leads. Where every rank led (all slower together), or
no rank's own time rose (the collectives slowed), no rank is blamed: an ``info`` finding where
the job runs ``min_ratio`` times slower, no speed-up predicted. A rank that got faster and a job
that recovered are no slowdown. A rise across which a rank's batch per step changed (more work
per step by design: ``max_batch_change``) blames no rank either: it is an ``info`` finding that
names the batches (:attr:`Facts.batches`), so that the final verdict still judges the steps
since it on their own (a batch ramp, a rank given a larger batch mid-run: the whole run's
medians mix both paces). Several rises are each named (the largest, and the latest after it).

Per leading rank: the phase that moved most (data wait, h2d, forward, backward, optimizer or
time in no phase), its median before and after; the fix points at that phase (loading for a
data wait, the rank's own work otherwise).

Speed-up: the barrier model (:class:`~auditor.analysis.advisor.Barrier`) over the latest
segment (each rank's median local time there, the least median wait as the floor), with the
leading ranks back at their local time before the change: the job's step now over its step if
they went back to their earlier pace, at most the job's step now over its step before the
change (the slow steps' floor and peers run cheaper than the job will). Named where it is at
least ``min_speedup``; severity from it. Where the ranks' waits were not measured (a builtin
comm hook) a rank's own time cannot be told from its wait: silent, as on an empty history
(``auditor serve``'s windows) and before ``min_steps`` steps after warm-up.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..advisor import Barrier
from ..changes import changes
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..history import Bucket
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "slowdown"
# The figures read per rank and bucket besides the step (per-step means,
# :data:`~auditor.analysis.history.SUMMED` names without ``_s``): the own time (``local``), the
# wait at the collectives, and the parts of the own time a change is placed in (:data:`PHASES`).
LOCAL = "local"
WAIT = "collective_wait"
DATA = "data_wait"
OTHER = "other"
PHASES = (DATA, "h2d", "forward", "backward", "optimizer", OTHER)
# The lever that answers a change in each phase (any other: the rank's own work).
LEVER_OF = {DATA: "loading_cost"}
# Consistency factor of the median of normal noise against its mean (its standard error is
# this much larger), and of the median absolute deviation against the standard deviation.


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps after warm-up a rank needs in its history to be judged with the others
        (a rank that has just joined is left out).
    warmup_steps: steps at the start of the run that are skipped (workers start, caches and
        allocators warm).
    min_segment: buckets a segment needs on either side of a change (one spike, or a few, is
        never a segment).
    min_segment_s: seconds a segment needs on either side of a change (a burst on a busy host
        is not a lasting change).
    min_rise_share: the job's step must change by this share of the lower level, and a leading
        rank's own time rise by this share of the job's step before.
    min_ratio: a leading rank's own time after over before.
    min_z: the change in medians, in robust standard errors of the difference (the best of
        many candidate splits is taken: noise alone reaches 3 to 4).
    persistence: the share of the buckets on each side of a change that sit on their side of
        the midpoint between the two levels (a change, not a drift of a few buckets).
    alike_ratio: ranks whose rise is at least this share of the largest rise lead alike.
    min_speedup: the barrier model's speed-up, were the leaders back at their earlier pace,
        that is worth naming.
    max_changes: changes of the job's step looked for (binary segmentation's splits).
    max_batch_change: a change across which a rank's batch per step changed by more than this
        share is the batch's (more work per step by design), not a slowdown.
    min_lasting_s: seconds a change blamed on ranks must have lasted (from it to the latest
        step) to be more than info: while it lasts, a slow spell of a few seconds on a busy
        host looks like a change (a live verdict's false alarm on a balanced job); a real one
        is a warning seconds later.
    """

    min_steps: int = 8
    warmup_steps: int = 5
    min_segment: int = 12
    min_segment_s: float = 2.0
    min_rise_share: float = 0.1
    min_ratio: float = 1.3
    min_z: float = 5.0
    persistence: float = 2 / 3
    alike_ratio: float = 0.5
    min_speedup: float = 1.1
    max_changes: int = 8
    max_batch_change: float = 0.05
    min_lasting_s: float = 5.0


@dataclass(frozen=True)
class Inputs:
    """The run on one grid of consecutive buckets (the coarsest rank's, warm-up skipped): each
    bucket's first step and the wall-clock times it started and ended, and per rank its steps
    in each grid bucket as one bucket (the rank's own where it coincides, else its buckets
    there folded into one; None where it has none), read as per-step means
    (:meth:`Bucket.mean`). Shared with the snapshot's history: not changed."""

    first_step: tuple[int, ...]
    start: tuple[float, ...]
    end: tuple[float, ...]
    ranks: Mapping[int, tuple[Bucket | None, ...]]
    # The steps of each grid bucket (its rank's): the job's time per step over a segment.
    steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class Change:
    """One rank's change: its own time before and after, and the phase that moved most
    (:data:`PHASES`) with its per-step time before and after, seconds."""

    own_before_s: float
    own_after_s: float
    phase: str
    before_s: float
    after_s: float


@dataclass(frozen=True)
class Facts:
    """A lasting rise of the job's step at ``step`` (its first step at the new pace; ``time``:
    when that step started, wall clock): the job's step before it, right after it and in the
    latest segment (``now_s``), the leading ranks with their change, and, where every rank rose
    alike (none blamed), the median rank's change (``every_rank``)."""

    step: int
    time: float
    before_s: float
    after_s: float
    now_s: float
    ranks: Mapping[int, Change]
    every_rank: Change | None = None
    # The job's time per step (wall time over steps) before the change and in the latest
    # segment: a periodic stall is in it, which the medians leave out.
    before_pace_s: float | None = None
    now_pace_s: float | None = None
    # Ranks whose batch per step changed across the change (samples before, after): the work
    # per step changed by design; no rank is blamed.
    batches: Mapping[int, tuple[float, float]] = field(default_factory=dict)

    @property
    def slowdown(self) -> float:
        """The job's step now over its step before the change."""
        return self.now_s / self.before_s if self.before_s > 0 else 1.0

    @property
    def pace_slowdown(self) -> float:
        """The job's time per step now over before the change (what a fix that takes it back
        to its earlier pace gives in steps per second); the medians' ratio where not known."""
        if self.before_pace_s and self.now_pace_s:
            return self.now_pace_s / self.before_pace_s
        return self.slowdown


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    history = {}
    for r, h in sorted(snapshot.history.items()):
        buckets = h.buckets
        steps = sum(b.steps for b in buckets)
        if sum(b.waits_measured for b in buckets) < 0.5 * steps:
            return None  # no wait measured: a rank's own time cannot be told from its wait
        if sum(b.steps for b in buckets if b.mid_step >= t.warmup_steps) >= t.min_steps:
            history[r] = h
    if not history:
        return None
    grid_of = max(history.values(), key=lambda h: (h.width, h.steps, -h.rank))
    grid = [b for b in grid_of.buckets if b.mid_step >= t.warmup_steps]
    if len(grid) < 2 * t.min_segment:
        return None
    ranks = {r: _aligned(grid, h.buckets) for r, h in history.items()}
    return Inputs(
        first_step=tuple(b.first_step for b in grid),
        start=tuple(b.start for b in grid),
        end=tuple(b.end for b in grid),
        ranks=ranks,
        steps=tuple(b.steps for b in grid),
    )


def _aligned(grid: Sequence[Bucket], buckets: Sequence[Bucket]) -> tuple[Bucket | None, ...]:
    """The rank's steps in each grid bucket: its buckets whose middle step falls in the grid
    bucket's span (from its first step to the next one's: a rank whose history lacks a step
    the grid's has, the FLOP-counting step the store leaves out, say, has its buckets offset
    from the grid's, and each still falls in one), as one (a rank's buckets are never wider
    than the grid's; where they coincide, its own)."""
    out: list[Bucket | None] = []
    j = 0
    bounds = [g.first_step for g in grid[1:]]
    for k, g in enumerate(grid):
        while j < len(buckets) and buckets[j].mid_step < g.first_step:
            j += 1
        folded: Bucket | None = None
        while j < len(buckets) and (k == len(bounds) or buckets[j].mid_step < bounds[k]):
            b = buckets[j]
            if folded is None:
                folded = b
            else:
                if folded is buckets[j - 1]:
                    folded = folded.copy()  # the history's own bucket: never changed
                folded.merge(b)
            j += 1
        out.append(folded if folded is not None and folded.steps else None)
    return tuple(out)


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Place the job's lasting changes; blame the ranks whose own time rose at each rise that
    lasts, or none where every rank rose alike."""
    job = _job(i)
    cuts = changes(job, i.start, i.end, t)
    bounds = [0, *cuts, len(job)]
    levels = [_median(job[a:b]) for a, b in itertools.pairwise(bounds)]
    now = len(levels) - 1
    findings: list[Finding] = []
    for n, cut in enumerate(cuts, start=1):
        before, after = levels[n - 1], levels[n]
        if after <= before:
            continue  # faster, or a recovery
        middle = (before + after) / 2
        if any(level < middle for level in levels[n:]):
            continue  # it went back: no longer slow
        seg_before = (bounds[n - 1], cut)
        seg_after = (cut, bounds[n + 1])
        latest = (bounds[now], bounds[now + 1])
        f = _finding(i, t, cut, before, after, levels[now], seg_before, seg_after, latest)
        if f is not None:
            findings.append(f)
    # A batch ramp rises at each of its steps: the latest says where the job's pace is now.
    # (Cuts come in order, so the last is the latest.)
    ramps = [f for f in findings if isinstance(f.facts, Facts) and f.facts.batches]
    return [f for f in findings if not any(f is r for r in ramps[:-1])]


def _job(i: Inputs) -> list[float]:
    """The job's step per bucket: the median over the ranks of their mean step there."""
    out = []
    for k in range(len(i.first_step)):
        steps = [b.mean("step_s") for col in i.ranks.values() if (b := col[k]) is not None]
        out.append(statistics.median(steps) if steps else math.nan)
    # A bucket no rank has (never on a grid of a rank's own buckets): the previous level.
    for k, v in enumerate(out):
        if math.isnan(v):
            out[k] = out[k - 1] if k else next((x for x in out if not math.isnan(x)), 0.0)
    return out


def _finding(
    i: Inputs,
    t: Thresholds,
    cut: int,
    before: float,
    after: float,
    now: float,
    seg_before: tuple[int, int],
    seg_after: tuple[int, int],
    latest: tuple[int, int],
) -> Finding | None:
    """The finding of one lasting rise: its leading ranks (or every rank alike), with the
    barrier model's speed-up were the leaders back at their pace before it."""
    step, time = i.first_step[cut], i.start[cut]
    evidence: dict[str, object] = {
        "step": step,
        "time": round(time, 3),
        "job_before_ms": _ms(before),
        "job_after_ms": _ms(after),
        "job_now_ms": _ms(now),
        "slowdown": round(now / before, 3) if before > 0 else None,
    }
    batches = {
        r: ab for r, col in i.ranks.items() if (ab := _batch_change(col, seg_before, seg_after, t))
    }
    if batches:
        # The work per step changed by design (a batch ramp), not the pace: told, never blamed.
        evidence["batch_per_step"] = {str(r): list(ab) for r, ab in sorted(batches.items())}
        evidence["speedup_model"] = "not_predicted"
        facts = Facts(step, time, before, after, now, {}, None, _pace(i, seg_before),
                      _pace(i, latest), batches)  # fmt: skip
        return Finding(kind=KIND, severity="info", ranks=(), facts=facts, evidence=evidence)
    own: dict[int, tuple[float, float]] = {}
    for r, col in i.ranks.items():
        a, b = _level(col, LOCAL, seg_before), _level(col, LOCAL, seg_after)
        if a is not None and b is not None:
            own[r] = (a, b)
    if not own:
        return None
    top = max(b - a for a, b in own.values())
    floor = t.min_rise_share * before
    leaders = {
        r: c
        for r, (a, b) in own.items()
        if b - a >= floor
        and b - a >= t.alike_ratio * top
        and _clear(c := _change(i.ranks[r], a, b, seg_before, seg_after), t)
    }
    if top >= floor and not leaders:
        return None  # own times rose, each too little to be sure of: nothing said
    if leaders and len(leaders) < len(own):
        local_now = {
            r: v for r, col in i.ranks.items() if (v := _level(col, LOCAL, latest)) is not None
        }
        waits = [v for col in i.ranks.values() if (v := _level(col, WAIT, latest)) is not None]
        barrier = Barrier(local_now, min(waits, default=0.0))
        speedup = barrier.speedup({r: c.own_before_s for r, c in leaders.items()})
        if before > 0:
            # The leaders back at their earlier pace take the job back to its step before the
            # change, not past it: the barrier model's floor and the peers' times were read
            # from the slow steps, which run cheaper than the job will (a peer that waits
            # frees the host's cores for the others).
            speedup = min(speedup, max(1.0, now / before))
        if speedup < t.min_speedup:
            return None
        evidence["per_rank"] = {str(r): _evidence(c) for r, c in sorted(leaders.items())}
        evidence["speedup_model"] = "barrier"
        fixes = tuple(
            Fix(LEVER_OF.get(c.phase, "rank_work"), r, None, None, speedup, (KIND,))
            for r, c in sorted(leaders.items())
        )
        lasted = i.end[latest[1] - 1] - time
        evidence["lasted_s"] = round(lasted, 2)
        return Finding(
            kind=KIND,
            severity=severity_for(speedup) if lasted >= t.min_lasting_s else "info",
            ranks=tuple(sorted(leaders)),
            facts=Facts(
                step,
                time,
                before,
                after,
                now,
                dict(leaders),
                before_pace_s=_pace(i, seg_before),
                now_pace_s=_pace(i, latest),
            ),
            evidence=evidence,
            predicted_speedup=speedup,
            fixes=fixes,
        )
    # Every rank rose alike, or no rank's own time rose (the collectives slowed: the wait is the
    # phase that moved): named where the job itself turned ``min_ratio`` times slower.
    if now < t.min_ratio * before:
        return None
    every = _median_change(i, seg_before, seg_after)
    evidence["every_rank"] = _evidence(every)
    evidence["speedup_model"] = "not_predicted"
    return Finding(
        kind=KIND,
        severity="info",
        ranks=(),
        facts=Facts(
            step, time, before, after, now, {}, every, _pace(i, seg_before), _pace(i, latest)
        ),
        evidence=evidence,
    )


def _pace(i: Inputs, seg: tuple[int, int]) -> float | None:
    """The job's time per step over the grid buckets ``seg``: their wall time over their
    steps (the grid's rank waits for the others at every step); None where not known."""
    a, b = seg
    n = sum(i.steps[a:b])
    return (i.end[b - 1] - i.start[a]) / n if n and b > a else None


def _change(
    col: Sequence[Bucket | None],
    own_before: float,
    own_after: float,
    before: tuple[int, int],
    after: tuple[int, int],
) -> Change:
    """A rank's change: its own time either side, and its phase that moved most over the
    segments either side."""
    moved = [(0.0, OTHER, 0.0, 0.0)]
    for phase in PHASES:
        a, b = _level(col, phase, before), _level(col, phase, after)
        if a is not None and b is not None:
            moved.append((b - a, phase, a, b))
    _, phase, a, b = max(moved)
    return Change(own_before, own_after, phase, a, b)


def _batch_change(
    col: Sequence[Bucket | None], before: tuple[int, int], after: tuple[int, int], t: Thresholds
) -> tuple[float, float] | None:
    """The rank's batch per step before and after the change where it differs by
    ``max_batch_change`` (and is known on both sides); None otherwise."""
    a, b = _batch(col, before), _batch(col, after)
    if a is None or b is None or abs(b - a) <= t.max_batch_change * min(a, b):
        return None
    return (a, b)


def _batch(col: Sequence[Bucket | None], seg: tuple[int, int]) -> float | None:
    values = [v for b in col[seg[0] : seg[1]] if b is not None and (v := b.batch) is not None]
    return statistics.median(values) if values else None


def _clear(c: Change, t: Thresholds) -> bool:
    """Whether the rank's own time, or the phase of it that moved most, rose ``min_ratio``
    times."""
    return c.own_after_s >= t.min_ratio * c.own_before_s or c.after_s >= t.min_ratio * c.before_s


def _median_change(i: Inputs, before: tuple[int, int], after: tuple[int, int]) -> Change:
    """The change the median rank saw, phase by phase (the wait at the collectives included:
    a slower collective slows every rank alike)."""

    def median_level(name: str, seg: tuple[int, int]) -> float:
        levels = [v for col in i.ranks.values() if (v := _level(col, name, seg)) is not None]
        return statistics.median(levels) if levels else 0.0

    moved = [(median_level(p, after) - median_level(p, before), p) for p in (*PHASES, WAIT)]
    _, phase = max(moved)
    return Change(
        median_level(LOCAL, before),
        median_level(LOCAL, after),
        phase,
        median_level(phase, before),
        median_level(phase, after),
    )


def _level(col: Sequence[Bucket | None], name: str, seg: tuple[int, int]) -> float | None:
    """The median over the buckets ``seg`` of a rank's figure per step (None: no bucket
    there)."""
    field = name + "_s"
    values = [getattr(b, field) / b.steps for b in col[seg[0] : seg[1]] if b is not None]
    return statistics.median(values) if values else None


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 2)


def _evidence(c: Change) -> dict[str, object]:
    return {
        "own_before_ms": _ms(c.own_before_s),
        "own_after_ms": _ms(c.own_after_s),
        "phase": c.phase,
        "before_ms": _ms(c.before_s),
        "after_ms": _ms(c.after_s),
    }


RULE = Rule(
    kind=KIND,
    place=48,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
)
