"""Forward patch: global module hooks, only until the model is known.

The first module called at top level is taken as the model, its calls timed from then on
(``Probe.set_model``: its class's ``__call__`` wrapped, for that instance alone); the global
hooks are removed after ``discover_steps`` steps, so big models do not pay a Python call per
submodule. A DDP or DataParallel wrapper is the model as soon as it
is built (``ddp.py``, ``dataparallel.py``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..probe import Probe


def hook_forward(probe: Probe, torch: Any) -> None:
    m = importlib.import_module("torch.nn.modules.module")
    probe._global_fwd = [
        m.register_module_forward_pre_hook(probe._global_pre),
        # always_call: a forward that raises still ends (non-reentrant checkpointing stops its
        # recompute with an exception once it has the tensors it needs).
        m.register_module_forward_hook(probe._global_post, always_call=True),
    ]
