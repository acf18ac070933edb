"""stall: one rank's own work spikes, every few steps or now and then, while its peers wait.

The per-rank medians every other rule reads describe a typical step, and a stall is not one: a
rank that saves a full checkpoint inline every 10 steps, runs an evaluation alone, gathers
metrics or pauses for garbage collection is as fast as its peers in most steps, and in the few
others its peers wait for it at the next collective. A third of the run can go there while the
medians call the job balanced. So this rule reads the raw per-step samples of the window.

Metric, per rank and step: the rank's own work, ``step_s - data_wait_s - collective_wait_s``
(its phases and its time in no phase: ``other_s``, where a checkpoint or a logging call lands).

Noise is not a stall: a stall is a rare, large, separate spike.

* *Large*: a step spikes where its own work exceeds the rank's median by ``min_spike_ratio`` of
  its median step, by ``min_spike_s``, and by ``spread_k`` times the spread of its own work
  (the median absolute deviation, as a standard deviation: robust to the spikes it looks for,
  which leave it where the ordinary steps put it). A rank whose every step wobbles does not
  stall at its wobbles.
* *Rare*: a rank spiking in more than ``max_spike_ratio`` of its steps is steadily slow
  (compute_straggler's), not stalling.
* *Separate*: spikes in a run of more than ``max_run`` consecutive steps are a slow spell (a
  busy host for a while, a rank that turned slow), not a stall: none of them counts.
* A rank that is slower than its peers in most of its steps (its median own work past its
  peers' median by ``straggler_margin`` of its median step) is a straggler whatever its spread:
  its unnamed spikes are the tail of its slowness on a busy host, never a stall
  (compute_straggler names it). Named work (a checkpoint the probe saw) is a stall on any rank.

Attribution, per step ``k`` with spikes: the ranks whose spike is at least ``alike_ratio`` of
the largest are its leaders.

* Every rank leads (at ``k``, or one step off, where the step boundary fell elsewhere on it): the
  stall is every rank's alike (each rank's own evaluation, a checkpoint every rank writes). Nobody
  waits for one rank, so none is blamed: an ``info`` finding with no rank, its share of the window
  and no speed-up predicted.
* Otherwise the leaders are blamed for that occurrence where the others waited for them at the
  next collective: the median of their rise in collective wait (over their median), in step ``k``
  (a collective later in that step: the all-reduce after a stall in forward, a broadcast the
  loop calls after a save) or ``k + 1`` (the next step's all-reduce after a save that follows
  the optimizer step), is at least ``min_wait_share`` of the leaders' spike. A spike nobody
  waited for did not hold the job back.

A rank is named once its window holds ``min_occurrences`` blamed occurrences that cost at least
``min_share`` of its wall time in the window, and the job would gain ``min_speedup`` without
them. Ordinary jitter on a busy host spikes every rank now and then, each waiting for the other
in turn: unnamed stalls are named only where they take ``noise_ratio`` times the share its peers'
own spikes take. Its period is the steps between occurrences where
they are even (every gap within one step, or a tenth, of a whole multiple of the median gap: a
stall too short to count leaves a double gap), otherwise irregular. What the work was comes from
``StepSample.outside`` (seconds the probe saw in named work: checkpoint, evaluation, logging)
where the named seconds of its occurrences cover at least half of their cost; unnamed otherwise.

Data waits are not own work, nor is creating an iterator that starts a loader's workers
(``StepSample.outside["loader_start"]``: loading, as its first batch's wait is), so a starved
rank (data_starvation's) never spikes here, and a rank that only waits is never blamed. Where
a rank's collective wait was not measured its waits would read as work: the rule stays silent.
Unnamed stalls of a rank whose host is oversubscribed (cpu_oversubscription explains it) are
that finding's, not a stall's. ``auditor serve``'s samples are per-scrape means (``count`` > 1)
that hold no single step: silent there too.

Speed-up: the barrier model (:class:`~auditor.analysis.advisor.Barrier`) over the mean local
time per step since the stalls began (one period before the first: a stall that began midway
is judged against the steps it slows), each blamed rank's lever moved: unnamed work and logging
gone; an evaluation spread over every rank, each carrying its share; a periodic checkpoint
saved less often (the interval that keeps it to ``target_share``), each save's cost once per
interval: the first lever where one is proposed, since its effect is what it saves. Saving off
the step instead gets its own figure: the save still takes from the ranks what a CPU-bound
thread takes from a host whose cores are busy, and how much more it takes (a thread of the
training process holds the interpreter's lock while it pickles) depends on how it runs.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

from ..advisor import Barrier
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..measures import NOT_PREDICTED, PeerMedians, robust_spread
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "stall"
# The named work ``StepSample.outside`` may report, and the lever that answers each.
CHECKPOINT = "checkpoint"
EVALUATION = "evaluation"
LOGGING = "logging"
# Not a stall's: loading (data_starvation reads the starts).
LOADER_START = "loader_start"
LEVER_OF = {
    CHECKPOINT: "checkpoint_async",
    EVALUATION: "evaluation_on_all_ranks",
    LOGGING: "logging_off_step",
}


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_occurrences: stalls the window must hold before a rank is named (live: the second).
    min_spike_ratio: a step's own work above the rank's median, as a share of its median step,
        that counts as a spike.
    min_spike_s: the least excess, in seconds, that counts as a spike.
    max_spike_ratio: a rank spiking in more of its steps than this is steadily slow, not
        stalling.
    alike_ratio: ranks spiking at least this share of the step's largest spike stall alike.
    min_wait_share: the others' rise in collective wait, as a share of the leaders' spike, that
        says they waited for it.
    min_share: the stalls' share of the rank's wall time in the window that is worth naming.
    min_speedup: the barrier model's speed-up without the stalls that is worth naming.
    noise_ratio: unnamed stalls must take this many times the share its peers' own spikes take
        (ordinary jitter on a busy host spikes every rank alike, now one, now another).
    target_share: the share of the run a checkpoint should cost; the proposed interval keeps it.
    spread_k: a spike exceeds the rank's median own work by at least this many times the
        spread of its own work (median absolute deviation, as a standard deviation).
    max_run: spikes in a run of more consecutive steps than this are a slow spell, not stalls.
    straggler_margin: a rank whose median own work exceeds its peers' median by this share of
        its median step is slower in most of its steps: a straggler, whose unnamed spikes are
        not stalls.
    """

    min_steps: int = 8
    min_occurrences: int = 2
    min_spike_ratio: float = 1.0
    min_spike_s: float = 0.02
    max_spike_ratio: float = 0.4
    alike_ratio: float = 0.5
    min_wait_share: float = 0.5
    min_share: float = 0.05
    min_speedup: float = 1.02
    noise_ratio: float = 2.0
    target_share: float = 0.05
    spread_k: float = 3.0
    max_run: int = 2
    straggler_margin: float = 0.10


