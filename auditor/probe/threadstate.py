"""Python callbacks on threads Python did not start (a collective backend's completion thread).

torch runs a future's Python callback (``fut.then``) on the thread that completes the future:
gloo's or NCCL's own. Such a thread has no Python thread state, so each callback creates one and
deletes it after, and both take the interpreter's thread-list lock without the GIL. A fork on
the training thread at that moment (a DataLoader starting its workers) gives the child that lock
held by a thread the child does not have: before Python 3.12 the child then blocks for ever in
``PyOS_AfterFork_Child`` (python/cpython#112275), and the job waits for a worker that never
starts. DDP's builtin all-reduce runs no Python, so it is the probe's timing hook that would
bring this into a job.

:func:`keep_thread_state` keeps the thread's state for the thread's life from its first
callback on, so later callbacks create and delete none (and the lock is no longer taken at each
bucket). One thread state per backend thread stays allocated until the interpreter ends.
"""

from __future__ import annotations

import ctypes
import threading

# Threads whose state is kept. Read and written with the GIL held (inside a Python callback).
_kept: set[int] = set()


def keep_thread_state() -> None:
    """Keep the calling thread's Python thread state until the interpreter ends. Called from a
    Python callback: the GIL is held, the thread has a state, and ``PyGILState_Ensure`` only
    counts one more holder of it, so the callback's own release never reaches zero and never
    deletes it."""
    ident = threading.get_ident()
    if ident in _kept:
        return
    _kept.add(ident)
    try:
        ctypes.pythonapi.PyGILState_Ensure()
    except (AttributeError, OSError):  # an interpreter without the C API (PyPy): nothing kept
        pass
