"""How a training job's exit is judged by the tests that run one.

gloo can abort a process at interpreter exit, after the training and its process group are
done ("terminate called without an active exception", exit 1 or SIGABRT's 134). It was seen
in the full suite on this 2-core machine (2 of 21 framework jobs, once in the memory jobs),
and not in 32 runs of the same jobs alone, with or without the probe. A test that judges what
the job measured accepts that abort, and only that, and only once the job has finished its
work; any other non-zero exit is a failure.
"""

from __future__ import annotations

GLOO_EXIT_ABORT = "terminate called without an active exception"


def ended_well(returncode: int, stderr: str, *, finished: bool) -> bool:
    """Exit 0, or gloo's abort at exit after ``finished`` (the job's own sign it completed)."""
    return returncode == 0 or (finished and GLOO_EXIT_ABORT in stderr)
