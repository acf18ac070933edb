"""Host sampling with psutil: CPU of each rank's main process and of its DataLoader workers, the
time each waited for a core (the kernel's run-queue delay), and the node's cores, busy cores and
load.

OS access comes in as parameters (a process factory, a CPU reader, a core counter, a load
reader, a clock) so tests feed real-shaped values without patching psutil.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from auditor.samples import NodeCpu, ProcessCpu


class ProcessLike(Protocol):
    pid: int

    def cpu_percent(self, interval: float | None = None) -> float: ...

    def children(self, recursive: bool = False) -> list[Any]: ...

    def memory_info(self) -> Any: ...

    def is_running(self) -> bool: ...


def available_cores(
    *,
    affinity: Callable[[], Iterable[int]] | None = None,
    cgroup_cpu_max: str = "/sys/fs/cgroup/cpu.max",
) -> float:
    """Cores this host lets us use: CPU affinity, lowered by a cgroup v2 quota if one is set."""
    try:
        cores = float(len(list(affinity() if affinity else os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        cores = float(os.cpu_count() or 1)
    try:
        with open(cgroup_cpu_max) as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, float(quota) / float(period))
    except (OSError, ValueError):
        pass
    return max(cores, 0.01)


def run_delay_s(pid: int) -> float | None:
    """Seconds the main thread of ``pid`` has spent runnable but waiting for a core since it
    started (Linux ``/proc/<pid>/schedstat``, its second field, in ns); None where the kernel
    keeps no such count or the process is gone."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class _Tracked:
    rank: int
    proc: ProcessLike
    workers: dict[int, ProcessLike]
    declared_workers: tuple[int, ...] = ()


class HostSampler:
    """Samples the registered ranks' processes and the node, once per :meth:`sample` call.

    psutil's ``cpu_percent`` measures since the previous call on the same ``Process`` object, so
    objects are kept between calls; a worker seen for the first time reports from its second
    sample on.
    """

    def __init__(
        self,
        *,
        host: str | None = None,
        process: Callable[[int], ProcessLike] = psutil.Process,  # type: ignore[assignment]
        system_cpu_percent: Callable[[], float] = lambda: psutil.cpu_percent(interval=None),
        logical_cpus: Callable[[], int] = lambda: psutil.cpu_count() or 1,
        cores: Callable[[], float] = available_cores,
        loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
        clock: Callable[[], float] = time.time,
        run_delay: Callable[[int], float | None] = run_delay_s,
    ) -> None:
        self.host = host or socket.gethostname()
        self._process = process
        self._system_cpu = system_cpu_percent
        self._logical = logical_cpus
        self._cores = cores
        self._loadavg = loadavg
        self._clock = clock
        self._run_delay = run_delay
        # The last run-queue delay read of each process: (time, seconds).
        self._delays: dict[int, tuple[float, float]] = {}
        self._tracked: dict[int, _Tracked] = {}
        self._system_cpu()  # prime: the first reading is since boot otherwise

    def track(self, rank: int, pid: int) -> None:
        t = self._tracked.get(rank)
        if t is not None and t.proc.pid == pid:
            return
        try:
            proc = self._process(pid)
            proc.cpu_percent(None)
        except (psutil.Error, OSError):
            return
        self._tracked[rank] = _Tracked(rank=rank, proc=proc, workers={})

    def set_workers(self, rank: int, pid: int, worker_pids: tuple[int, ...]) -> None:
        """The probe told us its DataLoader worker PIDs (exact, unlike guessing from children)."""
        self.track(rank, pid)
        t = self._tracked.get(rank)
        if t is not None:
            t.declared_workers = worker_pids

    def forget(self, rank: int) -> None:
        self._tracked.pop(rank, None)

    def _wait(self, pid: int, now: float, seen: dict[int, tuple[float, float]]) -> float | None:
        """The run-queue delay of ``pid`` per second since its last read (None: its first
        read, or none to read); the read is kept in ``seen``."""
        delay = self._run_delay(pid)
        if delay is None:
            return None
        last = self._delays.get(pid)
        seen[pid] = (now, delay)
        if last is None or now <= last[0]:
            return None
        return max(0.0, delay - last[1]) / (now - last[0])

    def sample(self) -> tuple[list[ProcessCpu], NodeCpu]:
        now = self._clock()
        out: list[ProcessCpu] = []
        delays: dict[int, tuple[float, float]] = {}
        for rank, t in list(self._tracked.items()):
            try:
                main = t.proc.cpu_percent(None) / 100.0
                rss = int(t.proc.memory_info().rss)
                pids = t.declared_workers or tuple(c.pid for c in t.proc.children(recursive=False))
            except (psutil.Error, OSError):
                self._tracked.pop(rank, None)
                continue
            main_wait = self._wait(t.proc.pid, now, delays)
            cpus: list[float] = []
            waits: list[float | None] = []
            worker_rss = 0
            for pid in pids:
                w = t.workers.get(pid)
                try:
                    if w is None:
                        w = self._process(pid)
                        w.cpu_percent(None)
                        t.workers[pid] = w
                        self._wait(pid, now, delays)
                        continue  # no reading yet: psutil measures from now on
                    cpus.append(w.cpu_percent(None) / 100.0)
                    worker_rss += int(w.memory_info().rss)
                    waits.append(self._wait(pid, now, delays))
                except (psutil.Error, OSError):
                    t.workers.pop(pid, None)
            for gone in set(t.workers) - set(pids):
                t.workers.pop(gone, None)
            out.append(
                ProcessCpu(
                    rank=rank,
                    time=now,
                    pid=t.proc.pid,
                    main_cpu=main,
                    worker_cpu=tuple(cpus),
                    rss_bytes=rss,
                    worker_rss_bytes=worker_rss if cpus else None,
                    main_wait=main_wait,
                    # The workers' together, where every sampled worker's was read.
                    worker_wait=sum(waits)  # type: ignore[arg-type]
                    if cpus and None not in waits
                    else None,
                )
            )
        self._delays = delays  # the processes gone are forgotten
        busy = self._system_cpu() / 100.0 * self._logical()
        cores = self._cores()
        node = NodeCpu(
            host=self.host,
            time=now,
            cores=cores,
            busy_cores=min(busy, cores),
            load1=self._loadavg()[0],
        )
        return out, node
