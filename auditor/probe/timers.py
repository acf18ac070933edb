"""The step clock's timers: where a phase mark comes from and how two marks make a duration.

:class:`CpuTimer` reads the host's monotonic clock; :class:`CudaTimer` records CUDA events on the
current stream, read only once the device has passed them (:class:`~auditor.probe.clock.StepClock`
asks from the flush thread, never the training thread).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol


class Timer(Protocol):
    """Marks points in the step and measures between them (CPU clock or CUDA events).
    ``device``: marks are on a device's timeline, which the host runs ahead of; a host timer's
    marks (``device`` False) are ready when made and hold nothing to release, so
    :meth:`StepClock.resolve` neither asks nor releases them."""

    device: bool

    def mark(self) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def elapsed(self, start: Any, end: Any) -> float: ...

    def release(self, marks: Iterable[Any]) -> None: ...


class CpuTimer:
    """Monotonic host clock; marks are floats, ready when made, and hold nothing to release.
    ``mark`` is the clock itself (no Python frame between the hook and the clock)."""

    device = False
    mark = staticmethod(time.perf_counter)

    def ready(self, mark: Any) -> bool:
        return True

    def elapsed(self, start: Any, end: Any) -> float:
        return max(0.0, float(end) - float(start))

    def release(self, marks: Iterable[Any]) -> None:
        pass


class CudaTimer:
    """CUDA events recorded on the current stream, read only once the device has passed them.

    Events come from a free list so steady state allocates nothing; ``elapsed`` is called from the
    flush thread after ``ready`` said the events completed, so it never blocks. A mark bounds two
    adjacent segments, so it goes back to the free list (``release``) once per step, not per read.
    The free list takes no lock: ``list.pop`` and ``list.extend`` are each one atomic operation
    (the flush thread only extends it; the training thread and DDP's autograd thread pop, and a
    pop that finds it empty makes a new event).
    """

    device = True

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module
        self._free: list[Any] = []

    def mark(self) -> Any:
        try:
            ev = self._free.pop()
        except IndexError:
            ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def elapsed(self, start: Any, end: Any) -> float:
        return max(0.0, float(start.elapsed_time(end)) / 1e3)

    def release(self, marks: Iterable[Any]) -> None:
        self._free.extend(marks)
