"""Running code right after the process imports a module, without importing it first: a
meta-path finder that wraps the module's own loader. The probe waits this way for the script's
``import torch``, and its patches for ``torch.distributed.checkpoint`` and DeepSpeed's engine:
each costs seconds to import, and the probe must never import what the script does not."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


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
