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
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..watch import watch_import

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
    else:
        watch_import(_DCP, lambda module: _patch_dcp_quietly(saver, module))


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


def _patch_dcp_quietly(saver: _Saver, dcp: ModuleType) -> None:
    try:
        _patch_dcp(saver, dcp)
    except Exception:
        pass  # never break the job: its saves go unnamed
