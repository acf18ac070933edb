"""Measurements the constructed DDP jobs (:mod:`tests.helpers.jobs`) do not model, set on a
snapshot afterwards: the main thread's CPU during the data wait, collective waits by operation,
process and worker memory, the host's load average and available memory.

Each helper returns a new :class:`Snapshot` (its statistics are computed on first use, so they
see the change). Values are real-shaped: what the probe and the node agent send.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from auditor.analysis.snapshot import RankView, Snapshot
from auditor.samples import MemoryBudget, StepSample

GIB = 1 << 30


def _views(snap: Snapshot, rank: int, change: Callable[[RankView], RankView]) -> Snapshot:
    views = tuple(change(v) if v.info.rank == rank else v for v in snap.ranks)
    return replace(snap, ranks=views)


def steps_of(snap: Snapshot, rank: int, change: Callable[[StepSample], StepSample]) -> Snapshot:
    """Every step sample of ``rank`` passed through ``change``."""
    return _views(snap, rank, lambda v: replace(v, steps=tuple(change(s) for s in v.steps)))


def data_cpu(snap: Snapshot, rank: int, share: float) -> Snapshot:
    """The main thread's CPU during the data wait as ``share`` of that wait (thread_time)."""
    return steps_of(snap, rank, lambda s: replace(s, data_cpu_s=s.data_wait_s * share))


def collective_ops(snap: Snapshot, rank: int, ops: Mapping[str, float]) -> Snapshot:
    """Split ``rank``'s measured collective wait over operations in these proportions."""
    total = sum(ops.values())

    def split(s: StepSample) -> StepSample:
        wait = s.collective_wait_s or 0.0
        return replace(s, collective_ops={op: wait * w / total for op, w in ops.items()})

    return steps_of(snap, rank, split)


def process_memory(
    snap: Snapshot, rank: int, *, rss: int | None, worker_rss: int | None = None
) -> Snapshot:
    """The node agent's RSS of ``rank``'s main process and of its workers together."""
    return _views(
        snap,
        rank,
        lambda v: replace(
            v, cpu=tuple(replace(c, rss_bytes=rss, worker_rss_bytes=worker_rss) for c in v.cpu)
        ),
    )


def host_available(snap: Snapshot, rank: int, available: int, total: int = 64 * GIB) -> Snapshot:
    """A memory budget from ``rank`` reporting the host's available memory."""
    budget = MemoryBudget(
        rank=rank, time=snap.end, step=0, host_total_bytes=total, host_available_bytes=available
    )
    return _views(snap, rank, lambda v: replace(v, memory=budget))


def load_average(snap: Snapshot, load1: float) -> Snapshot:
    """Every node sample with this 1-minute load average."""
    return replace(snap, nodes=tuple(replace(n, load1=load1) for n in snap.nodes))
