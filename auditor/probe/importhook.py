"""Getting the probe into a process: lazily when torch is imported, or explicitly.

The probe must not import torch itself: ``sitecustomize`` runs in every Python process the job
starts (torchrun's agent, DataLoader workers, compilers), and importing torch costs seconds.
Instead a meta-path finder waits for the script's own ``import torch`` and attaches right after
torch finished initialising.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType

from .watch import watch_import

ENV_ENABLE = "AUDITOR_PROBE"
# A file the launcher names (``auditor run`` sets it to one in the run's temp dir): a process
# whose probe fails to attach appends why, one JSON line, since it may never reach the agent.
ENV_ERRORS = "AUDITOR_PROBE_ERRORS"


def enabled_by_env() -> bool:
    return os.environ.get(ENV_ENABLE, "") not in ("", "0", "false", "no")


def install(*, sink_path: str | None = None, job: str = "") -> None:
    """Attach the probe to this process: now if torch is already imported, else on its import.

    The explicit API for code that wants it: ``import auditor.probe; auditor.probe.install()``.
    ``auditor run`` never needs it.
    """
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "nn"):
        _attach(torch, sink_path=sink_path, job=job)
        return
    watch_import("torch", lambda module: _attach(module, sink_path=sink_path, job=job))


def _attach(torch: ModuleType, *, sink_path: str | None, job: str) -> None:
    try:
        from .hooks import attach

        attach(torch, sink_path=sink_path, job=job)
    except Exception as exc:  # a probe failure must never stop the training job
        if os.environ.get("AUDITOR_DEBUG"):
            print(f"auditor probe: not attached: {exc!r}", file=sys.stderr)
        say_not_attached(f"{type(exc).__name__}: {exc}")


def process_label() -> str:
    """Who this process is, for a person reading the report: its rank when a launcher gave it
    one, else its program and pid (a launcher's agent, a plain ``python train.py``)."""
    if "RANK" in os.environ:
        return f"rank {os.environ['RANK']}"
    argv = getattr(sys, "argv", None) or ["python"]
    return f"{os.path.basename(argv[0]) or 'python'} (pid {os.getpid()})"


def say_not_attached(reason: str) -> None:
    """Append why the probe did not attach to ``AUDITOR_PROBE_ERRORS``, if a launcher set it.
    Never raises: the job goes on whether or not anyone hears of it."""
    path = os.environ.get(ENV_ERRORS)
    if not path:
        return
    line = json.dumps({"who": process_label(), "reason": " ".join(reason.split())}) + "\n"
    try:
        # One write with O_APPEND: lines from ranks failing together never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass
