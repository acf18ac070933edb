"""Loading cost: what a rank's data loading costs in CPU, and whether it waits on I/O or the CPU.

Metric, per rank: the wall time one loader takes to produce one batch (``load_s``), the CPU that
batch costs (``cpu_s``), and their ratio, the cores the loading used while it loaded:

* ``num_workers == 0``: the main process loads while the rank waits, so the load time is the
  data wait itself and its CPU is the main thread's CPU during that wait (``data_cpu_s``, the
  probe's ``thread_time`` around the loader's ``__next__``);
* ``a`` workers: psutil measures each worker's CPU (cores). A worker that cannot keep up loads
  all the time, delivering one batch per ``load_s = a * step`` (the rank consumes one batch
  per step), at ``cpu_s = (its cores) * load_s``. ``step`` is the rank's mean step
  (:attr:`RankStats.mean_step_s`), not a median: such workers deliver in rounds of ``a``
  batches, so the steps alternate one long wait with ``a - 1`` short steps, and a median lands
  on either kind (2 workers at 200 ms a batch: steps of 36 and 165 ms, whose weighted median,
  155 ms, read ``load_s`` as 311 ms). Only for a rank that waits for data: a worker that keeps
  up sleeps on a full queue, and its low CPU then says nothing about I/O.

Decision: loading is I/O-bound when it used less than ``io_bound_share`` of the CPU a CPU-bound
loader would get on its host (it sat waiting on storage or the network), CPU-bound otherwise,
unknown where its CPU was not measured. Where the workers' run-queue delay was measured (the
kernel's count of the time a process was runnable but waited for a core, ``wait_s`` per batch),
workers that waited for a core at least as long as they ran are CPU-bound, short of cores,
however little CPU they got: they were not waiting on storage, and more workers would queue
for the same cores. (The wait only ever turns I/O into CPU: workers that keep up most of the
time use little CPU and wait little, and the fair share judges them as before.)

What a CPU-bound loader gets (``fair_share``): one core, unless the host's runnable work
outnumbers its cores; then ``cores / competitors``, or the idle cores where more are idle (a
CPU-bound loader would have taken them). Competitors are the job's processes on the
host, each counting as many as the cores it uses (at least one: a process that may run competes),
plus the busy cores no job process explains (other jobs), or the 1-minute load average where that
is higher. This is why low CPU per worker on a saturated host is not taken for I/O at face value:
eight CPU-bound workers sharing two free cores each get a sliver, and that sliver is their fair
share, not a sign of waiting on storage.

Assumptions: one loader (the main thread or a worker) loads one batch at a time; with
``num_workers == 0`` the loading runs on the main thread (a dataset that decodes on a thread pool
of its own reads as I/O-bound); the load average counts runnable processes (on Linux it also
counts processes in uninterruptible disk sleep, which only makes the share smaller and the
verdict lean to CPU-bound).

:class:`HostBound` is the other side: the least step a host's cores allow once its starved
ranks are fed and their loading moved to workers (data_starvation builds it).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .snapshot import Snapshot
from .stats import RankStats

IO = "io"
CPU = "cpu"
UNKNOWN = "unknown"
# What made the verdict UNKNOWN: the main thread's CPU during the data wait, the DataLoader
# workers' CPU (not measured), or no data wait to judge.
MAIN_THREAD_CPU = "main_thread_cpu"
WORKERS_CPU = "workers_cpu"
NO_DATA_WAIT = "no_data_wait"


@dataclass(frozen=True)
class LoadingCost:
    """One rank's loading: its load time and CPU per batch, and the verdict they give."""

    rank: int
    # Loaders: DataLoader workers, or 0 where the main process loads.
    workers: int
    # Wall seconds one loader takes per batch.
    load_s: float
    # CPU seconds one batch costs; None where not measured.
    cpu_s: float | None
    # Cores a CPU-bound loader would get on the rank's host (<= 1).
    fair_share: float
    # IO, CPU or UNKNOWN.
    kind: str
    # What could not be measured (MAIN_THREAD_CPU, WORKERS_CPU, NO_DATA_WAIT; empty when
    # everything was).
    missing: str = ""
    # Seconds one loader spent per batch runnable but waiting for a core; None: not measured
    # (the main process's loading, whose wait is not told apart from its step's).
    wait_s: float | None = None

    @property
    def cores(self) -> float | None:
        """CPU the loading used while it loaded (cores); None where not measured."""
        if self.cpu_s is None or self.load_s <= 0:
            return None
        return self.cpu_s / self.load_s

    @property
    def demand(self) -> float | None:
        """Cores the loading wanted while it loaded: what it used and what it waited for (its
        ``cores`` where its wait was not measured)."""
        cores = self.cores
        if cores is None or self.wait_s is None:
            return cores
        return cores + self.wait_s / self.load_s

    @property
    def short_of_cores(self) -> bool:
        """It waited for a core at least as long as it ran (measured)."""
        return self.wait_s is not None and self.cpu_s is not None and self.wait_s >= self.cpu_s

    @property
    def share_used(self) -> float | None:
        """``cores`` as a share of what a CPU-bound loader would get here."""
        cores = self.cores
        return None if cores is None else cores / max(1e-9, self.fair_share)

    def evidence(self) -> dict[str, object]:
        """The figures and the verdict, for a finding's evidence (the report words them)."""
        out: dict[str, object] = {
            "kind": self.kind,
            "loaders": max(1, self.workers),
            "load_per_batch_ms": round(self.load_s * 1e3, 1),
            "cpu_per_batch_ms": None if self.cpu_s is None else round(self.cpu_s * 1e3, 1),
            "cores_while_loading": None if self.cores is None else round(self.cores, 3),
            "cpu_share_available": round(self.fair_share, 3),
        }
        if self.wait_s is not None:  # where the kernel's run-queue delay was read
            out["core_wait_per_batch_ms"] = round(self.wait_s * 1e3, 1)
        return out


