"""DDP patch: the gradient all-reduce's collective wait, through a communication hook.

The hook wraps the default all-reduce and times its futures. DDP accepts one hook: if the script
registers its own, the timing wrapper wraps that one instead (before or after ours went in), so
the script's hook always runs.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..clock import StepClock
from ..threadstate import keep_thread_state

if TYPE_CHECKING:
    from ..probe import Probe


class TimedCommHook:
    """Times another DDP communication hook (the default all-reduce or the script's own).

    Registered once per DDP module through :meth:`as_hook`; a later ``register_comm_hook`` by the
    script swaps ``inner`` instead of registering a second hook, which DDP would refuse.
    """

    def __init__(self, clock: StepClock, inner: Callable[..., Any], state: Any) -> None:
        self.clock = clock
        self.inner = inner
        self.state = state

    def run(self, bucket: Any) -> Any:
        clock = self.clock
        try:
            nbytes = bucket.buffer().nbytes
        except Exception:  # a bucket without its flat buffer: the bytes are unknown
            nbytes = None
        try:
            # Only the last bucket's launch is marked on the device (one event a backward).
            last = bool(bucket.is_last())
        except Exception:  # not known: every bucket marks, the last mark is read
            last = True
        clock.bucket_launched(nbytes, last=last)
        # The inner hook's own dist.all_reduce is this wait: not timed a second time.
        clock.hook_depth += 1
        try:
            fut = self.inner(self.state, bucket)
        finally:
            clock.hook_depth -= 1

        def done(f: Any) -> Any:
            # On the backend's thread: keep its thread state, or a fork meanwhile may hang the
            # child (:mod:`auditor.probe.threadstate`).
            keep_thread_state()
            clock.bucket_done()
            return f.value()

        return fut.then(done)

    def as_hook(self) -> Callable[..., Any]:
        """A plain function as DDP wants it: a parameter named ``bucket``, no annotations."""
        run = self.run

        def hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
            return run(bucket)

        hook.__name__ = hook.__qualname__ = getattr(self.inner, "__name__", "timed_comm_hook")
        return hook


def hook_ddp(probe: Probe, torch: Any) -> None:
    ddp_cls = importlib.import_module("torch.nn.parallel.distributed").DistributedDataParallel
    orig_init = ddp_cls.__init__
    orig_register = ddp_cls.register_comm_hook
    builtin_name = next(
        (
            n
            for n in ("register_builtin_comm_hook", "_register_builtin_comm_hook")
            if hasattr(ddp_cls, n)
        ),
        None,
    )
    orig_builtin = getattr(ddp_cls, builtin_name) if builtin_name else None
    clock = probe.clock

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        if not probe.enabled:
            return
        try:
            probe.parallel_mode = "ddp"
            dev = getattr(self, "device", None)
            if dev is not None:
                probe.device = str(dev)
            if getattr(self, "device_ids", None):
                probe.devices = tuple(int(d) for d in self.device_ids)
            self._auditor_timed = None
            self._auditor_user_hook = False
            probe.set_model(self)
            self._auditor_first = self.register_forward_pre_hook(_install_default_timer)
        except Exception:
            probe.mark_unmeasured("collective_wait")

    def _install_default_timer(module: Any, args: Any) -> None:
        # At the first forward: the script had its chance to register its own hook by now.
        module._auditor_first.remove()
        if module._auditor_timed is not None or module._auditor_user_hook:
            return
        try:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            timed = TimedCommHook(clock, default_hooks.allreduce_hook, module.process_group)
            orig_register(module, None, timed.as_hook())
            module._auditor_timed = timed
        except Exception as exc:
            _debug(f"no DDP timing hook: {exc!r}")
            probe.mark_unmeasured("collective_wait")

    @functools.wraps(orig_register)
    def register_comm_hook(self: Any, state: Any, hook: Callable[..., Any]) -> None:
        timed = getattr(self, "_auditor_timed", None)
        if timed is not None:
            timed.inner, timed.state = hook, state  # swap: DDP takes one hook only
            return
        if not probe.enabled or not hasattr(self, "_auditor_user_hook"):
            orig_register(self, state, hook)
            return
        self._auditor_user_hook = True
        timed = TimedCommHook(clock, hook, state)
        orig_register(self, state, timed.as_hook())
        self._auditor_timed = timed

    def register_builtin_comm_hook(self: Any, comm_hook_type: Any) -> None:
        timed = getattr(self, "_auditor_timed", None)
        if timed is not None:
            # Ours is in already (the script asks after its first forward) and DDP takes one
            # hook: run the Python twin of the builtin inside it, which DDP documents as
            # equivalent, rather than fail the job.
            twin = _python_twin(comm_hook_type)
            if twin is not None:
                timed.inner, timed.state = twin, self.process_group
                return
        else:
            # Before ours: a C++ hook cannot be wrapped; leave it and say what was not measured.
            self._auditor_user_hook = True
            probe.mark_unmeasured("collective_wait")
        assert orig_builtin is not None
        orig_builtin(self, comm_hook_type)

    ddp_cls.__init__ = __init__
    ddp_cls.register_comm_hook = register_comm_hook
    if orig_builtin is not None and builtin_name is not None:
        setattr(ddp_cls, builtin_name, functools.wraps(orig_builtin)(register_builtin_comm_hook))


def _python_twin(comm_hook_type: Any) -> Callable[..., Any] | None:
    """The Python hook equivalent to a DDP builtin comm hook type, where torch has one."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    name = getattr(comm_hook_type, "name", str(comm_hook_type)).rsplit(".", 1)[-1]
    twins: dict[str, Callable[..., Any]] = {
        "ALLREDUCE": default_hooks.allreduce_hook,
        "FP16_COMPRESS": default_hooks.fp16_compress_hook,
    }
    return twins.get(name)


def _debug(msg: str) -> None:
    if os.environ.get("AUDITOR_DEBUG"):
        print(f"auditor probe: {msg}", file=sys.stderr)
