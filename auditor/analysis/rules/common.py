"""Small helpers shared by the rules (selection of ranks with enough data, peer medians)."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping
from typing import Any

from auditor.wording import ranks_text as ranks_text

from ..stats import RankStats


def ready(stats: Mapping[int, RankStats], min_steps: int) -> dict[int, RankStats]:
    """Ranks with at least ``min_steps`` steps in the window; rules stay silent on the rest."""
    return {r: s for r, s in stats.items() if s.steps >= min_steps and s.step_s > 0}


def peer_median(values: Mapping[int, float], rank: int) -> float | None:
    """Median of every value but ``rank``'s (None without peers); for one rank. To ask for every
    rank, build :class:`PeerMedians` once: this is O(n) per call."""
    peers = [v for r, v in values.items() if r != rank]
    return float(statistics.median(peers)) if peers else None


class PeerMedians:
    """The median of each key's peers (every other key's value), for all keys in O(n log n).

    Rules compare every rank with its peers; doing that with a fresh median per rank is
    quadratic and took seconds at 4,096 ranks. Values are sorted once; a key's peer median is the
    median of that order without the key's own element, read off by index. ``None`` values are
    not measurements and count for nobody.
    """

    def __init__(self, values: Mapping[Any, float | None]) -> None:
        self._values = {k: float(v) for k, v in values.items() if v is not None}
        self._sorted = sorted(self._values.values())

    def get(self, key: object) -> float | None:
        """Median of the values of every key but ``key`` (all of them if ``key`` has none)."""
        order = self._sorted
        if key not in self._values:
            return float(statistics.median(order)) if order else None
        m = len(order) - 1
        if m <= 0:
            return None
        # Removing any element equal to the key's value leaves the same multiset.
        i = bisect.bisect_left(order, self._values[key])

        def at(k: int) -> float:
            return order[k] if k < i else order[k + 1]

        if m % 2:
            return at(m // 2)
        return (at(m // 2 - 1) + at(m // 2)) / 2


def with_expectation(fix: str, speedup: float | None) -> str:
    if speedup is None or speedup < 1.02:
        return fix
    return f"{fix}; expect about {speedup:.1f}x"
