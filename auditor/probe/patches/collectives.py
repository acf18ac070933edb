"""Collectives patch: every collective other than DDP's gradient all-reduce, as collective wait.

The all_reduce of a loss, all_gather, broadcast, barrier, reduce_scatter, the object
collectives, FSDP's all-gathers and reduce-scatters: the functions in
``torch.distributed.distributed_c10d``, and their re-exports in ``torch.distributed``, are
wrapped (frameworks call them by attribute at call time: ``dist.all_gather_single`` in FSDP2,
``torch.distributed.all_gather_into_tensor`` in accelerate). A synchronous call is collective
wait as a whole; an ``async_op=True`` call returns its ``Work`` untouched (FSDP checks its type)
and ``Work.wait`` is timed instead, under the name of the call that launched it. Only the
outermost call is timed (``all_gather_object`` runs ``all_gather`` inside), only on the training
thread, and never inside the DDP comm hook (timed there already). A call on another thread (a
metric or checkpoint thread) is no phase of the step: it is counted, and the rank lists
"collectives off the training thread" as not measured.

Each timed call also books the bytes it carries (:func:`payload_bytes`), in NCCL-tests' size
convention, so the analysis can tell a slow transfer from a wait for a late peer and give the
bus bandwidth achieved.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..probe import Probe

# torch.distributed functions timed as collective wait (those this torch has).
COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_coalesced",
    "_all_gather_base",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
)
# Bound in torch.distributed only (C++): DDP's buffer broadcast at each forward (BatchNorm stats).
COLLECTIVES_DIST_ONLY = ("_broadcast_coalesced",)


def _nbytes(t: Any) -> int:
    n = getattr(t, "nbytes", None)
    return n if isinstance(n, int) else 0


def _list_bytes(ts: Any) -> int:
    return sum(map(_nbytes, ts)) if isinstance(ts, (list, tuple)) else 0


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


# name -> the bytes of one call, NCCL-tests' "size": the buffer of an all-reduce, broadcast or
# reduce; the whole output of an all-gather; the whole input of a reduce-scatter or all-to-all.
# Object collectives (pickled, size unknown here) and barriers carry none.
_PAYLOAD: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], int]] = {
    "all_reduce": lambda a, k: _nbytes(_arg(a, k, 0, "tensor")),
    "all_reduce_coalesced": lambda a, k: _list_bytes(_arg(a, k, 0, "tensors")),
    "broadcast": lambda a, k: _nbytes(_arg(a, k, 0, "tensor")),
    "reduce": lambda a, k: _nbytes(_arg(a, k, 0, "tensor")),
    "all_gather": lambda a, k: _list_bytes(_arg(a, k, 0, "tensor_list")),
    "all_gather_into_tensor": lambda a, k: _nbytes(_arg(a, k, 0, "output_tensor")),
    "_all_gather_base": lambda a, k: _nbytes(_arg(a, k, 0, "output_tensor")),
    "all_gather_coalesced": lambda a, k: sum(
        map(_list_bytes, _arg(a, k, 0, "output_tensor_lists") or ())
    ),
    "reduce_scatter": lambda a, k: _list_bytes(_arg(a, k, 1, "input_list")),
    "reduce_scatter_tensor": lambda a, k: _nbytes(_arg(a, k, 1, "input")),
    "_reduce_scatter_base": lambda a, k: _nbytes(_arg(a, k, 1, "input")),
    "all_to_all": lambda a, k: _list_bytes(_arg(a, k, 1, "input_tensor_list")),
    "all_to_all_single": lambda a, k: _nbytes(_arg(a, k, 1, "input")),
    "gather": lambda a, k: _nbytes(_arg(a, k, 0, "tensor")),
    "scatter": lambda a, k: _nbytes(_arg(a, k, 0, "tensor")),
}


def payload_bytes(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The bytes one call of collective ``name`` carries; None where not known."""
    size = _PAYLOAD.get(name)
    if size is None:
        return None
    try:
        return size(args, kwargs) or None
    except Exception:  # an unexpected call shape: the bytes are unknown, the call goes on
        return None


def hook_collectives(probe: Probe, torch: Any) -> None:
    if not torch.distributed.is_available():
        return
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    dist = torch.distributed
    clock = probe.clock
    get_ident = threading.get_ident
    # Names (and bytes) of async Works launched through the wrappers, until they are waited on.
    launched: weakref.WeakKeyDictionary[Any, tuple[str, int | None]] = weakref.WeakKeyDictionary()
    # Inside a counted off-thread collective, per thread: nested calls are part of it.
    off_thread = threading.local()

    def untimed(orig: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A call off the training thread: counted once (outermost only), not timed."""
        if getattr(off_thread, "depth", 0):
            return orig(*args, **kwargs)
        probe.off_thread_collective()
        off_thread.depth = 1
        try:
            return orig(*args, **kwargs)
        finally:
            off_thread.depth = 0

    def wrap(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        try:
            params = list(inspect.signature(orig).parameters)
        except (TypeError, ValueError):  # a C++ binding: always synchronous
            params = []
        async_at = params.index("async_op") if "async_op" in params else -1

        @functools.wraps(orig)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if not probe.active or clock.hook_depth:
                return orig(*args, **kwargs)
            if get_ident() != probe.tid:
                return untimed(orig, *args, **kwargs)
            if probe._coll_depth:
                return orig(*args, **kwargs)
            if "async_op" in kwargs:
                is_async = bool(kwargs["async_op"])
            else:
                is_async = 0 <= async_at < len(args) and bool(args[async_at])
            if is_async:
                # Launched only: the wait is timed when (and where) the caller waits.
                probe._coll_depth += 1
                try:
                    work = orig(*args, **kwargs)
                finally:
                    probe._coll_depth -= 1
                if work is not None:
                    try:
                        launched[work] = (name, payload_bytes(name, args, kwargs))
                    except TypeError:
                        pass
                return work
            clock.collective_begin(name, payload_bytes(name, args, kwargs))
            probe._coll_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                probe._coll_depth -= 1
                clock.collective_end()

        return collective

    for name in COLLECTIVES:
        orig = getattr(c10d, name, None)
        if orig is None or getattr(orig, "_auditor_timed", False):
            continue
        timed = wrap(name, orig)
        timed._auditor_timed = True  # type: ignore[attr-defined]
        setattr(c10d, name, timed)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, timed)
    for name in COLLECTIVES_DIST_ONLY:
        orig = getattr(dist, name, None)
        if orig is not None and not getattr(orig, "_auditor_timed", False):
            setattr(dist, name, wrap(name, orig))

    work_cls = c10d.Work
    orig_wait = work_cls.wait

    @functools.wraps(orig_wait)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not probe.active or clock.hook_depth:
            return orig_wait(self, *args, **kwargs)
        if get_ident() != probe.tid:
            # Launched on the training thread, waited on another: that wait is not timed.
            # (A Work launched off the thread was counted at its launch.)
            try:
                ours = launched.pop(self, None) is not None
            except TypeError:
                ours = False
            if ours:
                return untimed(orig_wait, self, *args, **kwargs)
            return orig_wait(self, *args, **kwargs)
        if probe._coll_depth:
            return orig_wait(self, *args, **kwargs)
        try:
            name, nbytes = launched.pop(self, ("wait", None))
        except TypeError:
            name, nbytes = "wait", None
        clock.collective_begin(name, nbytes)
        probe._coll_depth += 1
        try:
            return orig_wait(self, *args, **kwargs)
        finally:
            probe._coll_depth -= 1
            clock.collective_end()

    work_cls.wait = wait
