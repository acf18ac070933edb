"""``wait_for``: poll a condition until it holds, never sleep a fixed time and hope."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """:func:`wait_for` gave up: the condition did not hold within its timeout."""


def wait_for(
    probe: Callable[[], T | None],
    timeout: float = 5.0,
    *,
    what: str = "",
    every: float = 0.02,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` every ``every`` seconds until it returns something truthy, and return that.

    After ``timeout`` seconds it fails the test (``AssertionError``) naming ``what`` (or the
    probe). An exception of a type in ``retry_on`` counts as "not yet" (a server still starting
    answers with errors) and the last one is named in the failure; any other propagates at once.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = probe()
        except retry_on as exc:
            last, value = exc, None
        if value:
            return value
        if time.monotonic() >= deadline:
            name = what or getattr(probe, "__name__", repr(probe))
            error = f" (last error: {last})" if last is not None else ""
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {name}{error}")
        time.sleep(every)


def wait_for_service(
    probe: Callable[[], T | None], *, timeout: float, what: str, every: float = 0.5
) -> T:
    """:func:`wait_for` a server or job that is still starting: its errors count as "not yet"."""
    return wait_for(probe, timeout, what=what, every=every, retry_on=(Exception,))


def wait_quietly(
    probe: Callable[[], T | None], timeout: float = 5.0, *, every: float = 0.02
) -> T | None:
    """:func:`wait_for` that does not fail when time is up: the probe's truthy value, or None.

    For a caller whose own assert then shows what came instead (a diff of the states that never
    settled, the processes still running), or where nothing may come at all.
    """
    try:
        return wait_for(probe, timeout, every=every)
    except WaitTimeout:
        return None