@dataclass(frozen=True)
class RankSteps:
    """One rank's steps in the window, in step order, as columns: step numbers, durations, own
    work (step less data wait and collective wait), collective wait (0 where a step saw none)
    and the named work outside the phases (None where nothing named)."""

    step: tuple[int, ...]
    step_s: tuple[float, ...]
    work_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    outside: tuple[Mapping[str, float] | None, ...]


@dataclass(frozen=True)
class Inputs:
    """Each ready rank's steps in the window, and its host's ``(cores, busy cores)`` while every
    rank there works (:func:`_working`), where the host was sampled: what a save moved off the
    step still takes from the ranks there."""

    ranks: Mapping[int, RankSteps]
    host_cpu: Mapping[int, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Stall:
    """A rank's stalls (or every rank's alike) in the window.

    ``work``: what the probe named it (:data:`CHECKPOINT`, :data:`EVALUATION`, :data:`LOGGING`;
    None: unnamed work); ``period``: steps between stalls (None: irregular); ``cost_s``: the
    median extra time of one stall; ``share``: all of them against the wall time of the window;
    ``steps``: the steps they fell in; ``peer_wait_s``: the median time the peers waited for one
    (None where every rank stalls alike); ``interval``: for a periodic checkpoint, the interval
    that would keep its cost to the target share (None: none proposed)."""

    work: str | None
    occurrences: int
    period: int | None
    cost_s: float
    share: float
    steps: tuple[int, ...]
    peer_wait_s: float | None = None
    interval: int | None = None


@dataclass(frozen=True)
class Facts:
    """The blamed ranks and their stalls; or, with no rank blamed, the stall every rank has
    alike (``every_rank``)."""

    ranks: Mapping[int, Stall]
    every_rank: Stall | None = None


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    for view in snapshot.ranks:
        if view.steps:
            if view.steps[0].count > 1:
                return None  # serve: per-scrape means, no single step to see a stall in
            break
    stats = snapshot.ready(t.min_steps)
    if len(stats) < 2 or any(s.collective_wait_s is None for s in stats.values()):
        return None
    views = snapshot.view_of
    ranks: dict[int, RankSteps] = {}
    spiking = False
    for r in sorted(stats):
        rows = sorted(map(_ROW, views[r].steps), key=itemgetter(0))
        step, step_s, data, wait, outside = zip(*rows, strict=True)
        waits = tuple(w or 0.0 for w in wait)
        # Creating an iterator that starts the loader's workers is loading, as the data wait
        # is: not the rank's own work.
        loading = tuple(
            d + (o or _NONE).get(LOADER_START, 0.0) for d, o in zip(data, outside, strict=True)
        )
        work = tuple(max(0.0, s - d - w) for s, d, w in zip(step_s, loading, waits, strict=True))
        ranks[r] = RankSteps(step, step_s, work, waits, outside)
        # Cheap screen (decide's threshold): a rank whose largest step is no spike has none.
        floor = max(t.min_spike_ratio * statistics.median(step_s), t.min_spike_s)
        spiking = spiking or max(work) - statistics.median(work) >= floor
    if not spiking:
        return None
    hosts = snapshot.hosts()
    cpu = {h: _working(snapshot.host_cpu(h), len(hosts.get(h, ()))) for h in hosts}
    host_cpu = {r: c for r in ranks if (c := cpu.get(views[r].info.host)) is not None}
    return Inputs(ranks, host_cpu)


def _working(cpu: tuple[float, float] | None, ranks: int) -> tuple[float, float] | None:
    """A host's ``(cores, busy cores)`` while every rank on it works: at least a core per rank
    (a stall leaves its peers waiting, idle, so the window's busy cores understate it), at most
    its cores."""
    if cpu is None:
        return None
    cores, busy = cpu
    return cores, min(cores, max(busy, float(ranks)))


# A step's figures in the order measure reads them (sorted by step number).
_ROW = attrgetter("step", "step_s", "data_wait_s", "collective_wait_s", "outside")
_NONE: Mapping[str, float] = {}


@dataclass(frozen=True)
class _Occurrence:
    step: int
    excess: Mapping[int, float]  # each leader's extra own work
    peer_wait_s: float | None  # the others' median rise in wait; None: every rank alike


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Name the ranks whose spikes the others wait for; report a stall every rank has alike
    without blaming one."""
    ranks = sorted(i.ranks)
    spikes = {r: _spikes(i.ranks[r], t) for r in ranks}
    blamed, alike = _occurrences(i, ranks, spikes, t)
    findings: list[Finding] = []
    stalls: dict[int, Stall] = {}
    noise = PeerMedians(
        {r: sum(spikes[r].values()) / (sum(i.ranks[r].step_s) or 1.0) for r in ranks}
    )
    slower = _stragglers(i, t)
    for r, occs in sorted(blamed.items()):
        stall = _stall(occs, [r], i, t)
        if stall is None:
            continue  # too few or too cheap
        if stall.work is None and (
            r in explained.ranks
            or r in slower
            or stall.share < t.noise_ratio * (noise.get(r) or 0.0)
        ):
            # Unnamed: a host its workers oversubscribe, the tail of a rank slower in most of
            # its steps (a straggler), or jitter every rank has.
            continue
        stalls[r] = stall
    if stalls:
        blame = _blame(stalls, blamed, i)
        if (blame.predicted_speedup or 1.0) >= t.min_speedup:
            findings.append(blame)
    every = _stall(alike, ranks, i, t)
    if every is not None:
        findings.append(
            Finding(
                kind=KIND,
                severity="info",
                ranks=(),
                facts=Facts({}, every),
                evidence={"every_rank": _evidence(every), "speedup_model": NOT_PREDICTED},
            )
        )
    return findings


def _spikes(rs: RankSteps, t: Thresholds) -> dict[int, float]:
    """The rank's steps whose own work exceeds its median by the thresholds (large, and out of
    its own spread), in runs of at most ``max_run`` steps (separate): step -> excess (empty
    where it spikes too often to be stalling)."""
    if not rs.step:
        return {}
    median = statistics.median(rs.work_s)
    floor = max(
        t.min_spike_ratio * statistics.median(rs.step_s),
        t.min_spike_s,
        t.spread_k * robust_spread(rs.work_s),
    )
    out = {k: w - median for k, w in zip(rs.step, rs.work_s, strict=True) if w - median >= floor}
    if len(out) > t.max_spike_ratio * len(rs.step):
        return {}
    return _separate(out, t.max_run)


def _separate(spikes: dict[int, float], max_run: int) -> dict[int, float]:
    """``spikes`` less those in a run of more than ``max_run`` consecutive steps."""
    out: dict[int, float] = {}
    run: list[int] = []
    for k in sorted(spikes):
        if run and k != run[-1] + 1:
            if len(run) <= max_run:
                out.update((s, spikes[s]) for s in run)
            run = []
        run.append(k)
    if run and len(run) <= max_run:
        out.update((s, spikes[s]) for s in run)
    return out


def _stragglers(i: Inputs, t: Thresholds) -> frozenset[int]:
    """Ranks slower than their peers in most of their steps: the median of their own work
    past the median of their peers' medians by ``straggler_margin`` of their median step."""
    typical = {r: statistics.median(rs.work_s) for r, rs in i.ranks.items() if rs.step}
    of_peers = PeerMedians(typical)
    out = set()
    for r, work in typical.items():
        peer = of_peers.get(r)
        step = statistics.median(i.ranks[r].step_s)
        if peer is not None and work - peer >= t.straggler_margin * step:
            out.add(r)
    return frozenset(out)


