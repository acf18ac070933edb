"""How a training job's exit is judged by the tests that run one.

gloo can abort a process at interpreter exit, after the training and its process group are
done ("terminate called without an active exception", exit 1 or SIGABRT's 134). It was seen
in the full suite on this 2-core machine (2 of 21 framework jobs, once in the memory jobs),
and not in 32 runs of the same jobs alone, with or without the probe. A two-rank job of
tests/e2e/over_time_job.py beside CPU burners once exited 1 after it had trained, in the full
suite, with the cause cut from the test's message (not in 14 runs of it alone): failed runs
show the job's own failure lines first. A test that judges what the job measured accepts
that abort, and only that, and only once the job has finished its work; any other non-zero
exit is a failure.
"""

from __future__ import annotations

GLOO_EXIT_ABORT = "terminate called without an active exception"


def ended_well(returncode: int, stderr: str, *, finished: bool) -> bool:
    """Exit 0, or gloo's abort at exit after ``finished`` (the job's own sign it completed)."""
    return returncode == 0 or (finished and GLOO_EXIT_ABORT in stderr)


# The lines in which a job names its own failure; the auditor's report follows them in the
# output, so the end of stderr alone shows the verdict and hides the cause.
FAILURE_MARKS = ("Traceback", "Error", "terminate called", "exitcode", "Root Cause", "Signal")


def failure_text(stderr: str, *, tail: int = 3000) -> str:
    """A failed run's output for an assertion message: the job's own failure lines (a
    traceback, an abort, torchrun's summary), then the end of its output."""
    named = [line for line in stderr.splitlines() if any(m in line for m in FAILURE_MARKS)]
    return "\n".join(named[:40]) + "\n[...]\n" + stderr[-tail:]
