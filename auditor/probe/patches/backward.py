"""Backward patch: ``torch.autograd.backward``, which ``Tensor.backward`` calls by attribute."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..probe import Probe


def hook_backward(probe: Probe, torch: Any) -> None:
    autograd = torch.autograd
    orig = autograd.backward
    clock = probe.clock

    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not probe.active:
            return orig(*args, **kwargs)
        if probe._h2d_open:
            probe.close_h2d()
        clock.backward_begin()
        try:
            return orig(*args, **kwargs)
        finally:
            clock.backward_end()

    autograd.backward = backward