def _occurrences(
    i: Inputs, ranks: Sequence[int], spikes: Mapping[int, Mapping[int, float]], t: Thresholds
) -> tuple[dict[int, list[_Occurrence]], list[_Occurrence]]:
    """Each step's spikes as one occurrence: blamed on its leaders where the others waited
    for them, or every rank's alike."""
    index = {r: {k: n for n, k in enumerate(i.ranks[r].step)} for r in ranks}
    median_wait = {r: statistics.median(i.ranks[r].wait_s) for r in ranks}
    blamed: dict[int, list[_Occurrence]] = {}
    alike: list[_Occurrence] = []
    used: set[tuple[int, int]] = set()
    for k in sorted({k for s in spikes.values() for k in s}):
        spiking = {r: s[k] for r, s in spikes.items() if k in s and (r, k) not in used}
        if not spiking:
            continue
        top = max(spiking.values())
        leaders = {r: x for r, x in spiking.items() if x >= t.alike_ratio * top}
        others = [q for q in ranks if q not in leaders]
        # The others' comparable spikes one step off: the boundary fell elsewhere on them.
        shifted = {
            q: k + d
            for q in others
            for d in (-1, 1)
            if spikes[q].get(k + d, 0.0) >= t.alike_ratio * top and (q, k + d) not in used
        }
        if len(shifted) == len(others):
            every = dict(leaders)
            every.update({q: spikes[q][s] for q, s in shifted.items()})
            used.update((r, k) for r in leaders)
            used.update(shifted.items())
            alike.append(_Occurrence(k, every, None))
            continue
        used.update((r, k) for r in leaders)
        rises = []
        for q in others:
            waits = [i.ranks[q].wait_s[n] for s in (k, k + 1) if (n := index[q].get(s)) is not None]
            rises.append(max(waits, default=median_wait[q]) - median_wait[q])
        rise = statistics.median(rises)
        if rise >= t.min_wait_share * min(leaders.values()):
            occ = _Occurrence(k, leaders, rise)
            for r in leaders:
                blamed.setdefault(r, []).append(occ)
    return blamed, alike


