"""Hooks that time an unmodified training script from inside its process.

What is hooked, and why this way:

* DataLoader: ``_BaseDataLoaderIter.__next__`` (every loader, single- or multi-process) for the
  data wait and the batch size; ``DataLoader.__iter__`` to read the loader's settings and its
  worker PIDs once per epoch. The rank reports the training loader's: the first loader with a
  backward or an optimizer step between two of its batches (an evaluation loop has none, and
  its loader often has other workers: Lightning's ``val_dataloader``, the Trainer's periodic
  evaluation). Until one has trained, the loader iterated last.
* Forward: global module hooks only until the model is known. The first module called at top
  level is taken as the model and gets its own hooks; the global ones are removed after
  ``discover_steps`` steps, so big models do not pay a Python call per submodule. A DDP or
  DataParallel wrapper is the model as soon as it is built.
* Backward: ``torch.autograd.backward``, which ``Tensor.backward`` calls by attribute.
* Optimizer: the global optimizer step pre/post hooks.
* Collective wait: a DDP communication hook that wraps the default all-reduce and times its
  futures. DDP accepts one hook: if the script registers its own, the timing wrapper wraps that
  one instead (before or after ours went in), so the script's hook always runs.
* Every other collective (all_reduce of a loss, all_gather, broadcast, barrier, reduce_scatter,
  the object collectives, FSDP's all-gathers and reduce-scatters): the functions in
  ``torch.distributed.distributed_c10d``, and their re-exports in ``torch.distributed``, are
  wrapped (frameworks call them by attribute at call time: ``dist.all_gather_single`` in FSDP2,
  ``torch.distributed.all_gather_into_tensor`` in accelerate). A synchronous call is collective
  wait as a whole; an ``async_op=True`` call returns its ``Work`` untouched (FSDP checks its
  type) and ``Work.wait`` is timed instead, under the name of the call that launched it.
  Only the outermost call is timed (``all_gather_object`` runs ``all_gather`` inside), only on
  the training thread, and never inside the DDP comm hook (timed there already). A call on
  another thread (a metric or checkpoint thread) is no phase of the step: it is counted, and
  the rank lists "collectives off the training thread" as not measured.
* Host-to-device copy: ``Tensor.to``/``.cuda``/``.pin_memory`` on the training thread, timed only
  between a batch's arrival and the step's first forward (the methods are swapped in for that
  window only, so a model's own ``.to`` calls cost nothing), and never inside a collective (the
  object collectives move their pickled bytes with ``.to``: that is the collective's wait).
* FSDP (``fully_shard``'s ``FSDPModule``, or ``FullyShardedDataParallel``): recognised by its
  class when the root module is first called; that root is the model.

Everything is wrapped in ``try``: if a hook cannot attach, the job runs untouched and the phase
is reported as not measured.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import os
import socket
import sys
import threading
import weakref
from collections.abc import Callable
from time import thread_time
from typing import Any, TypeVar

from auditor.samples import OFF_THREAD_COLLECTIVES, LoaderConfig, RankInfo

from .clock import PHASE_COLLECTIVE, PHASE_H2D, CpuTimer, CudaTimer, StepClock
from .memory import ACTIVATIONS_EVERY, MemoryMeter
from .sink import Sink, memory_message, step_message

_DEFAULT_SINK_DIR = "/tmp/auditor-{uid}"
_N = TypeVar("_N", int, float)


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


def batch_size_of(batch: Any, _depth: int = 0) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor (tuples, lists, dicts)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if _depth > 3:
        return None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_size_of(item, _depth + 1)
            if n is not None:
                return n
    elif isinstance(batch, dict):
        for item in batch.values():
            n = batch_size_of(item, _depth + 1)
            if n is not None:
                return n
    return None


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
        self._known_group: tuple[int, int] | None = None
        self.parallel_mode = "none"
        self.devices: tuple[int, ...] = ()
        self.device = "cpu"
        self.loader: LoaderConfig | None = None
        self.worker_pids: tuple[int, ...] = ()
        # The DataLoader whose batches train (see _hook_dataloader), and the step of its last
        # batch; None until one has trained.
        self.train_loader: weakref.ref[Any] | None = None
        self.train_loader_step = 0
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
        self._model_hooks: list[Any] = []
        self._lock = threading.Lock()
        # The thread the training loop runs on (where the model's forward runs); the collective
        # and copy timers ignore every other thread (DataLoader pinning, DDP's autograd threads).
        self.tid = threading.get_ident()
        self._coll_depth = 0  # inside a timed collective: nested ones are part of it
        self._h2d_open = False
        self._h2d_swap: Callable[[bool], None] | None = None
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
        self.sink = Sink(
            self.sink_path,
            collect=self._collect,
            hello=self._hello,
            interval_s=_env_number("AUDITOR_PROBE_FLUSH_S", 0.5, float),
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
        return group[0] if group else int(os.environ.get("RANK", "0"))

    def world_size(self) -> int:
        group = self._group()
        return group[1] if group else int(os.environ.get("WORLD_SIZE", "1"))

    def info(self) -> RankInfo:
        return RankInfo(
            rank=self.rank(),
            world_size=self.world_size(),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
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
        )

    def _hello(self) -> dict[str, Any]:
        info = self.info().to_dict()
        self._info_sent = info
        self._workers_sent = None
        if self.memory is not None:
            self.memory.resend()
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
        if steps:
            msgs.append(step_message(self.rank(), steps))
        budget = self.memory.take() if self.memory is not None else None
        if budget is not None:
            msgs.append(memory_message(budget))
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
        self.clock.flush_open()
        self.sink.close(timeout_s=self._exit_wait_s())

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
        """A batch is in hand: time the copy calls until the step's first forward."""
        if not self._h2d_open and self._h2d_swap is not None:
            self._h2d_swap(True)
            self._h2d_open = True

    def close_h2d(self) -> None:
        if self._h2d_open and self._h2d_swap is not None:
            self._h2d_swap(False)
            self._h2d_open = False

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) must not report as the rank it was forked from."""
        self.enabled = False
        self.active = False
        self.sink.abandon()

    # --- model discovery ---------------------------------------------------------------------
    def set_model(self, module: Any) -> None:
        if self.model is module:
            return
        for h in self._model_hooks:
            h.remove()
        # First in, last out: FSDP's own pre-forward all-gather and post-forward reshard are
        # inside the model's forward (their collective wait carved out of it).
        self._model_hooks = [
            module.register_forward_pre_hook(self._model_pre, prepend=True),
            module.register_forward_hook(self._model_post, always_call=True),
        ]
        self.model = module
        self._remove_global_forward()

    def _remove_global_forward(self) -> None:
        for h in self._global_fwd:
            h.remove()
        self._global_fwd = []

    def _model_pre(self, module: Any, args: Any) -> None:
        if self.enabled and (self.active or self.activate()):
            self.tid = threading.get_ident()
            if self._h2d_open:
                self.close_h2d()
            self.clock.forward_begin()
            if self.memory is not None and not self.clock.in_backward:
                self.memory.forward_begin(module, batch_size_of(args))

    def _model_post(self, module: Any, args: Any, output: Any) -> None:
        if self.active:
            if self.memory is not None:
                self.memory.forward_end()
            self.clock.forward_end()

    def _global_pre(self, module: Any, args: Any) -> None:
        if self._fwd_depth == 0 and self.enabled and (self.active or self.activate()):
            if self.model is None and self.clock.steps >= self._discover_steps:
                self._remove_global_forward()
            if not self.clock.in_backward:
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
            if self.model is not None or self.clock.in_backward:
                return  # a top-level call inside backward is checkpointing's recompute
            if _is_fsdp(module):
                self.parallel_mode = "fsdp"
                self.set_model(module)
            elif self.clock.steps + 1 >= self._discover_steps:
                self.set_model(module)


_PROBE: Probe | None = None


def current() -> Probe | None:
    return _PROBE


def attach(torch: Any, *, sink_path: str | None = None, job: str = "") -> Probe | None:
    """Install every hook into ``torch`` once per process; returns the probe (or None)."""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    probe = Probe(torch, sink_path=sink_path, job=job)
    _PROBE = probe
    for name, fn in (
        ("data", _hook_dataloader),
        ("h2d", _hook_h2d),
        ("collectives", _hook_collectives),
        ("forward", _hook_forward),
        ("backward", _hook_backward),
        ("optimizer", _hook_optimizer),
        ("collective_wait", _hook_ddp),
        ("dataparallel", _hook_dataparallel),
    ):
        try:
            fn(probe, torch)
        except Exception as exc:  # never break the job: report the phase as not measured
            probe.mark_unmeasured("collective_wait" if name == "collectives" else name)
            if os.environ.get("AUDITOR_DEBUG"):
                print(f"auditor probe: could not hook {name}: {exc!r}", file=sys.stderr)
    os.register_at_fork(after_in_child=probe.after_fork_in_child)
    return probe


def _hook_dataloader(probe: Probe, torch: Any) -> None:
    dl = importlib.import_module("torch.utils.data.dataloader")
    base_iter = dl._BaseDataLoaderIter
    orig_next = base_iter.__next__
    orig_iter = dl.DataLoader.__iter__
    clock = probe.clock

    @functools.wraps(orig_next)
    def __next__(self: Any) -> Any:
        if not probe.enabled or not (probe.active or probe.activate()):
            return orig_next(self)
        if clock.in_phase is None:
            probe._fwd_depth = 0  # a batch between steps: no module call is open
        began = clock.data_begin()
        cpu = thread_time()
        batch = None
        try:
            batch = orig_next(self)
        finally:
            # Also when the loader raises (StopIteration at the end of an epoch, a worker's
            # error): the data phase ends here, or the collectives after it (a metric sync
            # between epochs) would read as part of the loader and go untimed.
            # The main thread's CPU while it waited: the loading's cost with num_workers=0
            # (I/O waits cost none), about zero with workers.
            cpu = thread_time() - cpu
            clock.data_end(began, batch_size_of(batch), cpu)
        probe.open_h2d()
        seen = getattr(self, "_auditor_loader", None)
        if seen is not None:
            _loader_batch(probe, seen)
        return batch

    @functools.wraps(orig_iter)
    def __iter__(self: Any) -> Any:
        it = orig_iter(self)
        if probe.enabled:
            try:
                workers = getattr(it, "_workers", None) or ()
                seen = _SeenLoader(
                    weakref.ref(self),
                    _loader_config(self),
                    tuple(int(w.pid) for w in workers if w.pid),
                )
                # A persistent loader hands out the same iterator each epoch: this epoch's.
                it._auditor_loader = seen
                train = probe.train_loader() if probe.train_loader is not None else None
                if train is None or train is self:
                    probe.loader, probe.worker_pids = seen.config, seen.worker_pids
            except Exception:
                pass
        return it

    base_iter.__next__ = __next__
    dl.DataLoader.__iter__ = __iter__


class _SeenLoader:
    """One epoch of a DataLoader: its settings, its workers and where its last batch was."""

    __slots__ = ("config", "loader", "updates", "worker_pids")

    def __init__(
        self, loader: weakref.ref[Any], config: LoaderConfig, worker_pids: tuple[int, ...]
    ) -> None:
        self.loader = loader
        self.config = config
        self.worker_pids = worker_pids
        self.updates: int | None = None  # the clock's backward/optimizer count at its last batch


# Steps the training loader may go without a batch before another loader that trains takes its
# place (a job that moves on to a new loader); two loaders feeding every step keep the first.
_TRAIN_LOADER_IDLE_STEPS = 2


def _loader_batch(probe: Probe, seen: _SeenLoader) -> None:
    """A batch from ``seen``'s loader: it trains when a backward or an optimizer step came
    between its previous batch and this one. The rank then reports its settings and workers."""
    clock = probe.clock
    before, seen.updates = seen.updates, clock.updates
    train = probe.train_loader() if probe.train_loader is not None else None
    loader = seen.loader()
    if loader is None:
        return
    if train is loader:
        probe.train_loader_step = clock.steps
        if probe.loader is not seen.config:  # a new epoch's workers
            probe.loader, probe.worker_pids = seen.config, seen.worker_pids
        return
    if before is None or before == clock.updates:
        return  # no training between its batches: an evaluation loop, or its first batch
    if train is not None and clock.steps - probe.train_loader_step <= _TRAIN_LOADER_IDLE_STEPS:
        return
    probe.train_loader = seen.loader
    probe.train_loader_step = clock.steps
    probe.loader, probe.worker_pids = seen.config, seen.worker_pids


def _loader_config(loader: Any) -> LoaderConfig:
    sampler = getattr(loader, "sampler", None)
    prefetch = getattr(loader, "prefetch_factor", None)
    return LoaderConfig(
        num_workers=int(loader.num_workers),
        pin_memory=bool(loader.pin_memory),
        prefetch_factor=int(prefetch) if prefetch is not None else None,
        persistent_workers=bool(loader.persistent_workers),
        batch_size=loader.batch_size,
        drop_last=bool(loader.drop_last),
        sampler=type(sampler).__name__ if sampler is not None else "",
        dataset=type(loader.dataset).__name__,
    )


def _hook_forward(probe: Probe, torch: Any) -> None:
    m = importlib.import_module("torch.nn.modules.module")
    probe._global_fwd = [
        m.register_module_forward_pre_hook(probe._global_pre),
        # always_call: a forward that raises still ends (non-reentrant checkpointing stops its
        # recompute with an exception once it has the tensors it needs).
        m.register_module_forward_hook(probe._global_post, always_call=True),
    ]


def _hook_backward(probe: Probe, torch: Any) -> None:
    autograd = torch.autograd
    orig = autograd.backward
    clock = probe.clock

    @functools.wraps(orig)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not probe.active:
            return orig(*args, **kwargs)
        probe.close_h2d()
        clock.backward_begin()
        try:
            return orig(*args, **kwargs)
        finally:
            clock.backward_end()

    autograd.backward = backward


def _hook_optimizer(probe: Probe, torch: Any) -> None:
    opt = importlib.import_module("torch.optim.optimizer")
    clock = probe.clock

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if probe.enabled and (probe.active or probe.activate()):
            probe.close_h2d()
            clock.optimizer_begin()

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if probe.active:
            clock.optimizer_end()
            if probe.memory is not None:
                try:
                    probe.memory.after_step(probe.model, optimizer)
                except Exception:
                    pass  # the probe must never take the training job down

    opt.register_optimizer_step_pre_hook(pre)
    opt.register_optimizer_step_post_hook(post)


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
        clock.bucket_launched()
        # The inner hook's own dist.all_reduce is this wait: not timed a second time.
        clock.hook_depth += 1
        try:
            fut = self.inner(self.state, bucket)
        finally:
            clock.hook_depth -= 1

        def done(f: Any) -> Any:
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


def _hook_ddp(probe: Probe, torch: Any) -> None:
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


def _hook_dataparallel(probe: Probe, torch: Any) -> None:
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


def _is_fsdp(module: Any) -> bool:
    """FSDP2 (``fully_shard`` turns the module's class into a subclass of ``FSDPModule``) or
    FSDP1 (``FullyShardedDataParallel``), by class name: no import of torch's FSDP package."""
    return any(c.__name__ in _FSDP_CLASSES for c in type(module).__mro__)


_FSDP_CLASSES = frozenset(("FSDPModule", "FullyShardedDataParallel"))

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


def _hook_collectives(probe: Probe, torch: Any) -> None:
    if not torch.distributed.is_available():
        return
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    dist = torch.distributed
    clock = probe.clock
    get_ident = threading.get_ident
    # Names of async Works launched through the wrappers, until they are waited on.
    launched: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
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
                        launched[work] = name
                    except TypeError:
                        pass
                return work
            clock.collective_begin(name)
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
            name = launched.pop(self, None) or "wait"
        except TypeError:
            name = "wait"
        clock.collective_begin(name)
        probe._coll_depth += 1
        try:
            return orig_wait(self, *args, **kwargs)
        finally:
            probe._coll_depth -= 1
            clock.collective_end()

    work_cls.wait = wait


def _hook_h2d(probe: Probe, torch: Any) -> None:
    """Prepares the copy timers; :meth:`Probe.open_h2d` swaps them in for a batch's window."""
    tensor = torch.Tensor
    clock = probe.clock
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
                or clock.in_phase in (PHASE_H2D, PHASE_COLLECTIVE)
            ):
                return orig(self, *args, **kwargs)
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


def _debug(msg: str) -> None:
    if os.environ.get("AUDITOR_DEBUG"):
        print(f"auditor probe: {msg}", file=sys.stderr)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
