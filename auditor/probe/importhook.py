"""Getting the probe into a process: lazily when torch is imported, or explicitly.

The probe must not import torch itself: ``sitecustomize`` runs in every Python process the job
starts (torchrun's agent, DataLoader workers, compilers), and importing torch costs seconds.
Instead a meta-path finder waits for the script's own ``import torch`` and attaches right after
torch finished initialising.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

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


class ModuleWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of module ``name`` so that ``then(module)`` runs
    right after the module ran (once: the watcher then leaves ``sys.meta_path``). ``then``
    must not raise: the script's own import would fail with it."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name = name
        self._then = then
        self._busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenLoader(spec.loader, self)
        return spec

    def loaded(self, module: ModuleType) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        self._then(module)


def watch_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` right after the process imports module ``name`` (one watcher a name)."""
    if not any(isinstance(f, ModuleWatcher) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, ModuleWatcher(name, then))


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, watcher: ModuleWatcher) -> None:
        self._inner = inner
        self._watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        self._watcher.loaded(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