def _stall(
    occs: Sequence[_Occurrence], ranks: Sequence[int], i: Inputs, t: Thresholds
) -> Stall | None:
    """What ``ranks`` lose to these occurrences (one rank's, or every rank's alike); None below
    the thresholds."""
    if len(occs) < t.min_occurrences:
        return None
    costs = [statistics.median(o.excess[r] for r in ranks if r in o.excess) for o in occs]
    wall = sum(sum(i.ranks[r].step_s) for r in ranks) / len(ranks)
    share = sum(costs) / wall if wall > 0 else 0.0
    if share < t.min_share:
        return None
    steps = tuple(o.step for o in occs)
    period = _period(steps)
    cost = statistics.median(costs)
    work = _work(occs, ranks, i)
    interval = None
    if work == CHECKPOINT and period is not None:
        typical = statistics.median(statistics.median(i.ranks[r].step_s) for r in ranks)
        if typical > 0:
            keeps = math.ceil(cost * (1 - t.target_share) / (t.target_share * typical))
            interval = keeps if keeps > period else None
    waits = [o.peer_wait_s for o in occs if o.peer_wait_s is not None]
    return Stall(
        work=work,
        occurrences=len(occs),
        period=period,
        cost_s=cost,
        share=share,
        steps=steps,
        peer_wait_s=statistics.median(waits) if waits else None,
        interval=interval,
    )


