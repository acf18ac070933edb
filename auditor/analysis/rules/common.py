"""Small helpers shared by the rules (selection of ranks with enough data, peer medians)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping

from ..stats import RankStats


def ready(stats: Mapping[int, RankStats], min_steps: int) -> dict[int, RankStats]:
    """Ranks with at least ``min_steps`` steps in the window; rules stay silent on the rest."""
    return {r: s for r, s in stats.items() if s.steps >= min_steps and s.step_s > 0}


def peer_median(values: Mapping[int, float], rank: int) -> float | None:
    peers = [v for r, v in values.items() if r != rank]
    return float(statistics.median(peers)) if peers else None


def ranks_text(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def with_expectation(fix: str, speedup: float | None) -> str:
    if speedup is None or speedup < 1.02:
        return fix
    return f"{fix}; expect about {speedup:.1f}x"
