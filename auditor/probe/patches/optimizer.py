"""Optimizer patch: the global optimizer step pre/post hooks."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..probe import Probe


def hook_optimizer(probe: Probe, torch: Any) -> None:
    opt = importlib.import_module("torch.optim.optimizer")
    clock = probe.clock

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if probe.active or (probe.enabled and probe.activate()):
            if probe._h2d_open:
                probe.close_h2d()
            clock.optimizer_begin()

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if probe.active:
            clock.optimizer_end()
            flops = probe.flops
            if flops is not None and flops.counting:
                try:
                    flops.step_end()
                except Exception:
                    pass  # the probe must never take the training job down
            if probe.memory is not None:
                try:
                    probe.memory.after_step(probe.model, optimizer)
                except Exception:
                    pass  # the probe must never take the training job down

    opt.register_optimizer_step_pre_hook(pre)
    opt.register_optimizer_step_post_hook(post)
