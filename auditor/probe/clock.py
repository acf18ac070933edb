"""The step clock: turns hook events inside a training loop into per-step phase timings.

A step is one iteration of the training loop that ends in an optimizer step: it starts when the
loop asks the DataLoader for a batch and ends when it asks for the next one after
``optimizer.step()`` (gradient accumulation folds several batches into one step). Loops without a
DataLoader close a step at each optimizer step.

Hot path: every event only reads a clock and appends to a list. Durations are resolved later,
off the training thread, by :meth:`StepClock.resolve` (called from the sink's flush thread). That
matters on GPUs: there the phase marks are CUDA events recorded on the current stream and read
once the device has passed them, so nothing on the hot path synchronises.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from auditor.samples import StepSample

PHASE_H2D, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = range(4)
_PHASE_FIELDS = ("h2d_s", "forward_s", "backward_s", "optimizer_s")


class Timer(Protocol):
    """Marks points in the step and measures between them (CPU clock or CUDA events)."""

    def mark(self) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def elapsed(self, start: Any, end: Any) -> float: ...


class CpuTimer:
    """Monotonic host clock; marks are floats and are always ready."""

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark: Any) -> bool:
        return True

    def elapsed(self, start: Any, end: Any) -> float:
        return max(0.0, float(end) - float(start))


class CudaTimer:
    """CUDA events recorded on the current stream, read only once the device has passed them.

    Events come from a free list so steady state allocates nothing; ``elapsed`` is called from the
    flush thread after ``ready`` said the end event completed, so it never blocks.
    """

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def mark(self) -> Any:
        with self._lock:
            ev = self._free.pop() if self._free else None
        if ev is None:
            ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def elapsed(self, start: Any, end: Any) -> float:
        ms = float(start.elapsed_time(end))
        with self._lock:
            self._free.extend((start, end))
        return max(0.0, ms / 1e3)


@dataclass
class PendingStep:
    """A closed step whose device-side phase marks may still be in flight."""

    step: int
    wall_time: float
    step_s: float
    data_wait_s: float
    batch_size: int | None
    collective_wait_s: float | None
    spans: list[tuple[int, Any, Any]] = field(default_factory=list)
    memory: tuple[int | None, int | None, int | None] = (None, None, None)


class StepClock:
    """Accumulates phase spans for the current step; closes steps into :class:`PendingStep`."""

    def __init__(
        self,
        rank: Callable[[], int],
        timer: Timer | None = None,
        *,
        memory: Callable[[], tuple[int | None, int | None, int | None]] | None = None,
        max_pending: int = 10_000,
        wall: Callable[[], float] = time.time,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._rank = rank
        self.timer: Timer = timer or CpuTimer()
        self._memory = memory
        self._wall = wall
        self._now = now
        self.pending: deque[PendingStep] = deque(maxlen=max_pending)
        self.dropped = 0
        self.steps = 0
        self.saw_loader = False
        self._reset(None)

    def use(
        self,
        timer: Timer,
        *,
        memory: Callable[[], tuple[int | None, int | None, int | None]] | None = None,
    ) -> None:
        """Switch the phase timer (before the first step: marks of two timers never mix)."""
        self.timer = timer
        self._memory = memory

    def _reset(self, start: float | None) -> None:
        self._start = start
        self._data_wait = 0.0
        self._batch = 0
        self._batch_known = False
        self._spans: list[tuple[int, Any, Any]] = []
        self._opt_done = False
        self._batch_end: Any = None
        self._forward_start: Any = None
        self._backward_start: Any = None
        self._opt_start: Any = None
        self._cw_launch = 0.0
        self._cw_done = 0.0
        self._cw_seen = False

    # --- events, called on the training thread -------------------------------------------------
    def data_begin(self) -> float:
        t = self._now()
        if self._opt_done:
            self._close(t)
        if self._start is None:
            self._start = t
        return t

    def data_end(self, began: float, batch_size: int | None) -> None:
        self.saw_loader = True
        self._data_wait += self._now() - began
        if batch_size is not None:
            self._batch += batch_size
            self._batch_known = True
        self._batch_end = self.timer.mark()

    def forward_begin(self) -> None:
        if self._start is None:
            self._start = self._now()
        mark = self.timer.mark()
        if self._batch_end is not None:
            # Time from batch in hand to the model's first call: the host-to-device copy and any
            # per-batch preparation the loop does.
            self._spans.append((PHASE_H2D, self._batch_end, mark))
            self._batch_end = None
        self._forward_start = mark

    def forward_end(self) -> None:
        if self._forward_start is not None:
            self._spans.append((PHASE_FORWARD, self._forward_start, self.timer.mark()))
            self._forward_start = None

    def backward_begin(self) -> None:
        self._backward_start = self.timer.mark()

    def backward_end(self) -> None:
        if self._backward_start is not None:
            self._spans.append((PHASE_BACKWARD, self._backward_start, self.timer.mark()))
            self._backward_start = None

    def optimizer_begin(self) -> None:
        self._opt_start = self.timer.mark()

    def optimizer_end(self) -> None:
        if self._opt_start is not None:
            self._spans.append((PHASE_OPTIMIZER, self._opt_start, self.timer.mark()))
            self._opt_start = None
        self._opt_done = True
        if not self.saw_loader:
            self._close(self._now())

    def bucket_launched(self) -> float:
        """A gradient bucket is ready on this rank and its all-reduce starts (comm hook)."""
        t = self._now()
        self._cw_launch = max(self._cw_launch, t)
        self._cw_seen = True
        return t

    def bucket_done(self) -> None:
        """An all-reduce completed (future callback; may run on the backend's thread)."""
        self._cw_done = max(self._cw_done, self._now())

    def flush_open(self) -> None:
        """At exit: close a step that finished its optimizer step but saw no next batch."""
        if self._opt_done:
            self._close(self._now())

    # --- closing and resolving ---------------------------------------------------------------
    def _close(self, t: float) -> None:
        start = self._start if self._start is not None else t
        # The wait of this rank at the barrier: from its last bucket being ready to the last
        # all-reduce finishing. The rank the others wait for sees almost none.
        cw = max(0.0, self._cw_done - self._cw_launch) if self._cw_seen else None
        if len(self.pending) == self.pending.maxlen:
            self.dropped += 1
        self.pending.append(
            PendingStep(
                step=self.steps,
                wall_time=self._wall(),
                step_s=max(0.0, t - start),
                data_wait_s=self._data_wait,
                batch_size=self._batch if self._batch_known else None,
                collective_wait_s=cw,
                spans=self._spans,
                memory=self._memory() if self._memory else (None, None, None),
            )
        )
        self.steps += 1
        self._reset(t)

    def resolve(self, rss_bytes: int | None = None) -> list[StepSample]:
        """Steps whose marks the device has passed, oldest first; called off the hot path."""
        out: list[StepSample] = []
        rank = self._rank()
        while self.pending:
            p = self.pending[0]
            if p.spans and not self.timer.ready(p.spans[-1][2]):
                break  # the device has not reached this step's end yet: read it next time
            self.pending.popleft()
            phases = [0.0, 0.0, 0.0, 0.0]
            for phase, a, b in p.spans:
                phases[phase] += self.timer.elapsed(a, b)
            alloc, reserved, peak = p.memory
            out.append(
                StepSample(
                    rank=rank,
                    step=p.step,
                    time=p.wall_time,
                    step_s=p.step_s,
                    data_wait_s=p.data_wait_s,
                    h2d_s=phases[PHASE_H2D],
                    forward_s=phases[PHASE_FORWARD],
                    backward_s=phases[PHASE_BACKWARD],
                    optimizer_s=phases[PHASE_OPTIMIZER],
                    collective_wait_s=p.collective_wait_s,
                    batch_size=p.batch_size,
                    rss_bytes=rss_bytes,
                    mem_allocated_bytes=alloc,
                    mem_reserved_bytes=reserved,
                    mem_peak_bytes=peak,
                )
            )
        return out
