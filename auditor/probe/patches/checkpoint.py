"""Checkpoint patch: ``torch.save`` and ``torch.distributed.checkpoint``'s ``save``,
``async_save`` and ``save_state_dict``, timed as named work outside the training phases
(``StepSample.outside["checkpoint"]``; see ``auditor.probe.clock``).

``torch.distributed.checkpoint`` costs seconds to import, so the probe never imports it: a
meta-path finder waits for the script's own import and patches the package right after it ran
(``from torch.distributed.checkpoint import save`` then binds the patched function). Only the
training thread's saves are timed (an async save's writer thread is not the step's time); a save
inside a save (DCP's writer calls ``torch.save``) is one checkpoint.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..probe import Probe

CHECKPOINT = "checkpoint"
_DCP = "torch.distributed.checkpoint"
_DCP_SAVES = ("save", "async_save", "save_state_dict")


def hook_checkpoint(probe: Probe, torch: Any) -> None:
    saver = _Saver(probe)
    serialization: Any = sys.modules.get("torch.serialization") or torch.serialization
    wrapped = saver.wrap(serialization.save)
    serialization.save = wrapped
    torch.save = wrapped
    dcp = sys.modules.get(_DCP)
    if dcp is not None:
        _patch_dcp(saver, dcp)
    elif not any(isinstance(f, _DcpWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _DcpWatcher(saver))


class _Saver:
    """Opens and closes the checkpoint region around one save (never twice when nested)."""

    __slots__ = ("_depth", "_probe")

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._depth = 0

    def wrap(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        if getattr(orig, "_auditor_checkpoint", False):
            return orig
        probe = self._probe

        @functools.wraps(orig)
        def save(*args: Any, **kwargs: Any) -> Any:
            if not probe.active or self._depth or threading.get_ident() != probe.tid:
                return orig(*args, **kwargs)
            self._depth = 1
            probe.clock.outside_begin(CHECKPOINT)
            try:
                return orig(*args, **kwargs)
            finally:
                self._depth = 0
                probe.clock.outside_end()

        save._auditor_checkpoint = True  # type: ignore[attr-defined]
        return save


def _patch_dcp(saver: _Saver, dcp: ModuleType) -> None:
    modules = [dcp, sys.modules.get(f"{_DCP}.state_dict_saver")]
    for module in modules:
        if module is None:
            continue
        for name in _DCP_SAVES:
            fn = getattr(module, name, None)
            if callable(fn):
                setattr(module, name, saver.wrap(fn))


class _DcpWatcher(importlib.abc.MetaPathFinder):
    """Patches ``torch.distributed.checkpoint`` once the script imports it."""

    def __init__(self, saver: _Saver) -> None:
        self._saver = saver
        self._busy = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _DCP or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self)
        return spec

    def loaded(self, module: ModuleType) -> None:
        try:
            _patch_dcp(self._saver, module)
        except Exception:
            pass  # never break the job: its saves go unnamed
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, watcher: _DcpWatcher) -> None:
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
