"""DeepSpeed patch: the engine's own step, timed as the phases of a DDP step.

A DeepSpeed script trains through its ``DeepSpeedEngine`` (``deepspeed.initialize``): ``loss =
engine(batch)``, ``engine.backward(loss)``, ``engine.step()``. The torch patches see part of it
(the engine is an ``nn.Module``, its ``loss.backward()`` goes through ``torch.autograd``, its
torch optimizer steps inside, ``deepspeed.comm`` calls ``torch.distributed``), not the engine's
work around them. So, on ``DeepSpeedEngine``'s class:

* ``__init__``: the engine is the model as soon as it is built (its forward is the step's
  forward, whatever it wraps), and the rank's parallel mode is ``deepspeed``;
* ``backward``: backward as a whole, the gradient reduction that follows autograd included
  (ZeRO 0's all-reduce, ZeRO 1's reduce at the boundary, ZeRO 2's reduce-scatter epilogue):
  its collectives are collective wait, carved out of it like any collective;
* ``step``: the optimizer phase, only where the engine updates the model, the gradient
  accumulation boundary (``is_gradient_accumulation_boundary()`` before the call; every call
  where the script owns the boundary, ``managed_gradient_accumulation=False``). The other
  calls step nothing: they are no phase, and the step goes on to the next micro-batch, as
  under ``optimizer.step()`` called every N batches. ZeRO's work around the torch optimizer
  (clipping, the updated partitions' all-gather) is the optimizer's, its collectives
  collective wait.

``deepspeed`` is imported by the script, after torch: the probe never imports it. A meta-path
finder waits for ``deepspeed.runtime.engine`` and patches the class right after it ran.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..watch import watch_import

if TYPE_CHECKING:
    from ..probe import Probe

ENGINE_MODULE = "deepspeed.runtime.engine"
PARALLEL_MODE = "deepspeed"
# What the rank lists as not measured where the engine could not be patched.
UNHOOKED = "DeepSpeed engine backward/step"


def hook_deepspeed(probe: Probe, torch: Any) -> None:
    module = sys.modules.get(ENGINE_MODULE)
    if module is not None and hasattr(module, "DeepSpeedEngine"):
        patch_engine(probe, module.DeepSpeedEngine)
    else:
        watch_import(ENGINE_MODULE, lambda module: _patch_quietly(probe, module))


def updates_now(engine: Any) -> bool:
    """Whether this ``engine.step()`` call updates the model: at the gradient accumulation
    boundary, or on every call where the script owns the boundary. An engine that cannot say
    (an older DeepSpeed) is taken to update: a step per call, as without accumulation."""
    try:
        managed = getattr(engine, "managed_gradient_accumulation", None)
        if managed is not None and not managed():
            return True
        return bool(engine.is_gradient_accumulation_boundary())
    except Exception:
        return True


def patch_engine(probe: Probe, cls: Any) -> None:
    """Wrap ``cls``'s ``__init__``, ``backward`` and ``step`` (once)."""
    if getattr(cls, "_auditor_timed", False):
        return
    clock = probe.clock
    orig_init: Callable[..., Any] = cls.__init__
    orig_backward: Callable[..., Any] = cls.backward
    orig_step: Callable[..., Any] = cls.step

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        if not probe.enabled:
            return
        try:
            probe.parallel_mode = PARALLEL_MODE
            probe.set_model(self)
        except Exception:
            pass  # the model is then found at its first forward, as without DeepSpeed

    @functools.wraps(orig_backward)
    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not probe.active:
            return orig_backward(self, *args, **kwargs)
        probe.close_h2d()
        clock.backward_begin()
        try:
            return orig_backward(self, *args, **kwargs)
        finally:
            clock.backward_end()

    @functools.wraps(orig_step)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not (probe.enabled and (probe.active or probe.activate())) or not updates_now(self):
            return orig_step(self, *args, **kwargs)
        probe.close_h2d()
        clock.optimizer_begin()
        try:
            return orig_step(self, *args, **kwargs)
        finally:
            clock.optimizer_end()

    cls.__init__ = __init__
    cls.backward = backward
    cls.step = step
    cls._auditor_timed = True


def _patch_quietly(probe: Probe, module: ModuleType) -> None:
    try:
        patch_engine(probe, module.DeepSpeedEngine)
    except Exception:
        # Never break the job: the engine's steps are then what the torch patches see.
        probe.mark_unmeasured(UNHOOKED)