def fair_share(snapshot: Snapshot, host: str) -> float:
    """Cores one CPU-bound process would get on ``host`` (1.0 where the host was not sampled or
    has cores to spare); see the module docstring."""
    cpu = snapshot.host_cpu(host)
    if cpu is None:
        return 1.0
    cores, busy = cpu
    competitors = 0.0
    explained = 0.0
    stats = snapshot.stats
    for rank in snapshot.hosts().get(host, ()):
        s = stats.get(rank)
        if s is None:
            continue
        main = s.main_cpu or 0.0
        competitors += max(1.0, main)
        explained += main
        each = s.worker_cpu_each
        if s.workers > 0:
            competitors += s.workers * max(1.0, each or 0.0)
            explained += s.worker_cpu or 0.0
    competitors += max(0.0, busy - explained)
    samples = snapshot.nodes_by_host.get(host, ())
    load = statistics.median(n.load1 for n in samples) if samples else 0.0
    competitors = max(competitors, load)
    # Idle cores are there for the taking: a CPU-bound loader would have used them.
    share = max(cores - busy, cores / competitors if competitors > 0 else 1.0)
    return max(1e-3, min(1.0, share))


def loading_cost(
    snapshot: Snapshot,
    s: RankStats,
    *,
    io_bound_share: float = 0.25,
    share: float | None = None,
) -> LoadingCost:
    """The loading cost of rank ``s`` (see the module docstring).

    Args:
        io_bound_share: loading that used less than this share of the CPU a CPU-bound loader
            would get on its host counts as I/O-bound (0.25 = a quarter).
        share: the host's :func:`fair_share`, where the caller computed it once for the host.
    """
    # The DataLoader's setting; where the probe never saw the loader, the workers seen.
    workers = s.loader.num_workers if s.loader else s.workers
    if share is None:
        share = fair_share(snapshot, s.host)
    wait_s = None
    if workers == 0:
        load_s = s.data_wait_s
        cpu_s = None if s.data_cpu_s is None else min(s.data_cpu_s, s.data_wait_s)
        missing = "" if cpu_s is not None else MAIN_THREAD_CPU
    else:
        # The pace, a mean over the workers' rounds: a median lands on a long or a short step.
        load_s = workers * (s.step_s if s.mean_step_s is None else s.mean_step_s)
        each = s.worker_cpu_each
        cpu_s = None if each is None else each * load_s
        missing = "" if cpu_s is not None else WORKERS_CPU
        waits = s.worker_wait_each
        # At most the load time: a worker cannot wait for a core longer than it loads.
        wait_s = None if waits is None or cpu_s is None else min(waits * load_s, load_s - cpu_s)
    if cpu_s is None or load_s <= 0:
        kind = UNKNOWN
    elif cpu_s / load_s < io_bound_share * share and (wait_s is None or wait_s < cpu_s):
        kind = IO
    else:
        kind = CPU
    return LoadingCost(
        rank=s.rank,
        workers=workers,
        load_s=load_s,
        cpu_s=cpu_s,
        fair_share=share,
        kind=kind,
        missing=missing or (NO_DATA_WAIT if load_s <= 0 else ""),
        wait_s=None if wait_s is None else max(0.0, wait_s),
    )


