"""Host-to-device copy patch: ``Tensor.to``/``.cuda``/``.pin_memory`` on the training thread.

Timed only between a batch's arrival and the step's first forward (the methods are swapped in
for that window only, so a model's own ``.to`` calls cost nothing), and never inside a collective
(the object collectives move their pickled bytes with ``.to``: that is the collective's wait).
A loop whose windows see no copy opens one on every 64th batch only (``probe.H2D_IDLE_WINDOWS``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..clock import PHASE_COLLECTIVE, PHASE_H2D

if TYPE_CHECKING:
    from ..probe import Probe


def hook_h2d(probe: Probe, torch: Any) -> None:
    """Prepares the copy timers; :meth:`Probe.open_h2d` swaps them in for a batch's window."""
    tensor = torch.Tensor
    clock = probe.clock
    phases = clock.open_phases
    get_ident = threading.get_ident
    names = [n for n in ("to", "cuda", "pin_memory") if hasattr(tensor, n)]
    own = {n: tensor.__dict__[n] for n in names if n in tensor.__dict__}

    def timed(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def copy(self: Any, *args: Any, **kwargs: Any) -> Any:
            # A copy inside a collective (``all_gather_object`` moves its pickled bytes with
            # ``.to``) is part of that collective's wait: opening h2d there would split it.
            if (
                get_ident() != probe.tid
                or probe._coll_depth
                or (phases and phases[-1][0] in (PHASE_H2D, PHASE_COLLECTIVE))
            ):
                return orig(self, *args, **kwargs)
            probe.h2d_copied = True
            clock.h2d_begin()
            try:
                return orig(self, *args, **kwargs)
            finally:
                clock.h2d_end()

        return copy

    timers = {n: timed(getattr(tensor, n)) for n in names}

    def swap(on: bool) -> None:
        for n in names:
            if on:
                setattr(tensor, n, timers[n])
            elif n in own:
                setattr(tensor, n, own[n])
            else:
                delattr(tensor, n)

    probe._h2d_swap = swap
