"""DataParallel patch: its devices, and the wrapper as the model as soon as it is built."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..probe import Probe


def hook_dataparallel(probe: Probe, torch: Any) -> None:
    dp_cls = torch.nn.DataParallel
    orig_init = dp_cls.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        if not probe.enabled:
            return
        probe.parallel_mode = "dataparallel"
        ids = getattr(self, "device_ids", None) or []
        probe.devices = tuple(int(d) for d in ids)
        if ids:
            probe.device = f"cuda:{ids[0]}"
        probe.set_model(self)

    dp_cls.__init__ = __init__