def _period(steps: Sequence[int]) -> int | None:
    """Steps between occurrences where they are even: every gap within one step (or a tenth) of
    a whole multiple of the median gap (an occurrence too short to count leaves a double gap);
    None where irregular."""
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    if not gaps:
        return None
    middle = statistics.median(gaps)
    if middle <= 0:
        return None
    slack = max(1.0, 0.1 * middle)
    for g in gaps:
        times = max(1, round(g / middle))
        if abs(g - times * middle) > slack * times:
            return None
    return round(middle)


def _work(occs: Sequence[_Occurrence], ranks: Sequence[int], i: Inputs) -> str | None:
    """The named work that covers at least half of the occurrences' cost: the largest by
    seconds; None (unnamed) otherwise."""
    named: dict[str, float] = {}
    total = 0.0
    for r in ranks:
        rs = i.ranks[r]
        index = {k: n for n, k in enumerate(rs.step)}
        for o in occs:
            if r not in o.excess:
                continue
            total += o.excess[r]
            n = index.get(o.step)
            outside = rs.outside[n] if n is not None else None
            for name, seconds in (outside or {}).items():
                if seconds and seconds > 0 and name != LOADER_START:  # not in its work
                    named[name] = named.get(name, 0.0) + float(seconds)
    if not named or total <= 0:
        return None
    name, seconds = max(named.items(), key=lambda kv: (kv[1], kv[0]))
    return name if seconds >= 0.5 * total else None


def _blame(
    stalls: Mapping[int, Stall], occs: Mapping[int, Sequence[_Occurrence]], i: Inputs
) -> Finding:
    """One finding naming every stalling rank, with each one's lever and the barrier model's
    speed-up once each rank's lever is moved (:func:`_after`), over the steps since the stalls
    began (:func:`_since`): a stall that began midway is judged against the steps it slows,
    not diluted by the steps before it."""
    since = _since(stalls, occs)
    kept = {r: [n for n, k in enumerate(rs.step) if k >= since] for r, rs in i.ranks.items()}
    local: dict[int, float] = {}
    waits: dict[int, float] = {}
    for r, rs in i.ranks.items():
        n = len(kept[r]) or 1
        waits[r] = sum(rs.wait_s[x] for x in kept[r]) / n
        local[r] = sum(rs.step_s[x] for x in kept[r]) / n - waits[r]
    barrier = Barrier(local, min(waits.values()))
    excess = {r: sum(o.excess[r] for o in occs[r]) / (len(kept[r]) or 1) for r in stalls}
    levers = {r: _lever(s) for r, s in stalls.items()}
    speedup = barrier.speedup(_after(local, excess, levers, stalls, i.host_cpu))
    fixes: list[Fix] = []
    for r, stall in sorted(stalls.items()):
        lever = levers[r]
        if lever == "checkpoint_interval":
            fixes.append(Fix(lever, r, stall.period, stall.interval, speedup, (KIND,)))
            # The save moved off the step instead: its own figure, this rank's lever alone.
            other = {**levers, r: "checkpoint_async"}
            alone = barrier.speedup(_after(local, excess, other, stalls, i.host_cpu))
            fixes.append(Fix("checkpoint_async", r, False, True, alone, (KIND,)))
            continue
        current, proposed = (None, None) if lever == "rank_work" else (False, True)
        fixes.append(Fix(lever, r, current, proposed, speedup, (KIND,)))
    evidence = {
        "per_rank": {str(r): _evidence(s) for r, s in sorted(stalls.items())},
        "local_ms": {str(r): round(v * 1e3, 1) for r, v in sorted(local.items())},
        "since_stalls_began": since,
    }
    return Finding(
        kind=KIND,
        severity=severity_for(speedup),
        ranks=tuple(sorted(stalls)),
        facts=Facts(dict(stalls)),
        evidence=evidence,
        predicted_speedup=speedup,
        fixes=tuple(fixes),
    )


