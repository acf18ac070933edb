"""Fake clocks: time the test moves by hand, injected where the code takes a clock.

* :class:`Clock`: host time (a ``() -> float``), set with :meth:`Clock.at` or ``clock.t = ...``.
* :class:`DeviceTimer`: the probe's phase timer as CUDA events behave, whose marks can be read only
  once the (fake) device has passed them.
"""

from __future__ import annotations


class Clock:
    """Host time the test moves by hand: ``clock()`` reads it."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def at(self, t: float) -> None:
        """Move forward to ``t`` (never back, as a monotonic clock)."""
        assert t >= self.t
        self.t = t


class DeviceTimer:
    """Like CUDA events: a mark takes the (fake) time when recorded, but can be read only once
    the device has passed it; reading one early is an error, as a blocking read would be.

    A mark's time is the host's, or ``at`` where the test sets it: the device time at which the
    stream reaches the mark, later than the host's when the host runs ahead of the device."""

    device = True

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.times: list[float] = []
        self.passed = -1  # index of the last mark the device completed
        self.at: float | None = None

    def mark(self) -> int:
        self.times.append(self.clock.t if self.at is None else self.at)
        return len(self.times) - 1

    def ready(self, mark: int) -> bool:
        return mark <= self.passed

    def elapsed(self, start: int, end: int) -> float:
        assert self.ready(end), "elapsed() read a mark the device has not reached"
        return self.times[end] - self.times[start]

    def release(self, marks: object) -> None:
        pass

    def complete_all(self) -> None:
        self.passed = len(self.times) - 1
