"""Evaluation patch: ``nn.Module.train``, for the training model's ``eval()`` / ``train()``.

What the probe can see reliably of an evaluation is its bounds on the model that trains: the
script (or Lightning's validation loop, the Hugging Face Trainer's ``evaluate``) puts that model in
eval mode before it evaluates and back in training mode after. The time in between is named
work outside the training phases (``StepSample.outside["evaluation"]``; see
``auditor.probe.clock``): its forwards are not the step's forward, its loader's waits not the
step's data wait. Not seen: an evaluation on another copy of the model (an EMA copy), or one that
never leaves training mode (``torch.no_grad()`` alone); those stay unnamed time in the step. A
script that trains with its model in eval mode (frozen batch norm) is not evaluating: the first
backward or optimizer step ends the region (``StepClock.outside_begin``).

``Module.train`` recurses into every submodule, so the wrapper does one identity check per call
and nothing else: the cost is only paid where the script changes modes, never per step unless the
script does so itself.
"""

from __future__ import annotations

import functools
import importlib
import threading
from typing import TYPE_CHECKING, Any

from ..clock import EVALUATION

if TYPE_CHECKING:
    from ..probe import Probe

# Attributes through which wrappers hold the module they wrap (DDP, FSDP1, DataParallel:
# ``module``; Lightning's strategy wrapper: ``_forward_module``).
_WRAPPED = ("module", "_forward_module")
_DEPTH = 3


def hook_evaluation(probe: Probe, torch: Any) -> None:
    m = importlib.import_module("torch.nn.modules.module")
    orig = m.Module.train
    state = _Evaluation(probe)

    @functools.wraps(orig)
    def train(self: Any, mode: bool = True) -> Any:
        if probe.active and id(self) in state.ids(probe.model):
            state.switch(bool(mode))
        return orig(self, mode)

    m.Module.train = train


class _Evaluation:
    """Whether the training model is in eval mode, as a region of the step clock."""

    __slots__ = ("_ids", "_model", "_probe")

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._model: Any = None
        self._ids: frozenset[int] = frozenset()

    def ids(self, model: Any) -> frozenset[int]:
        """The training model and the modules its wrappers wrap (kept until it changes)."""
        if model is not self._model:
            self._model = model
            ids: set[int] = set()
            cur = model
            for _ in range(_DEPTH):
                if cur is None:
                    break
                ids.add(id(cur))
                cur = next((getattr(cur, a) for a in _WRAPPED if hasattr(cur, a)), None)
            self._ids = frozenset(ids)
        return self._ids

    def switch(self, training: bool) -> None:
        probe = self._probe
        if threading.get_ident() != probe.tid:
            return
        clock = probe.clock
        if training:
            clock.trains_in_eval = False
            if clock.evaluating:
                clock.outside_end()
        elif not clock.evaluating and not clock.trains_in_eval:
            clock.outside_begin(EVALUATION)
