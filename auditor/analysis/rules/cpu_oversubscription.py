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
raises it (a ``num_workers`` :class:`~auditor.analysis.fixes.Fix` per blamed rank). Predicted
speed-up: not predicted (the evidence's ``speedup_model`` is :data:`NOT_PREDICTED`). In steady
state the same decoding work runs on fewer processes, so the gain depends on the host's scheduler
and caches rather than on anything the probe measures; the evidence gives the worker memory the
fix frees instead. Severity: ``warning`` when the workers outnumber the free cores
``severe_ratio`` times or more, else ``info``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..findings import Finding
from ..fixes import Fix
from ..loading import IO, fair_share, loading_cost
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "cpu_oversubscription"
# The evidence's ``speedup_model``: no speed-up is predicted (the report words why).
NOT_PREDICTED = "not_predicted"


@dataclass(frozen=True)
class Thresholds:
    """Args:
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

    min_steps: int = 8
    min_host_busy: float = 0.85
    margin: float = 1.25
    severe_ratio: float = 2.0
    min_worker_cpu: float = 0.25
    min_samples: int = 3
    io_wait_ratio: float = 0.15
    io_bound_share: float = 0.25


@dataclass(frozen=True)
class Inputs:
    """Per saturated host (``min_samples`` CPU samples, ``min_host_busy`` busy; sorted): its
    ranks (in the snapshot's order), its CPU samples in the window and its ``(cores, busy
    cores)``. Per rank on those hosts ready to judge (at its pace): its DataLoader workers, their
    CPU together (None: unmeasured) and its main process's CPU; for the ranks whose workers use
    ``min_worker_cpu`` or more: its data wait share, the latest RSS of its workers (None: never
    sampled) and, where it waits for data ``io_wait_ratio`` of its step or more and its loading
    is I/O-bound, the cores the loading used while it loaded (:mod:`auditor.analysis.loading`)."""

    hosts: Mapping[str, tuple[int, ...]]
    host_samples: Mapping[str, int]
    host_cpu: Mapping[str, tuple[float, float] | None]
    workers: Mapping[int, int]
    worker_cpu: Mapping[int, float | None]
    main_cpu: Mapping[int, float | None]
    data_wait_ratio: Mapping[int, float]
    worker_rss: Mapping[int, int | None]
    io_bound: Mapping[int, float]


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


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    if not stats:
        return None
    nodes = snapshot.nodes_by_host
    host_samples: dict[str, int] = {}
    host_cpu: dict[str, tuple[float, float] | None] = {}
    hosts: dict[str, tuple[int, ...]] = {}
    for host, ranks in sorted(snapshot.hosts().items()):
        samples = sum(n.samples for n in nodes.get(host, ()))
        cpu = snapshot.host_cpu(host)
        # Only saturated hosts are judged (the test ``decide`` applies): the others' ranks are
        # not measured further.
        if samples < t.min_samples or cpu is None or cpu[1] < t.min_host_busy * cpu[0]:
            continue
        hosts[host], host_samples[host], host_cpu[host] = tuple(ranks), samples, cpu
    if not hosts:
        return None
    mine = {r: stats[r] for ranks in hosts.values() for r in ranks if r in stats}
    counted = {r: s for r, s in mine.items() if (s.worker_cpu or 0.0) >= t.min_worker_cpu}
    wait_ratio = {r: s.data_wait_ratio for r, s in counted.items()}
    # The loading of counted ranks that wait for data, where their workers could be I/O-bound:
    # judged against the fair share of their host (computed once per host).
    shares: dict[str, float] = {}
    io_bound: dict[int, float] = {}
    for r, s in counted.items():
        if wait_ratio[r] < t.io_wait_ratio:
            continue
        share = shares.get(s.host)
        if share is None:
            share = shares[s.host] = fair_share(snapshot, s.host)
        cost = loading_cost(snapshot, s, io_bound_share=t.io_bound_share, share=share)
        if cost.kind == IO and cost.cores is not None:
            io_bound[r] = cost.cores
    return Inputs(
        hosts=hosts,
        host_samples=host_samples,
        host_cpu=host_cpu,
        workers={r: s.workers for r, s in mine.items()},
        worker_cpu={r: s.worker_cpu for r, s in mine.items()},
        main_cpu={r: s.main_cpu for r, s in mine.items()},
        data_wait_ratio=wait_ratio,
        worker_rss=_worker_rss(snapshot, counted),
        io_bound=io_bound,
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find hosts whose ranks run more DataLoader workers than there are free cores."""
    findings: list[Finding] = []
    for host, ranks in i.hosts.items():
        cpu = i.host_cpu[host]
        rs = [r for r in ranks if r in i.workers and (i.worker_cpu[r] or 0.0) >= t.min_worker_cpu]
        if i.host_samples[host] < t.min_samples or not rs or cpu is None:
            continue
        # Workers of a rank that waits for data and that use well under a CPU-bound share wait
        # on I/O: not counted.
        io_bound = {
            r: i.io_bound[r]
            for r in rs
            if i.data_wait_ratio[r] >= t.io_wait_ratio and r in i.io_bound
        }
        rs = [r for r in rs if r not in io_bound]
        if not rs:
            continue
        cores, busy_cores = cpu
        if busy_cores < t.min_host_busy * cores:
            continue
        mains = {r: i.main_cpu[r] or 0.0 for r in ranks if r in i.workers}
        free = max(0.0, cores - sum(mains.values()))
        workers = {r: i.workers[r] for r in rs}
        total_workers = sum(workers.values())
        if total_workers <= free:
            continue
        share = free / len(rs)
        target: dict[int, int] = {}
        for r in rs:
            needed = max(1, math.ceil(t.margin * (i.worker_cpu[r] or 0.0) - 1e-9))
            target[r] = max(1, min(workers[r] - 1, needed, max(1, math.floor(share + 1e-9))))
        blamed = sorted(r for r in rs if workers[r] > target[r] and workers[r] > 1)
        if not blamed:
            continue
        ratio = total_workers / max(free, 0.5)
        severity = "warning" if ratio >= t.severe_ratio else "info"
        over: dict[int, Oversubscribed] = {}
        freed: dict[str, int | None] = {}
        for r in blamed:
            over[r] = Oversubscribed(workers[r], target[r], i.worker_cpu[r] or 0.0)
            rss = i.worker_rss[r]
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
            "worker_cpu": {str(r): round(i.worker_cpu[r] or 0.0, 2) for r in rs},
            "recommended_workers": {str(r): target[r] for r in blamed},
            "worker_rss_removed_bytes_at_most": freed,
            # Workers left out: they wait on I/O (cores each while loading).
            "io_bound_workers_cpu_each": {str(r): round(v, 3) for r, v in sorted(io_bound.items())},
            "speedup_model": NOT_PREDICTED,
        }
        findings.append(
            Finding(
                kind=KIND,
                severity=severity,
                ranks=tuple(blamed),
                facts=Facts(host, cores, busy_cores, free, total_workers, over),
                evidence=evidence,
                predicted_speedup=None,
                fixes=tuple(
                    Fix("num_workers", r, workers[r], target[r], None, (KIND,)) for r in blamed
                ),
            )
        )
    return findings


def _worker_rss(snapshot: Snapshot, ranks: Collection[int]) -> dict[int, int | None]:
    """The latest total RSS of the DataLoader workers of each of ``ranks``, where sampled."""
    out: dict[int, int | None] = dict.fromkeys(ranks)
    for view in snapshot.ranks:
        r = view.info.rank
        if r not in out or out[r] is not None:
            continue
        out[r] = next(
            (c.worker_rss_bytes for c in reversed(view.cpu) if c.worker_rss_bytes is not None),
            None,
        )
    return out


RULE = Rule(
    kind=KIND,
    place=10,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
)
