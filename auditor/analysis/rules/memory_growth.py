"""memory_growth: a rank whose memory climbs step after step, past warm-up: an out-of-memory
ahead, with the time left.

Series, per rank, over its whole run (:attr:`Snapshot.history`: every step folded into at most
512 buckets, each holding the memory *levels* at its last step):

* a rank on a GPU (``RankInfo.device`` ``cuda...``) with the allocator's figures: the allocator's
  allocated bytes (what live tensors hold) and reserved bytes (what the caching allocator took
  from the device), each judged on its own;
* a CPU rank, or a GPU rank whose probe sent no allocator figures: the process's host RSS.

Points: each bucket's level at its last step. The probe reads RSS once per flush (four times a
second), so the steps of one flush share one level: a climbing RSS is a staircase.

Decision, per series: skip the warm-up (the caching allocator, cuDNN's autotuning, DataLoader
workers and imports grow memory at first: the first ``warmup_share`` of the run's steps, at
least ``warmup_steps``); the fitted span then needs ``min_steps`` steps and ``min_points``
distinct levels, half of them in each half. The slope is a Theil-Sen estimate: the median of
the slopes between pairs of points at least a quarter of the points apart, and at least twice
the median run of equal levels apart (so no pair falls on one stair of the staircase); robust
to single jumps, and a flat stretch weighs as the steps it lasts. A series *climbs* where:

* the fitted rise over the span is at least ``min_rise_bytes`` and ``noise_ratio`` times the
  spread of the points around the line (1.4826 x their median absolute deviation: noise is not
  a climb); how much it matters against the capacity is the severity's (the time to full);
* it does not level off: the later half's slope is at least ``later_ratio`` of the earlier
  half's (a warm-up that flattens, a cache that fills and stops, are not leaks);
* it still climbs at the end: over the last third of the span, the slope of the running
  maximum is at least ``later_ratio`` of the rate (a level shift, memory taken once midway by a
  new buffer or a collective's scratch space and then held flat, reads as a late climb on the
  halves alone; memory the allocator hands back now and then does not end a leak).

The rate is the span's slope, or the later half's where that is steeper (the climb sped up, or
started late: the span's slope reads a climb that began 40% into the span at three quarters of
its rate); per minute at the rank's step rate over the later half of the span
(bucket wall-clock times). ``since_step``: the first step from which the points keep to that
line (within the noise band, a stray point or two aside), warm-up included.

Allocated against reserved tells what climbs: allocated climbing is tensors kept alive across
steps (:data:`TENSORS_KEPT`: a loss summed or appended as a tensor instead of ``loss.item()``,
outputs collected in a list, ``backward(retain_graph=True)``, a cache that grows without bound);
reserved climbing while allocated stays flat is the caching allocator holding ever more blocks
it cannot reuse (:data:`ALLOCATOR_CACHE`: fragmentation from varying shapes); host RSS cannot
tell them apart (:data:`HOST_MEMORY`: the same tensor causes, on the CPU, or a Python-side cache).

Capacity, per rank: on a GPU, the measured budget's device total less what the device holds
outside the rank's allocator (its CUDA context, other processes); else the NVML total of the
rank's GPU less what NVML sees beyond the rank's reserved bytes (at its peak); on the host, the
rank's RSS when its budget was measured plus the host's available memory then. The projection
follows allocated where it climbs (the allocator's cached slack is room it will use), else
reserved, or RSS: the time to full is the headroom (capacity less that level now) over the rate
per second of every rank that climbs on the same GPU (or host): they fill it together. Unknown
where the capacity or the step rate is.

Severity, by the projected time to full: ``critical`` within ``critical_s`` (30 minutes),
``warning`` within ``warning_s`` (24 hours: a run of a day would crash), ``info`` beyond or where
the time is unknown. A projection that follows the host's RSS or the allocator's reserved bytes
is also ``info`` while the time to full is more than ``max_projection`` times the seconds the
climb was seen (its fitted span: ``seen_s``): malloc's arenas, the caching allocator's pool and
the caches of a run's first seconds climb steadily too, and level off later (ten seconds of a
200 KiB-a-step RSS rise do not show that a host fills in 46 minutes; a 3 MiB-a-step leak seen
for seven seconds that fills it in two does). Allocated bytes count live tensors exactly: their
steady climb past warm-up is tensors kept however briefly it was seen. The climb is named all
the same, its projection marked early (``Growth.early``). The auditor does not know when a run
will end (no rank says its planned steps), so "before the run would end" cannot be judged yet;
the 30-minute horizon stands in. One finding per severity, naming its ranks.

Fixes (:class:`~auditor.analysis.fixes.Fix`), per rank: ``retained_tensors`` where tensors are
kept (allocated or host RSS climbs), ``allocator_config`` (``expandable_segments:True``) where
only the allocator's cache climbs. Evidence codes (the report words them): each rank's
``where`` (:data:`DEVICE`, :data:`HOST`), ``series``, ``climbing``, ``cause``, ``causes``,
``capacity_source``; ``speedup_model`` ``not_predicted``.

Speed-up: not predicted: this prevents a crash, it does not change the step time. Silent where
the snapshot holds no history (``auditor serve``, snapshots built by hand).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from auditor.samples import MemoryBudget

from ..devices import DeviceStats
from ..findings import SEVERITY_ORDER, Finding
from ..fixes import Fix
from ..history import RankHistory
from ..measures import NOT_PREDICTED
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "memory_growth"
MIB = 1024**2
# Where the memory climbs.
DEVICE = "device"
HOST = "host"
# The figures judged (history bucket levels).
ALLOCATED = "allocated"
RESERVED = "reserved"
RSS = "rss"
LEVEL_OF = {
    ALLOCATED: "mem_allocated_bytes",
    RESERVED: "mem_reserved_bytes",
    RSS: "rss_bytes",
}
# What climbs, as codes (the report words them).
TENSORS_KEPT = "tensors_kept"  # allocated climbs: live tensors kept across steps
ALLOCATOR_CACHE = "allocator_cache"  # reserved climbs, allocated flat: cached blocks not reused
HOST_MEMORY = "host_memory"  # host RSS: tensors or Python objects kept, not told apart
# The usual causes of each, as codes, most common first.
LOSS_KEPT = "loss_kept"  # a loss summed or appended as a tensor instead of loss.item()
OUTPUTS_KEPT = "outputs_kept"  # outputs (logits, predictions) collected in a list
RETAIN_GRAPH = "retain_graph"  # backward(retain_graph=True): every step's graph kept
GROWING_CACHE = "growing_cache"  # a dict or list filled every step and never emptied
FRAGMENTATION = "fragmentation"  # varying shapes leave cached blocks too small to reuse
CAUSES = {
    TENSORS_KEPT: (LOSS_KEPT, OUTPUTS_KEPT, RETAIN_GRAPH, GROWING_CACHE),
    ALLOCATOR_CACHE: (FRAGMENTATION,),
    HOST_MEMORY: (LOSS_KEPT, OUTPUTS_KEPT, GROWING_CACHE, RETAIN_GRAPH),
}
# Where a rank's capacity comes from.
DEVICE_LESS_OUTSIDE = "device_total_less_outside"  # the budget: total less context and others
NVML_TOTAL_LESS_OTHERS = "nvml_total_less_others"  # NVML: total less what it sees beyond ours
HOST_AVAILABLE = "host_available"  # the budget: RSS then plus the host's available memory then
UNKNOWN = "unknown"
# The setting the allocator_config fix proposes: segments that grow instead of new blocks.
EXPANDABLE_SEGMENTS = "expandable_segments:True"
# The Theil-Sen estimate uses every pair of points at least this share of the points apart; past
# ``_ALL_PAIRS`` points, about ``_LAGS`` lags between that and half the points (bounded work:
# about 2,000 pairs for 512 points).
_MIN_LAG_SHARE = 0.25
_ALL_PAIRS = 64
_LAGS = 8
# Points within this many robust spreads of the line (or this share of the rise) are on it.
_ON_LINE_SPREADS = 3.0
_ON_LINE_RISE = 0.05
# Walking back along the line, the climb's start is where more than this share of the points
# walked are off it (a stray point or two does not end it).
_OFF_LINE = 0.1
# A later half steeper than the span by this factor sets the rate (the climb sped up, or started
# late: flat for the first 40% of the span, the span's Theil-Sen slope reads 0.75 of the climb's).
_SPED_UP = 1.0
# The share of the span, at its end, that must still climb (not a level shift).
_RECENT = 1 / 3
# 1.4826 x the median absolute deviation estimates a normal spread.
_MAD_SCALE = 1.4826


@dataclass(frozen=True)
class Thresholds:
    """Args:
    warmup_steps: steps at the start of a rank's run never fitted (allocator, cuDNN autotune,
        DataLoader workers and imports grow memory at first).
    warmup_share: share of a rank's steps so far skipped as warm-up (the larger of the two).
    min_steps: steps the fitted span (after warm-up) needs before a rank is judged.
    min_points: points (distinct levels) the fitted span needs, half of them in each half.
    min_rise_bytes: least fitted rise over the span that counts as a climb.
    noise_ratio: the rise must be this many times the spread of the points around the line.
    later_ratio: the later half's slope, as a share of the earlier half's, below which the
        climb levels off (warm-up, a cache that filled).
    critical_s: projected seconds to full within which the finding is critical.
    warning_s: projected seconds to full within which it is a warning (info beyond).
    max_projection: the farthest a time to full that follows RSS or reserved bytes is
        projected for a warning or worse, as a multiple of the seconds the climb was seen (info
        beyond: too early to tell).
    """

    warmup_steps: int = 20
    warmup_share: float = 0.2
    min_steps: int = 50
    min_points: int = 8
    min_rise_bytes: int = 64 * MIB
    noise_ratio: float = 4.0
    later_ratio: float = 0.5
    critical_s: float = 30 * 60.0
    warning_s: float = 24 * 3600.0
    max_projection: float = 50.0


@dataclass(frozen=True)
class Series:
    """One memory figure of one rank over its run: each point's step, wall-clock time and bytes,
    in step order (one point per run of equal levels, at the run's last step)."""

    steps: tuple[int, ...]
    times: tuple[float, ...]
    levels: tuple[float, ...]


@dataclass(frozen=True)
class Pace:
    """A rank's steps over its run: each bucket's last step and the wall-clock time it ended."""

    steps: tuple[int, ...]
    times: tuple[float, ...]


@dataclass(frozen=True)
class Room:
    """What a rank's memory may grow into: its capacity in bytes of the judged figure (None:
    unknown), where that comes from, and the pool it shares with other ranks (a GPU, a host)."""

    capacity_bytes: float | None
    source: str
    pool: str


@dataclass(frozen=True)
class Inputs:
    """Per rank with a history: where its memory is judged (:data:`DEVICE` or :data:`HOST`), its
    series by figure, its first and last step, its steps and their wall-clock times over the
    run (bucket ends, for the step rate), what it may grow into, and its GPU's name (None:
    none named)."""

    where: Mapping[int, str]
    series: Mapping[int, Mapping[str, Series]]
    first_step: Mapping[int, int]
    last_step: Mapping[int, int]
    pace: Mapping[int, Pace]
    room: Mapping[int, Room]
    gpu: Mapping[int, str | None]


@dataclass(frozen=True)
class Climb:
    """One figure that climbs: bytes per step (the rate), the fitted span's steps, the earlier
    and later halves' slopes, the rise over the span and the latest level."""

    figure: str
    bytes_per_step: float
    from_step: int
    to_step: int
    earlier_per_step: float
    later_per_step: float
    rise_bytes: float
    level_bytes: float
    since_step: int


@dataclass(frozen=True)
class Growth:
    """A rank whose memory climbs: where (:data:`DEVICE` or :data:`HOST`, its GPU's name), the
    figure the projection follows and every figure that climbs, what climbs (:data:`TENSORS_KEPT`,
    :data:`ALLOCATOR_CACHE`, :data:`HOST_MEMORY`) and its usual causes, the rate per step and
    per second (None: the step rate is unknown), the step it climbs since, its level now, its
    capacity and where that comes from, the seconds until full at the rate of every rank
    climbing on the same GPU or host (None: unknown) and those other ranks; the seconds the
    followed figure's climb was seen (its fitted span; None: unknown) and whether the time to
    full lies too far past that to call (``early``: the finding stays info)."""

    rank: int
    where: str
    figure: str
    climbing: tuple[str, ...]
    cause: str
    causes: tuple[str, ...]
    bytes_per_step: float
    bytes_per_s: float | None
    since_step: int
    level_bytes: float
    capacity_bytes: float | None
    capacity_source: str
    full_in_s: float | None
    shared_with: tuple[int, ...] = ()
    gpu: str | None = None
    seen_s: float | None = None
    early: bool = False

    @property
    def bytes_per_minute(self) -> float | None:
        return None if self.bytes_per_s is None else self.bytes_per_s * 60.0


@dataclass(frozen=True)
class Facts:
    """The ranks whose memory climbs (of one severity), soonest full first in ``order``."""

    ranks: Mapping[int, Growth]

    @property
    def order(self) -> tuple[int, ...]:
        """Ranks by time to full (unknown last), then rank."""
        inf = float("inf")
        return tuple(
            sorted(
                self.ranks,
                key=lambda r: (
                    inf if self.ranks[r].full_in_s is None else self.ranks[r].full_in_s,
                    r,
                ),
            )
        )


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    history = snapshot.history
    if not history:
        return None
    view_of = snapshot.view_of
    where: dict[int, str] = {}
    series: dict[int, dict[str, Series]] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    pace: dict[int, Pace] = {}
    room: dict[int, Room] = {}
    gpu: dict[int, str | None] = {}
    gpus_of = snapshot.gpus_of if snapshot.devices or snapshot.gpus else {}
    stats = snapshot.gpu_stats if gpus_of else {}
    for r, h in sorted(history.items()):
        view = view_of.get(r)
        buckets = h.buckets
        if view is None or not buckets:
            continue
        span = buckets[-1].last_step - buckets[0].first_step
        if span < t.warmup_steps + t.min_steps:
            continue  # too short to judge: a cheap screen before any series is read
        on_gpu = view.info.device.startswith("cuda")
        figures = _figures(h, on_gpu)
        if not figures:
            continue
        where[r] = DEVICE if RSS not in figures else HOST
        series[r] = figures
        first[r] = buckets[0].first_step
        last[r] = buckets[-1].last_step
        pace[r] = Pace(tuple(b.last_step for b in buckets), tuple(b.end for b in buckets))
        uuids = gpus_of.get(r, ())
        d = stats.get(uuids[0]) if len(uuids) == 1 else None
        gpu[r] = d.label if d is not None else None
        room[r] = _room(view.memory, where[r], figures, d, view.info.host, view.info.device)
    if not series:
        return None
    return Inputs(where, series, first, last, pace, room, gpu)


def _figures(h: RankHistory, on_gpu: bool) -> dict[str, Series]:
    """The rank's judged figures: the allocator's two on a GPU where measured, else RSS; a
    figure with too few distinct levels to ever climb is left out (the cheap screen)."""
    names = (ALLOCATED, RESERVED) if on_gpu else (RSS,)
    out = {n: _series(h, LEVEL_OF[n]) for n in names}
    if on_gpu and not any(s.levels for s in out.values()):
        out = {RSS: _series(h, LEVEL_OF[RSS])}
    return {n: s for n, s in out.items() if len(set(s.levels)) >= 2}


def _series(h: RankHistory, level: str) -> Series:
    """Each bucket's level at its last step (buckets that measured none left out)."""
    steps: list[int] = []
    times: list[float] = []
    levels: list[float] = []
    for b in h.buckets:
        v = getattr(b, level)
        if v is not None:
            steps.append(b.last_step)
            times.append(b.end)
            levels.append(float(v))
    return Series(tuple(steps), tuple(times), tuple(levels))


def _room(
    budget: MemoryBudget | None,
    where: str,
    figures: Mapping[str, Series],
    device: DeviceStats | None,
    host: str,
    name: str,
) -> Room:
    """Where the rank's memory may grow: see the module doc (Capacity)."""
    if where == HOST:
        pool = f"host:{host}"
        if budget is not None and budget.host_available_bytes is not None:
            rss = _level_at(figures[RSS], budget.time)
            if rss is not None:
                return Room(rss + budget.host_available_bytes, HOST_AVAILABLE, pool)
        return Room(None, UNKNOWN, pool)
    pool = f"gpu:{device.uuid}" if device is not None else f"device:{host}:{name}"
    if budget is not None and budget.device_total_bytes:
        outside = budget.device_outside_bytes or 0
        return Room(float(budget.device_total_bytes - outside), DEVICE_LESS_OUTSIDE, pool)
    if device is not None and device.mem_total_bytes:
        reserved = figures.get(RESERVED)
        mine = max(reserved.levels) if reserved is not None and reserved.levels else 0.0
        others = max(0.0, (device.mem_used_max_bytes or 0) - mine)
        return Room(float(device.mem_total_bytes) - others, NVML_TOTAL_LESS_OTHERS, pool)
    return Room(None, UNKNOWN, pool)


def _level_at(s: Series, time: float) -> float | None:
    """The series' level at wall-clock ``time``: the last point read at or before it (the
    first point where none was)."""
    if not s.levels:
        return None
    out = s.levels[0]
    for when, level in zip(s.times, s.levels, strict=True):
        if when > time:
            break
        out = level
    return out


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Name the ranks whose memory climbs past warm-up, with the time until full."""
    climbs: dict[int, dict[str, Climb]] = {}
    for r, figures in i.series.items():
        found = {}
        for name, s in figures.items():
            c = _climb(name, s, i.first_step[r], i.last_step[r], t)
            if c is not None:
                found[name] = c
        if found:
            climbs[r] = found
    if not climbs:
        return []
    growth = _growths(i, climbs)
    by_severity: dict[str, dict[int, Growth]] = {}
    for r, g in growth.items():
        if g.figure != ALLOCATED and g.full_in_s is not None and g.seen_s is not None:
            g = dataclasses.replace(g, early=g.full_in_s > t.max_projection * g.seen_s)
        by_severity.setdefault(_severity(g, t), {})[r] = g
    out = []
    for severity in SEVERITY_ORDER:
        ranks = by_severity.get(severity)
        if ranks:
            out.append(_finding(severity, ranks, climbs))
    return out


def _climb(name: str, s: Series, first: int, last: int, t: Thresholds) -> Climb | None:
    """The figure's climb past warm-up, or None where it does not climb (module doc)."""
    skip = first + max(t.warmup_steps, round(t.warmup_share * (last - first)))
    pts = [(x, y) for x, y in zip(s.steps, s.levels, strict=True) if x > skip]
    if len({y for _, y in pts}) < t.min_points:
        return None
    xs = [float(x) for x, _ in pts]
    ys = [y for _, y in pts]
    span = xs[-1] - xs[0]
    if span < t.min_steps:
        return None
    floor = float(t.min_rise_bytes)
    if max(ys) - min(ys) < floor:
        return None  # cheap screen: the points never rise that much
    slope = theil_sen(xs, ys)
    if slope is None or slope <= 0:
        return None
    rise = slope * span
    intercept = statistics.median(y - slope * x for x, y in pts)
    spread = _MAD_SCALE * statistics.median(abs(y - intercept - slope * x) for x, y in pts)
    if rise < floor or rise < t.noise_ratio * spread:
        return None
    middle = xs[0] + span / 2
    early = [(x, y) for x, y in zip(xs, ys, strict=True) if x <= middle]
    late = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= middle]
    half = max(2, t.min_points // 2)
    if len({y for _, y in early}) < half or len({y for _, y in late}) < half:
        return None  # one half holds too few distinct levels: flat there
    earlier = theil_sen(*zip(*early, strict=True))
    later = theil_sen(*zip(*late, strict=True))
    if earlier is None or later is None or later <= 0 or later < t.later_ratio * earlier:
        return None  # levels off
    rate = slope
    if later > _SPED_UP * slope:  # the climb sped up (or started late): the later half's line
        rate = later
        intercept = statistics.median(y - rate * x for x, y in late)
        spread = _MAD_SCALE * statistics.median(abs(y - intercept - rate * x) for x, y in late)
    recent = [(x, y) for x, y in zip(xs, ys, strict=True) if x >= xs[-1] - _RECENT * span]
    if len({y for _, y in recent}) >= half:  # enough levels at the end to judge them
        # Their running maximum: a level shift's stays flat, while a leak's keeps rising
        # through memory the allocator hands back now and then (a heap trimmed: RSS fell by
        # 48 MiB in the last steps of a 3.5 MiB-a-step leak, and its plain slope halved).
        at_end = theil_sen([x for x, _ in recent], list(accumulate((y for _, y in recent), max)))
        if at_end is not None and at_end < t.later_ratio * rate:
            return None  # the rise stopped: a level shift, not a climb
    band = max(_ON_LINE_SPREADS * spread, _ON_LINE_RISE * rise)
    since = _on_line_since(s, rate, intercept, band)
    return Climb(
        figure=name,
        bytes_per_step=rate,
        from_step=int(xs[0]),
        to_step=int(xs[-1]),
        earlier_per_step=earlier,
        later_per_step=later,
        rise_bytes=rise,
        level_bytes=s.levels[-1],
        since_step=since,
    )


def _on_line_since(s: Series, slope: float, intercept: float, band: float) -> int:
    """The first step from which the series keeps to the line (within ``band``): walking back
    from the latest point, up to where points off the line pass ``_OFF_LINE`` of those
    walked."""
    since = s.steps[-1]
    off = 0
    points = zip(reversed(s.steps), reversed(s.levels), strict=True)
    for walked, (x, y) in enumerate(points, start=1):
        if abs(y - intercept - slope * x) <= band:
            since = x
        else:
            off += 1
            if off > _OFF_LINE * walked:
                break
    return since


def theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The median slope between pairs of points at least a quarter of the points apart and
    twice the median run of equal ``ys`` (up to ``_ALL_PAIRS`` points every such pair; past that
    about ``_LAGS`` lags up to half the points); None without such a pair (a series flat for
    half its points or more)."""
    n = len(xs)
    if n < 2:
        return None
    low = max(1, int(n * _MIN_LAG_SHARE), 2 * _median_run(ys))
    if low >= n:
        return None
    if n <= _ALL_PAIRS:
        lags: Sequence[int] = range(low, n)
    else:
        high = max(low, n // 2)
        lags = range(low, high + 1, max(1, (high - low) // _LAGS))
    slopes = [
        (ys[k + lag] - ys[k]) / (xs[k + lag] - xs[k])
        for lag in lags
        for k in range(n - lag)
        if xs[k + lag] > xs[k]
    ]
    return statistics.median(slopes) if slopes else None


def _median_run(ys: Sequence[float]) -> int:
    """The median length of the runs of equal consecutive values (1: every value differs)."""
    runs: list[int] = []
    for k, y in enumerate(ys):
        if k and y == ys[k - 1]:
            runs[-1] += 1
        else:
            runs.append(1)
    return int(statistics.median(runs)) if runs else 1


def _time_at(pace: Pace, step: int) -> float | None:
    """When the rank's bucket holding ``step`` ended (None: no bucket reaches it)."""
    for at, when in zip(pace.steps, pace.times, strict=True):
        if at >= step:
            return when
    return None


def _steps_per_s(pace: Pace, from_step: int) -> float | None:
    """The rank's step rate over its run from ``from_step`` on (bucket ends)."""
    start = None
    for step, when in zip(pace.steps, pace.times, strict=True):
        if step >= from_step:
            start = (step, when)
            break
    if start is None:
        return None
    steps, seconds = pace.steps[-1] - start[0], pace.times[-1] - start[1]
    return steps / seconds if steps > 0 and seconds > 0 else None


def _projected(climbs: Mapping[str, Climb]) -> Climb:
    """The figure the projection follows: allocated where it climbs (the cache's slack is room
    it will use), else reserved; RSS on the host."""
    for name in (ALLOCATED, RESERVED, RSS):
        if name in climbs:
            return climbs[name]
    raise ValueError("no climbing figure")


def _growths(i: Inputs, climbs: Mapping[int, Mapping[str, Climb]]) -> dict[int, Growth]:
    """Each climbing rank's growth, its time to full shared with the ranks of its pool."""
    followed = {r: _projected(c) for r, c in climbs.items()}
    per_s: dict[int, float | None] = {}
    for r, c in followed.items():
        middle = c.from_step + (c.to_step - c.from_step) // 2
        rate = _steps_per_s(i.pace[r], middle)
        per_s[r] = None if rate is None else c.bytes_per_step * rate
    pools: dict[str, list[int]] = {}
    for r in followed:
        pools.setdefault(i.room[r].pool, []).append(r)
    out: dict[int, Growth] = {}
    for r, c in sorted(followed.items()):
        room = i.room[r]
        mates = pools[room.pool]
        rates = [per_s[q] for q in mates]
        full_in = None
        if room.capacity_bytes is not None and all(x is not None and x > 0 for x in rates):
            total = sum(x for x in rates if x is not None)
            full_in = max(0.0, room.capacity_bytes - c.level_bytes) / total
        names = tuple(n for n in (ALLOCATED, RESERVED, RSS) if n in climbs[r])
        cause = (
            HOST_MEMORY
            if i.where[r] == HOST
            else TENSORS_KEPT
            if ALLOCATED in climbs[r]
            else ALLOCATOR_CACHE
        )
        out[r] = Growth(
            rank=r,
            where=i.where[r],
            figure=c.figure,
            climbing=names,
            cause=cause,
            causes=CAUSES[cause],
            bytes_per_step=c.bytes_per_step,
            bytes_per_s=per_s[r],
            since_step=min(x.since_step for x in climbs[r].values()),
            level_bytes=c.level_bytes,
            capacity_bytes=room.capacity_bytes,
            capacity_source=room.source,
            full_in_s=full_in,
            shared_with=tuple(q for q in sorted(mates) if q != r),
            gpu=i.gpu.get(r),
            seen_s=_seen_s(i.pace[r], c),
        )
    return out


def _seen_s(pace: Pace, c: Climb) -> float | None:
    """Seconds from the first to the last step of the climb's fitted span (None: unknown)."""
    start, end = _time_at(pace, c.from_step), _time_at(pace, c.to_step)
    return None if start is None or end is None or end <= start else end - start


def _severity(g: Growth, t: Thresholds) -> str:
    if g.full_in_s is None or g.full_in_s > t.warning_s or g.early:
        return "info"
    return "critical" if g.full_in_s <= t.critical_s else "warning"


def _fixes(g: Growth) -> list[Fix]:
    if g.cause == ALLOCATOR_CACHE:
        return [Fix("allocator_config", g.rank, None, EXPANDABLE_SEGMENTS, None, (KIND,))]
    return [Fix("retained_tensors", g.rank, None, None, None, (KIND,))]


def _finding(
    severity: str, ranks: Mapping[int, Growth], climbs: Mapping[int, Mapping[str, Climb]]
) -> Finding:
    facts = Facts(dict(sorted(ranks.items())))
    return Finding(
        kind=KIND,
        severity=severity,
        ranks=tuple(sorted(ranks)),
        facts=facts,
        evidence={
            "per_rank": {str(r): _evidence(g, climbs[r]) for r, g in sorted(ranks.items())},
            "speedup_model": NOT_PREDICTED,
        },
        predicted_speedup=None,
        fixes=tuple(fx for r in sorted(ranks) for fx in _fixes(ranks[r])),
    )


def _evidence(g: Growth, climbs: Mapping[str, Climb]) -> dict[str, object]:
    per_min = g.bytes_per_minute
    return {
        "where": g.where,
        "series": g.figure,
        "climbing": list(g.climbing),
        "cause": g.cause,
        "causes": list(g.causes),
        "bytes_per_step": round(g.bytes_per_step),
        "bytes_per_minute": None if per_min is None else round(per_min),
        "since_step": g.since_step,
        "level_bytes": round(g.level_bytes),
        "capacity_bytes": None if g.capacity_bytes is None else round(g.capacity_bytes),
        "capacity_source": g.capacity_source,
        "full_in_s": None if g.full_in_s is None else round(g.full_in_s, 1),
        "seen_s": None if g.seen_s is None else round(g.seen_s, 1),
        "early": g.early,
        "shared_with": list(g.shared_with),
        "fits": {
            name: {
                "bytes_per_step": round(c.bytes_per_step),
                "steps": [c.from_step, c.to_step],
                "earlier_bytes_per_step": round(c.earlier_per_step),
                "later_bytes_per_step": round(c.later_per_step),
                "rise_bytes": round(c.rise_bytes),
            }
            for name, c in climbs.items()
        },
    }


RULE = Rule(
    kind=KIND,
    place=75,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=(),
)
