"""cpu_oversubscription: more DataLoader workers than the host has free cores.

Metric: per host, the busy cores, the CPU of every rank's main process and the CPU of its
DataLoader workers (psutil, in cores). Free cores for workers = cores - the main processes' CPU.

Decision: the host is at least ``min_host_busy`` busy, the workers of its ranks outnumber its free
cores, and a rank runs more workers than its data needs. A worker can use a whole core, so a rank
whose workers together use ``w`` cores needs ``ceil(margin * w)`` of them; the rest only add
runnable processes, memory (one dataset copy each) and start-up cost to a host that has no CPU
to spare. Counted are ranks whose workers use at least ``min_worker_cpu`` cores together.

I/O-bound workers are not counted: a rank that waits for data (``io_wait_ratio`` of its step or
more) keeps its workers loading all the time, and workers that then use well under the CPU a
CPU-bound process gets on the host (:mod:`auditor.analysis.loading`) wait on storage or the
network; they hold memory, not cores, and lowering them would starve the rank further. Low CPU
per worker alone is no sign of I/O: on a saturated host many CPU-bound workers each get a sliver
of a core, which the fair share accounts for; and the workers of a rank that does not wait for
data sleep on a full queue.

Fix: lower ``num_workers`` to what the data needs and the free cores allow (at least 1); it never
raises it. Predicted speed-up: not predicted. In steady state the same decoding work runs on fewer
processes, so the gain depends on the host's scheduler and caches rather than on anything the
probe measures; the evidence gives the worker memory the fix frees instead. Severity: ``warning``
when the workers outnumber the free cores ``severe_ratio`` times or more, else ``info``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..findings import Finding
from ..loading import IO, fair_share, loading_cost
from ..snapshot import Snapshot


@dataclass(frozen=True)
class Oversubscribed:
    """A blamed rank: its DataLoader workers, the count its data needs and the free cores
    allow, and the CPU its workers use together (cores)."""

    workers: int
    recommended: int
    worker_cpu: float


@dataclass(frozen=True)
class Facts:
    """The saturated host: its cores, busy cores, the cores free for workers, the workers its
    counted ranks run in all, and the blamed ranks."""

    host: str
    cores: float
    busy_cores: float
    free_cores: float
    workers: int
    ranks: Mapping[int, Oversubscribed]


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_host_busy: float = 0.85,
    margin: float = 1.25,
    severe_ratio: float = 2.0,
    min_worker_cpu: float = 0.25,
    min_samples: int = 3,
    io_wait_ratio: float = 0.15,
    io_bound_share: float = 0.25,
) -> list[Finding]:
    """Find hosts whose ranks run more DataLoader workers than there are free cores.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_host_busy: share of the host's cores in use that counts as saturated.
        margin: head-room on the workers a rank's measured worker CPU needs.
        severe_ratio: workers / free cores at which the finding is a warning.
        min_worker_cpu: CPU (cores) a rank's workers must use together to be counted.
        min_samples: host CPU samples needed in the window.
        io_wait_ratio: data wait share of the step from which a rank's workers count as
            loading all the time, so that their CPU can tell I/O-bound from CPU-bound.
        io_bound_share: workers below this share of a CPU-bound process's CPU on the host are
            I/O-bound (see :mod:`auditor.analysis.loading`) and not counted.
    """
    stats = snapshot.ready(min_steps)
    findings: list[Finding] = []
    for host, ranks in sorted(snapshot.hosts().items()):
        sampled = sum(n.samples for n in snapshot.nodes_by_host.get(host, ()))
        cpu = snapshot.host_cpu(host)
        rs = [r for r in ranks if r in stats and (stats[r].worker_cpu or 0.0) >= min_worker_cpu]
        if sampled < min_samples or not rs or cpu is None:
            continue
        io_bound: dict[int, float] = {}
        share: float | None = None
        for r in rs:
            if stats[r].data_wait_ratio < io_wait_ratio:
                continue  # workers that keep up sleep on a full queue: their CPU says nothing
            share = fair_share(snapshot, host) if share is None else share
            cost = loading_cost(snapshot, stats[r], io_bound_share=io_bound_share, share=share)
            if cost.kind == IO and cost.cores is not None:
                io_bound[r] = cost.cores
        rs = [r for r in rs if r not in io_bound]
        if not rs:
            continue
        cores, busy_cores = cpu
        if busy_cores < min_host_busy * cores:
            continue
        mains = {r: stats[r].main_cpu or 0.0 for r in ranks if r in stats}
        free = max(0.0, cores - sum(mains.values()))
        workers = {r: stats[r].workers for r in rs}
        total_workers = sum(workers.values())
        if total_workers <= free:
            continue
        share = free / len(rs)
        target: dict[int, int] = {}
        for r in rs:
            needed = max(1, math.ceil(margin * (stats[r].worker_cpu or 0.0) - 1e-9))
            target[r] = max(1, min(workers[r] - 1, needed, max(1, math.floor(share + 1e-9))))
        blamed = sorted(r for r in rs if workers[r] > target[r] and workers[r] > 1)
        if not blamed:
            continue
        ratio = total_workers / max(free, 0.5)
        severity = "warning" if ratio >= severe_ratio else "info"
        over: dict[int, Oversubscribed] = {}
        freed: dict[str, int | None] = {}
        for r in blamed:
            over[r] = Oversubscribed(workers[r], target[r], stats[r].worker_cpu or 0.0)
            rss = _worker_rss(snapshot, r)
            # RSS counts pages shared with the rank, so this is an upper bound.
            freed[str(r)] = (
                None if rss is None else int(rss * (workers[r] - target[r]) / max(1, workers[r]))
            )
        evidence = {
            "host": host,
            "cores": cores,
            "busy_cores": round(busy_cores, 2),
            "free_cores_for_workers": round(free, 2),
            "main_cpu": {str(r): round(v, 2) for r, v in sorted(mains.items())},
            "workers": {str(r): v for r, v in sorted(workers.items())},
            "worker_cpu": {str(r): round(stats[r].worker_cpu or 0.0, 2) for r in rs},
            "recommended_workers": {str(r): target[r] for r in blamed},
            "worker_rss_removed_bytes_at_most": freed,
            # Workers left out: they wait on I/O (cores each while loading).
            "io_bound_workers_cpu_each": {str(r): round(v, 3) for r, v in sorted(io_bound.items())},
            "speedup_model": "not predicted: the same decoding work runs on fewer processes",
        }
        findings.append(
            Finding(
                kind="cpu_oversubscription",
                severity=severity,
                ranks=tuple(blamed),
                facts=Facts(host, cores, busy_cores, free, total_workers, over),
                evidence=evidence,
                predicted_speedup=None,
            )
        )
    return findings


def _worker_rss(snapshot: Snapshot, rank: int) -> int | None:
    """The latest total RSS of a rank's DataLoader workers, if sampled."""
    for view in snapshot.ranks:
        if view.info.rank == rank:
            for c in reversed(view.cpu):
                if c.worker_rss_bytes is not None:
                    return c.worker_rss_bytes
    return None
