"""Fakes for host sampling: a process table with psutil's shape (``cpu_percent`` in percent of
one core, ``children`` returning objects with ``pid``, ``memory_info().rss``) and psutil's
``NoSuchProcess`` when a process is gone. Passed to :class:`HostSampler` as its ``process``
factory; nothing patches psutil."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import psutil


class FakeProc:
    def __init__(
        self, table: ProcTable, pid: int, cpu: float, rss: int, children: Sequence[int]
    ) -> None:
        self.table = table
        self.pid = pid
        self.cpu = cpu
        self.rss = rss
        self.child_pids = list(children)
        self.gone = False
        self.cpu_calls = 0

    def _check(self) -> None:
        if self.gone:
            raise psutil.NoSuchProcess(self.pid)

    def cpu_percent(self, interval: float | None = None) -> float:
        self._check()
        self.cpu_calls += 1
        return self.cpu

    def children(self, recursive: bool = False) -> list[SimpleNamespace]:
        self._check()
        return [SimpleNamespace(pid=p) for p in self.child_pids]

    def memory_info(self) -> SimpleNamespace:
        self._check()
        return SimpleNamespace(rss=self.rss)

    def is_running(self) -> bool:
        return not self.gone


class ProcTable:
    """``process(pid)`` as psutil.Process would answer it; counts the objects it hands out."""

    def __init__(self) -> None:
        self.procs: dict[int, FakeProc] = {}
        self.opened: list[int] = []

    def add(
        self, pid: int, cpu: float = 0.0, rss: int = 0, children: Sequence[int] = ()
    ) -> FakeProc:
        p = FakeProc(self, pid, cpu, rss, children)
        self.procs[pid] = p
        return p

    def __call__(self, pid: int) -> FakeProc:
        p = self.procs.get(pid)
        if p is None or p.gone:
            raise psutil.NoSuchProcess(pid)
        self.opened.append(pid)
        return p
