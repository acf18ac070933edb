"""How many DataLoader workers a starved rank can use: the workers that would keep up with its
steps, capped by the cores their loading may take (CPU-bound loading; I/O-bound workers wait
on storage and need memory, not cores), by the host's available memory and by a bound; and the
wait the plan leaves. What ``data_starvation`` sizes its ``num_workers`` fix with (its module
doc has the arithmetic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .loading import IO, LoadingCost

# What capped a worker plan: the free cores, the cores where the host was never sampled (one
# assumed), the host's available memory, or ``max_workers``.
CORES = "cores"
CORES_ASSUMED = "cores_assumed"
MEMORY = "memory"
MAX_WORKERS = "max_workers"
# What one worker's memory was read from: the workers' RSS, or the main process's (at most what
# a forked worker holds).
WORKERS_RSS = "workers_rss"
MAIN_RSS = "main_rss"


@dataclass(frozen=True)
class WorkerMemory:
    """What the host's memory allows: one worker's RSS and the workers that fit."""

    per_worker_bytes: float
    basis: str  # WORKERS_RSS or MAIN_RSS
    available_bytes: int
    room: int

    def evidence(self) -> dict[str, object]:
        return {
            "per_worker_bytes": round(self.per_worker_bytes),
            "per_worker_basis": self.basis,
            "host_available_bytes": self.available_bytes,
            "workers_that_fit": self.room,
        }


@dataclass(frozen=True)
class WorkerPlan:
    """How many workers (None: none fit), how many would keep up, what limits the count, and
    the wait they should leave."""

    workers: int | None
    wanted: int
    limit: str | None
    expected_wait_s: float

    @property
    def capped(self) -> bool:
        return self.workers is None or self.workers < self.wanted


def memory_room(
    each: float, basis: str, available: int | None, *, starved_on_host: int, memory_share: float
) -> WorkerMemory | None:
    """Workers the host's ``available`` memory holds for this rank (its share of the
    ``memory_share`` of it among the host's starved ranks); None where unmeasured."""
    if available is None or each <= 0:
        return None
    room = int(memory_share * available / max(1, starved_on_host) / each)
    return WorkerMemory(per_worker_bytes=each, basis=basis, available_bytes=available, room=room)


def worker_plan(
    wait_s: float,
    work_s: float,
    cost: LoadingCost,
    job_pace: float,
    free_cores: float | None,
    memory: WorkerMemory | None,
    *,
    margin: float,
    max_workers: int,
) -> WorkerPlan:
    current = cost.workers
    target = max(work_s, job_pace)
    wanted = max(current + 1, math.ceil(margin * cost.load_s / target - 1e-9))
    caps: list[tuple[int, str]] = [(max_workers, MAX_WORKERS)]
    if cost.kind != IO:  # I/O-bound workers wait on storage: they need memory, not cores
        room = 1.0 if free_cores is None else free_cores
        # What a worker would use given its core (a starved one waited for the rest).
        each = cost.demand if cost.demand else 1.0
        limit = CORES if free_cores is not None else CORES_ASSUMED
        caps.append((int(room / max(each, 1e-3) + 1e-9), limit))
    if memory is not None:
        caps.append((current + memory.room, MEMORY))
    cap, limit = min(caps, key=lambda c: c[0])
    workers = min(wanted, cap)
    if workers <= current:
        return WorkerPlan(None, wanted, limit, 0.0)
    expected = max(0.0, cost.load_s / workers - work_s)
    return WorkerPlan(workers, wanted, limit, min(expected, wait_s))


def cheaper_wait(wait_s: float, work_s: float, cost: LoadingCost, factor: float) -> float:
    """The data wait left if loading took ``1 / factor`` of its time with today's loaders."""
    load = cost.load_s / max(1.0, factor)
    if cost.workers == 0:
        return min(wait_s, load)  # the main process loads while the rank waits
    return min(wait_s, max(0.0, load / cost.workers - work_s))