def _since(stalls: Mapping[int, Stall], occs: Mapping[int, Sequence[_Occurrence]]) -> int:
    """The first step of the stalls' regime: one period (or the median gap between them)
    before the first; every step where no stall came yet."""
    first = min(o.step for r in stalls for o in occs[r])
    gaps = [
        s.period
        if s.period is not None
        else statistics.median(b - a for a, b in itertools.pairwise(s.steps))
        for s in stalls.values()
        if len(s.steps) > 1
    ]
    return first - math.ceil(max(gaps, default=0))


def _lever(s: Stall) -> str:
    """The lever a rank's stalls answer to first: a periodic checkpoint's longer interval
    where one is proposed (its effect is what it saves: each save's cost once per interval);
    else the named work's (:data:`LEVER_OF`); else the rank's own work."""
    if s.work == CHECKPOINT and s.interval is not None and s.period is not None:
        return "checkpoint_interval"
    return LEVER_OF.get(s.work or "", "rank_work")


def _after(
    local: Mapping[int, float],
    excess: Mapping[int, float],
    levers: Mapping[int, str],
    stalls: Mapping[int, Stall],
    host_cpu: Mapping[int, tuple[float, float]],
) -> dict[int, float]:
    """Each rank's local time per step once each stalling rank's lever is moved:

    * an evaluation spread over every rank leaves each rank its share of it;
    * a longer checkpoint interval keeps each save's cost, once per interval;
    * a save moved off the step (``checkpoint_async``) still does its work on the host: where
      the host's cores are busy, it takes from the ranks there what a CPU-bound thread takes
      (:func:`_taken`);
    * any other work (unnamed, logging) is gone."""
    out = dict(local)
    for r, x in excess.items():
        lever = levers[r]
        period, interval = stalls[r].period, stalls[r].interval
        if lever == "checkpoint_interval" and period is not None and interval:
            out[r] -= x * (1.0 - period / interval)
        elif lever == "evaluation_on_all_ranks":
            share = x / len(local)
            for q in out:
                out[q] += share
            out[r] -= x
        elif lever == "checkpoint_async":
            out[r] -= x * (1.0 - _taken(host_cpu.get(r)))
        else:
            out[r] -= x
    return out


def _taken(cpu: tuple[float, float] | None) -> float:
    """The share of a CPU-bound thread's work its host's ranks lose when it runs beside them:
    none where a core is free; with every core busy, one thread more among ``cores`` takes
    ``1/cores`` of its work from them (the scheduler shares the cores evenly), and in between
    in proportion. 0 where the host was not sampled."""
    if cpu is None:
        return 0.0
    cores, busy = cpu
    if cores <= 0:
        return 0.0
    return min(1.0, max(0.0, busy + 1.0 - cores)) / cores


def _evidence(s: Stall) -> dict[str, object]:
    return {
        "work": s.work,
        "occurrences": s.occurrences,
        "period_steps": s.period,
        "cost_ms": round(s.cost_s * 1e3, 1),
        "share": round(s.share, 4),
        "steps": list(s.steps),
        "peer_wait_ms": None if s.peer_wait_s is None else round(s.peer_wait_s * 1e3, 1),
        "interval_steps": s.interval,
    }


RULE = Rule(
    kind=KIND,
    place=45,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=("cpu_oversubscription",),
)
