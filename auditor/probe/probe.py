"""The ``Probe``: a rank's step clock, identity, sink and model discovery.

One per training process, made by :func:`auditor.probe.hooks.attach`, which installs the torch
patches (``auditor.probe.patches``, one module per patched call) that drive it. The rank's whole
run is accounted for (``auditor.analysis.accounting``): the probe reports when its process
started (``RankInfo.started_at``) and, in its goodbye, when it ended (``RankInfo.ended_at``).

FSDP (``fully_shard``'s ``FSDPModule``, or ``FullyShardedDataParallel``) is recognised by its
class when the root module is first called; that root is the model.
"""

from __future__ import annotations

import atexit
import functools
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from auditor.launch_env import identify, rank_from_env
from auditor.samples import OFF_THREAD_COLLECTIVES, LoaderConfig, RankInfo

from .clock import StepClock
from .flops import COUNT_AT_STEP, FlopMeter, shape_of
from .memory import ACTIVATIONS_EVERY, MemoryMeter
from .sink import FLUSH_S, Sink, flops_message, memory_message, step_message
from .timers import CpuTimer, CudaTimer

_DEFAULT_SINK_DIR = "/tmp/auditor-{uid}"
_get_ident = threading.get_ident
_N = TypeVar("_N", int, float)

# The host-to-device window writes torch.Tensor's class to open and close (``patches/h2d.py``),
# which costs every later tensor call a few microseconds a step. A loop whose batches are not
# copied (a CPU job, a loader that hands device tensors) stops paying it: after this many windows
# in a row without a copy, the window opens on every H2D_RECHECK_EVERY-th batch only, until one
# sees a copy again.
H2D_IDLE_WINDOWS = 8
H2D_RECHECK_EVERY = 64


def _script_name() -> str:
    name = os.path.splitext(os.path.basename(sys.argv[0] if sys.argv else ""))[0]
    return name if name and name != "-c" else "python"


