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

from .stats import RankStats


def comm_floor(stats: Mapping[int, RankStats]) -> float:
    waits = [s.collective_wait_s for s in stats.values() if s.collective_wait_s is not None]
    return min(waits) if waits else 0.0


def job_step_s(stats: Mapping[int, RankStats], local: Mapping[int, float] | None = None) -> float:
    """Job step time under the barrier model, with ``local`` overriding ranks' local times."""
    if not stats:
        return 0.0
    local = local or {}
    slowest = max(local.get(r, s.local_s) for r, s in stats.items())
    floor = comm_floor(stats)
    return slowest + floor


def predicted_speedup(stats: Mapping[int, RankStats], new_local: Mapping[int, float]) -> float:
    """Speed-up of the job if the ranks in ``new_local`` had those local step times."""
    before = job_step_s(stats)
    after = job_step_s(stats, new_local)
    if after <= 0 or before <= 0:
        return 1.0
    return max(1.0, before / after)