def host_available_bytes(snapshot: Snapshot, host: str) -> int | None:
    """The host's available memory as its ranks last measured it (the least reported, since
    they share it); None where no rank on the host reported a memory budget."""
    seen = [
        v.memory.host_available_bytes
        for v in snapshot.ranks
        if v.info.host == host
        and v.memory is not None
        and v.memory.host_available_bytes is not None
    ]
    return min(seen) if seen else None


@dataclass(frozen=True)
class HostBound:
    """The least step a host's cores allow once its starved ranks are fed. ``cpu_s``: the
    CPU-seconds a step needs there (every rank's work and the loading) on its ``cores``, less
    ``others``: the busy cores no rank's process explains. Where the loading is CPU-bound
    (``loading_s`` on ``loaders`` new workers), the scheduler shares the cores evenly among
    everything that wants one: while the ``ranks`` work (``work_s``, the longest), each worker
    gets its share with them, and it finishes its batch alone once they wait for it
    (:meth:`step_s`)."""

    host: str
    cpu_s: float
    cores: float
    others: float = 0.0
    ranks: int = 0
    work_s: float = 0.0
    loading_s: float = 0.0
    loaders: int = 0

    def step_s(self, *, others: bool = True) -> float:
        """The least step, with the unexplained busy cores kept busy (``others``) or not."""
        cores = self.cores - (self.others if others else 0.0)
        if cores <= 0:
            return math.inf
        packed = self.cpu_s / cores
        if self.loaders <= 0 or self.loading_s <= 0 or self.work_s <= 0:
            return packed
        together = min(1.0, cores / (self.ranks + self.loaders))
        working = self.work_s / together
        left = self.loading_s - self.loaders * together * working
        alone = self.loaders * min(1.0, cores / self.loaders)
        return max(packed, working + max(0.0, left) / alone)

    def evidence(self) -> dict[str, object]:
        return {
            "host": self.host,
            "cpu_per_step_ms": round(self.cpu_s * 1e3, 1),
            "cores": round(self.cores, 2),
            "others_cores": round(self.others, 2),
            "step_ms": round(self.step_s(others=False) * 1e3, 1),
            "step_with_others_ms": round(self.step_s() * 1e3, 1),
        }


def work_cpu(main: float, step_s: float, work_s: float) -> float:
    """A fed rank's CPU-seconds per step of its own work: its main process's cores over the
    step, at most its own work's time (the CPU it spends waiting at a collective, polling, does
    not scale with the step; a rank whose work runs on several threads is counted at one)."""
    return min(main * step_s, work_s)
