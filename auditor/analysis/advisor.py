"""What-if arithmetic under the DDP barrier model, shared by every rule.

Model: every step ends at a barrier (the gradient all-reduce), so the job advances at the pace
of its slowest rank. A rank's *local* time is its step time minus what it waited for its peers
at the collective. The job's step time is ``max(local) + floor``, where ``floor`` is the
communication cost nobody can avoid (the least any rank waited). A fix changes the local time
of the ranks it touches; the predicted speed-up is the ratio of the two job step times.

Assumptions: phases are additive within a step (no overlap of data loading with compute beyond
what DataLoader workers already provide) and a fix does not change communication cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter

from .stats import RankStats

# Attribute reads in C: the rules ask for a what-if several times an evaluation, over every rank.
_LOCAL_S = attrgetter("local_s")
_WAIT_S = attrgetter("collective_wait_s")


def comm_floor(stats: Mapping[int, RankStats]) -> float:
    waits = [w for w in map(_WAIT_S, stats.values()) if w is not None]
    return min(waits) if waits else 0.0


def job_step_s(stats: Mapping[int, RankStats], local: Mapping[int, float] | None = None) -> float:
    """Job step time under the barrier model, with ``local`` overriding ranks' local times
    (ranks of ``local`` not in ``stats`` are not in the job)."""
    if not stats:
        return 0.0
    times = dict(zip(stats, map(_LOCAL_S, stats.values()), strict=True))
    if local:
        times.update((r, t) for r, t in local.items() if r in times)
    return max(times.values()) + comm_floor(stats)


def predicted_speedup(stats: Mapping[int, RankStats], new_local: Mapping[int, float]) -> float:
    """Speed-up of the job if the ranks in ``new_local`` had those local step times."""
    before = job_step_s(stats)
    after = job_step_s(stats, new_local)
    if after <= 0 or before <= 0:
        return 1.0
    return max(1.0, before / after)


@dataclass(frozen=True)
class Barrier:
    """The barrier model's figures, measured once: each rank's local time and the floor (the
    least any rank waited at the collectives). What a rule's ``decide`` asks its what-ifs of."""

    local: Mapping[int, float]
    floor: float

    @classmethod
    def of(cls, stats: Mapping[int, RankStats]) -> Barrier:
        return cls(dict(zip(stats, map(_LOCAL_S, stats.values()), strict=True)), comm_floor(stats))

    def step_s(self, new_local: Mapping[int, float] | None = None) -> float:
        """Job step time, with ``new_local`` overriding ranks' local times."""
        if not self.local:
            return 0.0
        if not new_local:
            return max(self.local.values()) + self.floor
        times = dict(self.local)
        times.update((r, t) for r, t in new_local.items() if r in times)
        return max(times.values()) + self.floor

    def speedup(self, new_local: Mapping[int, float]) -> float:
        """Speed-up of the job if the ranks in ``new_local`` had those local step times."""
        before, after = self.step_s(), self.step_s(new_local)
        if after <= 0 or before <= 0:
            return 1.0
        return max(1.0, before / after)