def _env_number(name: str, default: _N, kind: Callable[[str], _N]) -> _N:
    """A number the probe reads from the environment. A wrong one stops the probe (not the
    job), and the reason the run reports names the variable, not just the text."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"{name}={raw!r} is not {what}") from None


def default_sink_path() -> str:
    """Where a fleet node agent listens when no launcher set ``AUDITOR_SINK``."""
    return os.path.join(_DEFAULT_SINK_DIR.format(uid=os.getuid()), "sink.sock")


class Probe:
    """One per training process: the step clock, the rank's identity and the sink."""

    def __init__(self, torch: Any, *, sink_path: str | None = None, job: str = "") -> None:
        self.torch = torch
        # Without a launcher's name (a job opted in with AUDITOR_PROBE under a fleet agent), the
        # script's name, as `auditor run` names jobs by default.
        self.job = job or os.environ.get("AUDITOR_JOB") or _script_name()
        self.sink_path = sink_path or os.environ.get("AUDITOR_SINK") or default_sink_path()
        self.enabled = True
        self.active = False
        self.started_at = process_start_time()
        self.ended_at: float | None = None
        self._known_group: tuple[int, int] | None = None
        self.parallel_mode = "none"
        self.devices: tuple[int, ...] = ()
        self.device = "cpu"
        self.loader: LoaderConfig | None = None
        self.worker_pids: tuple[int, ...] = ()
        # The DataLoader whose batches train (see patches/dataloader.py), and the step of its last
        # batch; None until one has trained.
        self.train_loader: weakref.ref[Any] | None = None
        self.train_loader_step = 0
        # ``auditor run --apply`` (patches/dataloader.py): levers moved, {lever: (from, to)},
        # and levers planned but kept, {lever: reason}.
        self.applied: dict[str, tuple[Any, Any]] = {}
        self.apply_kept: dict[str, str] = {}
        self.unmeasured: set[str] = set()
        # Collectives called on another thread than the training loop's: counted, not timed.
        self.off_thread_collectives = 0
        self._off_thread_lock = threading.Lock()
        self.device_uuids: tuple[str, ...] = ()
        self._info_sent: dict[str, Any] | None = None
        self._workers_sent: tuple[int, ...] | None = None
        self.model: Any = None
        self._discover_steps = _env_number("AUDITOR_PROBE_DISCOVER_STEPS", 3, int)
        self._global_fwd: list[Any] = []
        self._fwd_depth = 0
        # Undoes the timing of the model's calls (:func:`_time_calls`).
        self._untime_model: Callable[[], None] | None = None
        self._lock = threading.Lock()
        # The thread the training loop runs on (where the model's forward runs); the collective
        # and copy timers ignore every other thread (DataLoader pinning, DDP's autograd threads).
        self.tid = threading.get_ident()
        self._coll_depth = 0  # inside a timed collective: nested ones are part of it
        self._h2d_open = False
        self._h2d_swap: Callable[[bool], None] | None = None
        self.h2d_copied = False  # the open window timed a copy
        self._h2d_idle = 0  # windows in a row that saw no copy
        # Batches until the next window: the data hook counts it down and opens one at zero
        # (each batch while copies are seen; every H2D_RECHECK_EVERY-th once idle).
        self.h2d_wait = 0
        # CPU clock until the first training event shows whether this process trains on CUDA.
        self.clock = StepClock(rank=self.rank, timer=CpuTimer())
        # The memory budget (auditor.probe.memory): on unless AUDITOR_PROBE_MEMORY=0.
        self.memory: MemoryMeter | None = None
        if os.environ.get("AUDITOR_PROBE_MEMORY", "1") != "0":
            self.memory = MemoryMeter(
                torch,
                rank=self.rank,
                device=lambda: self.device,
                activations_every=_env_number("AUDITOR_PROBE_MEMORY_EVERY", ACTIVATIONS_EVERY, int),
            )
        # FLOPs per step, counted on a sampled step (auditor.probe.flops): on unless
        # AUDITOR_PROBE_FLOPS=0.
        self.flops: FlopMeter | None = None
        if os.environ.get("AUDITOR_PROBE_FLOPS", "1") != "0":
            self.flops = FlopMeter(
                torch,
                rank=self.rank,
                step=lambda: self.clock.steps,
                outside=lambda: self.clock.outside,
                device=lambda: self.device,
                at_step=_env_number("AUDITOR_PROBE_FLOPS_STEP", COUNT_AT_STEP, int),
            )
        self.sink = Sink(
            self.sink_path,
            collect=self._collect,
            hello=self._hello,
            interval_s=_env_number("AUDITOR_PROBE_FLUSH_S", FLUSH_S, float),
        )

    # --- identity ------------------------------------------------------------------------------
    def _cuda_in_use(self) -> bool:
        """CUDA initialised by the script itself: a GPU host running a CPU job stays on the host
        clock, and the probe never creates a CUDA context of its own."""
        try:
            c = self.torch.cuda
            return bool(c.is_available() and c.is_initialized())
        except Exception:
            return False

    def _dist(self) -> Any:
        try:
            d = self.torch.distributed
            return d if d.is_available() and d.is_initialized() else None
        except Exception:
            return None

    def _group(self) -> tuple[int, int] | None:
        """(rank, world size) from the process group, kept once known: a script that ends with
        ``destroy_process_group()`` still flushes its last steps, and a process started by
        ``mp.spawn`` has no ``RANK`` to fall back on (they would be booked to rank 0)."""
        d = self._dist()
        if d is not None:
            try:
                self._known_group = (int(d.get_rank()), int(d.get_world_size()))
            except Exception:
                pass
        return self._known_group

    def rank(self) -> int:
        group = self._group()
        return group[0] if group else (rank_from_env(os.environ)[0] or 0)

    def world_size(self) -> int:
        group = self._group()
        return group[1] if group else (rank_from_env(os.environ)[1] or 1)

    def info(self) -> RankInfo:
        return RankInfo(
            rank=self.rank(),
            world_size=self.world_size(),
            local_rank=identify((), os.environ).local_rank or 0,
            host=socket.gethostname(),
            pid=os.getpid(),
            device=self.device,
            parallel_mode=self.parallel_mode,
            devices=self.devices,
            device_uuids=self.device_uuids,
            loader=self.loader,
            unmeasured=tuple(sorted(self.unmeasured)),
            job=self.job,
            off_thread_collectives=self.off_thread_collectives,
            applied=tuple((lever, *move) for lever, move in self.applied.items()),
            apply_kept=tuple(
                (lever, why) for lever, why in self.apply_kept.items() if lever not in self.applied
            ),
            started_at=self.started_at,
            ended_at=self.ended_at,
        )

    def _hello(self) -> dict[str, Any]:
        info = self.info().to_dict()
        self._info_sent = info
        self._workers_sent = None
        if self.memory is not None:
            self.memory.resend()
        if self.flops is not None:
            self.flops.resend()
        return {"type": "hello", "version": 1, "info": info}

    def _collect(self) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        info = self.info().to_dict()
        if info != self._info_sent:
            self._info_sent = info
            msgs.append({"type": "info", "info": info})
        if self.worker_pids != self._workers_sent:
            self._workers_sent = self.worker_pids
            msgs.append({"type": "workers", "pids": list(self.worker_pids)})
        steps = self.clock.resolve(rss_bytes=_rss_bytes())
        if self.flops is not None:
            # The counted step flagged; its count sent once its neighbours' times are in (or
            # the rank ends: not active any more).
            steps = self.flops.resolved(steps, final=not self.active)
        if steps:
            msgs.append(step_message(self.rank(), steps))
        budget = self.memory.take() if self.memory is not None else None
        if budget is not None:
            msgs.append(memory_message(budget))
        if self.flops is not None:
            msgs.extend(flops_message(c) for c in self.flops.take())
        return msgs

    def _uuids(self) -> tuple[str, ...]:
        """NVML UUIDs (``GPU-...``) of the devices this process drives, so the node agent can
        tell which GPU is whose; empty where torch cannot say."""
        try:
            c = self.torch.cuda
            indices = self.devices or (c.current_device(),)
            out = []
            for i in indices:
                uuid = str(c.get_device_properties(i).uuid)
                out.append(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
            return tuple(out)
        except Exception:
            return ()

    def _cuda_memory(self) -> tuple[int | None, int | None, int | None]:
        """Allocated, reserved and peak allocated bytes, from one read of the allocator's
        statistics: ``memory_allocated()`` and its kin each flatten every statistic into a new
        dict, three of them a step cost more than the rest of the probe on a GPU."""
        try:
            stats = self.torch.cuda.memory.memory_stats_as_nested_dict()
            allocated, reserved = stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
            return int(allocated["current"]), int(reserved["current"]), int(allocated["peak"])
        except Exception:
            return (None, None, None)

    # --- lifecycle -----------------------------------------------------------------------------
    def activate(self) -> bool:
        """Start the sink on the first training event of this process (not in launchers or
        DataLoader workers, which import torch but never train)."""
        if self.active:
            return True
        if not self.enabled:
            return False
        try:
            if self.torch.utils.data.get_worker_info() is not None:
                self.enabled = False
                return False
        except Exception:
            pass
        self.active = True
        self.tid = threading.get_ident()
        if self._cuda_in_use():
            self.clock.use(CudaTimer(self.torch), memory=self._cuda_memory)
            if self.device == "cpu":
                self.device = f"cuda:{self.torch.cuda.current_device()}"
            self.device_uuids = self._uuids()
        self.sink.start()
        atexit.register(self.shutdown)
        return True

    def shutdown(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.flops is not None:
            self.flops.abandon()
        self.clock.flush_open()
        # The goodbye says when the rank ended (the last info before "bye"); the connection
        # lingers until the process is gone, and the node agent moves the end to that moment.
        self.ended_at = time.time()
        self.sink.close(timeout_s=self._exit_wait_s(), linger=True)

    def _exit_wait_s(self) -> float:
        """How long a rank's exit may wait for its agent to take the last samples. A launcher
        that named the sink has its agent coming (Ray may still be starting): wait for it. With
        no launcher and no agent listening, do not hold the job's exit at all."""
        if "AUDITOR_EXIT_WAIT_S" in os.environ:
            return float(os.environ["AUDITOR_EXIT_WAIT_S"])
        if os.environ.get("AUDITOR_SINK"):
            return 15.0
        return 2.0 if os.path.exists(self.sink_path) else 0.0

    def off_thread_collective(self) -> None:
        """A collective on another thread (a metric or checkpoint thread): its wait is not the
        training step's, and the step clock is the training thread's alone. Counted, and the
        rank says these collectives were not measured."""
        with self._off_thread_lock:
            self.off_thread_collectives += 1
            self.unmeasured.add(OFF_THREAD_COLLECTIVES)

    def mark_unmeasured(self, phase: str) -> None:
        self.unmeasured.add(phase)
        if phase == "collective_wait":
            # The gradient all-reduce cannot be timed: a partial collective wait would read as
            # measured, so the steps say "not measured" instead.
            self.clock.collective_unmeasured = True

    # --- the host-to-device window ---------------------------------------------------------------
    def open_h2d(self) -> None:
        """A batch is in hand (its window is due): time the copy calls until the step's first
        forward."""
        if self._h2d_swap is None:
            self.h2d_wait = sys.maxsize  # no copy timers: no window, ever
        elif not self._h2d_open:
            self._h2d_swap(True)
            self._h2d_open = True
            self.h2d_copied = False

    def close_h2d(self) -> None:
        if self._h2d_open and self._h2d_swap is not None:
            self._h2d_swap(False)
            self._h2d_open = False
            self._h2d_idle = 0 if self.h2d_copied else self._h2d_idle + 1
            if self._h2d_idle >= H2D_IDLE_WINDOWS:
                self.h2d_wait = H2D_RECHECK_EVERY

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) must not report as the rank it was forked from."""
        self.enabled = False
        self.active = False
        self.sink.abandon()

    # --- model discovery ---------------------------------------------------------------------
    def set_model(self, module: Any) -> None:
        if self.model is module:
            return
        if self._untime_model is not None:
            self._untime_model()
        self.model = module
        try:
            self._untime_model = _time_calls(self, module)
        except (AttributeError, TypeError):  # a class that takes no attribute: hooks instead
            self._untime_model = _hook_calls(self, module)
        self._remove_global_forward()

    def _remove_global_forward(self) -> None:
        for h in self._global_fwd:
            h.remove()
        self._global_fwd = []

    def _model_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if self.active or (self.enabled and self.activate()):
            self.tid = _get_ident()
            if self._h2d_open:
                self.close_h2d()
            clock = self.clock
            clock.forward_begin()
            if not clock.backward_depth:
                # One walk to the batch's first tensor: its size for the memory meter (the
                # positional arguments, as before), its shape for the FLOP count (keyword
                # arguments too: ``model(**batch)``). ``model(x)``'s is read without the walk.
                shape = getattr(args[0], "shape", None) if args else None
                if not shape:  # no tensor first, or one without a dimension
                    shape = shape_of(args)
                if self.memory is not None:
                    self.memory.forward_begin(module, int(shape[0]) if shape is not None else None)
                if self.flops is not None:
                    self.flops.forward_begin(
                        module, shape if shape is not None or not kwargs else shape_of(kwargs)
                    )

    def _model_post(self, module: Any, args: Any, output: Any) -> None:
        if self.active:
            memory = self.memory
            if memory is not None and memory.sampling is not None:
                memory.forward_end()
            self.clock.forward_end()

    def _global_pre(self, module: Any, args: Any) -> None:
        if self._fwd_depth == 0 and self.enabled and (self.active or self.activate()):
            if self.model is None and self.clock.steps >= self._discover_steps:
                self._remove_global_forward()
            if not self.clock.backward_depth:
                self.tid = threading.get_ident()
                if self.model is None and _is_fsdp(module):
                    self.parallel_mode = "fsdp"  # known before its first forward ends
            if self._h2d_open:
                self.close_h2d()
            self.clock.forward_begin()
        self._fwd_depth += 1

    def _global_post(self, module: Any, args: Any, output: Any) -> None:
        self._fwd_depth = max(0, self._fwd_depth - 1)
        if self._fwd_depth == 0 and self.active:
            self.clock.forward_end()
            if self.model is not None or self.clock.backward_depth:
                return  # a top-level call inside backward is checkpointing's recompute
            if _is_fsdp(module):
                self.parallel_mode = "fsdp"
                self.set_model(module)
            elif self.clock.steps + 1 >= self._discover_steps:
                self.set_model(module)


def _time_calls(probe: Probe, module: Any) -> Callable[[], None]:
    """Time the model's forward by its class's ``__call__``, wrapped: the wrapper times
    ``probe.model`` alone (another instance of the class, such as a DataParallel replica or an
    EMA copy, is called as before), around every hook of the module (FSDP's all-gather and
    reshard are inside the model's forward), and the module keeps no hook of ours: with none,
    torch calls it without its hook path (a closure and a try per call, about 5 µs a step in
    a training loop). Nothing is added to the instance, so copying or pickling the model is as
    before. Returns the undo."""
    cls = type(module)
    had = cls.__dict__.get("__call__")
    call = cls.__call__
    pre, post = probe._model_pre, probe._model_post

    @functools.wraps(call)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is not probe.model:
            return call(self, *args, **kwargs)
        pre(self, args, kwargs)
        try:
            return call(self, *args, **kwargs)
        finally:
            post(self, args, None)

    cls.__call__ = __call__

    def undo() -> None:
        if cls.__dict__.get("__call__") is __call__:
            if had is None:
                del cls.__call__
            else:
                cls.__call__ = had

    return undo


def _hook_calls(probe: Probe, module: Any) -> Callable[[], None]:
    """Time the model's forward by hooks on the module (first in, last out: FSDP's hooks
    inside); returns the undo."""
    hooks = [
        module.register_forward_pre_hook(probe._model_pre, prepend=True, with_kwargs=True),
        module.register_forward_hook(probe._model_post, always_call=True),
    ]

    def undo() -> None:
        for h in hooks:
            h.remove()

    return undo


def _is_fsdp(module: Any) -> bool:
    """FSDP2 (``fully_shard`` turns the module's class into a subclass of ``FSDPModule``) or
    FSDP1 (``FullyShardedDataParallel``), by class name: no import of torch's FSDP package."""
    return any(c.__name__ in _FSDP_CLASSES for c in type(module).__mro__)


_FSDP_CLASSES = frozenset(("FSDPModule", "FullyShardedDataParallel"))


def process_start_time() -> float:
    """This process's start (wall clock): ``/proc/self/stat``'s start time after boot plus the
    boot time, to the kernel's tick (10 ms); elsewhere, now (the probe attaches right after the
    script's ``import torch``, so the interpreter's start and that import go unseen)."""
    try:
        with open("/proc/self/stat") as f:
            # The command name may hold spaces and parentheses: fields count from its end.
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        # The start is on the boot-time clock; /proc/stat's btime is whole seconds, too coarse.
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
