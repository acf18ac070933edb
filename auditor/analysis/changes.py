"""Lasting changes of level in a series over steps: where a run changed, not one spike or noise.

One statistic for every reader: the ``slowdown`` rule on a run's history (buckets of steps) and
the live judge on its window's steps (:func:`latest_change`: where the job changed lately, so
the live verdict reads the steps since the change instead of a window still mostly before it).

Binary segmentation: a split is the best of the rank-based CUSUM (the rank sums either side in
standard errors, Mann-Whitney's statistic: one spike moves a rank by one, whatever its size; its
largest falls on a change, a staircase's too), with at least ``min_segment`` points and
``min_segment_s`` seconds on either side, then placed to the point (the split that puts the most
points on their side of the midpoint between the two levels). It is kept where the two
segments' medians differ by ``min_rise_share`` of the lower, by ``min_z`` robust standard errors
(the median absolute deviation of both segments around their medians), and where it persists:
``persistence`` of the points on each side sit on their side of that midpoint. Each kept segment
is split again, at most ``max_changes`` times.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .snapshot import Snapshot

MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
MAD_SCALE = 1.4826


class Bar(Protocol):
    """What makes a change lasting (the fields of :class:`Live`, and of the ``slowdown`` rule's
    thresholds, which document them)."""

    @property
    def min_segment(self) -> int: ...
    @property
    def min_segment_s(self) -> float: ...
    @property
    def min_rise_share(self) -> float: ...
    @property
    def min_z(self) -> float: ...
    @property
    def persistence(self) -> float: ...
    @property
    def max_changes(self) -> int: ...


def changes(
    x: Sequence[float], start: Sequence[float], end: Sequence[float], bar: Bar
) -> list[int]:
    """The lasting changes of ``x`` (point ``k`` spanning ``start[k]`` to ``end[k]``), as the
    indices of the first point at the new level, in order (the largest found first, then
    within each side)."""
    cuts: list[int] = []
    todo = [(0, len(x))]
    while todo and len(cuts) < bar.max_changes:
        lo, hi = todo.pop()
        cut = split(x, start, end, lo, hi, bar)
        if cut is None:
            continue
        cuts.append(cut)
        todo += [(lo, cut), (cut, hi)]
    return sorted(cuts)


def split(
    x: Sequence[float],
    start: Sequence[float],
    end: Sequence[float],
    lo: int,
    hi: int,
    bar: Bar,
) -> int | None:
    """The best split of ``x[lo:hi]`` (the rank-based CUSUM's, then placed to the point), where
    it is a lasting change."""
    m = bar.min_segment
    if hi - lo < 2 * m:
        return None
    values = x[lo:hi]
    n = len(values)
    order = ranks(values)
    best, cut, total = -1.0, None, 0.0
    first = last = lo
    for k in range(1, n - m + 1):
        total += order[k - 1]
        if k < m:
            continue
        if end[lo + k - 1] - start[lo] < bar.min_segment_s:
            continue
        if end[hi - 1] - start[lo + k] < bar.min_segment_s:
            break
        if cut is None:
            first = lo + k
        last = lo + k
        # The rank sums' difference in standard errors (Mann-Whitney's statistic): its largest
        # falls on a change, the largest of a staircase's too (unscaled, Pettitt's, would fall
        # within a step of it).
        u = abs(2 * total - k * (n + 1)) / math.sqrt(k * (n - k))
        if u > best:
            best, cut = u, lo + k
    if cut is None:
        return None
    cut = placed(x, lo, hi, cut, max(first, cut - m), min(last, cut + m))
    return cut if lasting(x[lo:cut], x[cut:hi], bar) else None


def placed(x: Sequence[float], lo: int, hi: int, cut: int, a: int, b: int) -> int:
    """The split in ``[a, b]`` that puts the most points on their side of the midpoint between
    the two levels (nearest ``cut`` among equals): the rank-based statistic places a change
    a point or two early or late where a point next to it is extreme among its own level."""
    ma, mb = statistics.median(x[lo:cut]), statistics.median(x[cut:hi])
    middle, sign = (ma + mb) / 2, (1.0 if mb >= ma else -1.0)
    # Points of [a, b) on the new level's side: all of them right of a split at ``a``.
    score = sum(sign * (v - middle) > 0 for v in x[a:b])
    best, place = score, a
    for k in range(a, b):
        side = sign * (x[k] - middle)
        score += (side < 0) - (side > 0)  # point k moves to the left of the split
        if score > best or (score == best and abs(k + 1 - cut) < abs(place - cut)):
            best, place = score, k + 1
    return place


def ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their mean rank (a level without noise is all ties)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    j = 0
    while j < len(order):
        k = j
        while k + 1 < len(order) and values[order[k + 1]] == values[order[j]]:
            k += 1
        mean = (j + k) / 2 + 1
        for n in range(j, k + 1):
            out[order[n]] = mean
        j = k + 1
    return out


def lasting(a: Sequence[float], b: Sequence[float], bar: Bar) -> bool:
    """Whether ``a`` then ``b`` is a change of level: large, clear of the noise, persistent."""
    ma, mb = statistics.median(a), statistics.median(b)
    low, high = min(ma, mb), max(ma, mb)
    if low <= 0 or high - low < bar.min_rise_share * low:
        return False
    spread = MAD_SCALE * statistics.median([abs(v - ma) for v in a] + [abs(v - mb) for v in b])
    error = MEDIAN_EFFICIENCY * spread * math.sqrt(1 / len(a) + 1 / len(b))
    if error > 0 and (high - low) / error < bar.min_z:
        return False
    middle = (ma + mb) / 2
    sign = 1.0 if mb > ma else -1.0
    kept_a = sum(sign * (middle - v) > 0 for v in a) / len(a)
    kept_b = sum(sign * (v - middle) > 0 for v in b) / len(b)
    return kept_a >= bar.persistence and kept_b >= bar.persistence


@dataclass(frozen=True)
class Live:
    """What makes a change in a live window lasting.

    Args:
        min_segment: steps on either side; the rules judge no rank on fewer than 8.
        min_segment_s: seconds on either side (a burst on a busy host is not a change: at 1 s,
            a balanced job's rank slowed for two seconds on this 2-core machine raised a
            compute_straggler warning in 2 of 4 runs of the fault benchmark's control).
        min_rise_share: the job's step changes by this share of the lower level.
        min_z: the change in robust standard errors (noise alone reaches 3 to 4).
        persistence: the share of steps on each side on their side of the midpoint.
        max_changes: changes looked for in one window.
    """

    min_segment: int = 8
    min_segment_s: float = 2.0
    min_rise_share: float = 0.15
    min_z: float = 5.0
    persistence: float = 0.75
    max_changes: int = 3


LIVE = Live()


def latest_change(snapshot: Snapshot, bar: Live = LIVE) -> float | None:
    """When the job's step last changed for good inside ``snapshot``'s window (the end of the
    last step before the new level, on the rank that ended it last), or None: no lasting
    change, or steps that cannot be lined up (a rank without steps, samples that stand for
    several steps).

    The job's step is, per step number every rank took, the median over the ranks of their
    step time: under the collectives' barrier every rank's step is the job's, and a rank that
    turned slow (or a loader that starved) moves it."""
    by_step: dict[int, list[float]] = {}
    spans: dict[int, tuple[float, float]] = {}
    views = [v for v in snapshot.ranks if v.steps]
    if len(views) != len(snapshot.ranks) or not views:
        return None
    for v in views:
        for s in v.steps:
            if s.count != 1:
                return None
            by_step.setdefault(s.step, []).append(s.step_s)
            lo, hi = spans.get(s.step, (math.inf, -math.inf))
            spans[s.step] = (min(lo, s.time - s.step_s), max(hi, s.time))
    steps = sorted(k for k, times in by_step.items() if len(times) == len(views))
    if len(steps) < 2 * bar.min_segment:
        return None
    x = [statistics.median(by_step[k]) for k in steps]
    cuts = changes(x, [spans[k][0] for k in steps], [spans[k][1] for k in steps], bar)
    # The segment is what ends after the last step before the change, on every rank.
    return spans[steps[cuts[-1] - 1]][1] if cuts else None
