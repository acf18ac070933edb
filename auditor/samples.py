"""Sample types shared by every layer: what a rank, a process and a node report.

This module is a leaf: it imports nothing from the package, so the probe (inside training
ranks), the telemetry sources, the cluster actors and the pure analysis can all use it.

Conventions: durations in seconds, memory in bytes, CPU in cores (1.0 = one core fully busy),
wall-clock times in seconds since the epoch (ranks on different hosts are aligned by wall clock;
durations themselves come from monotonic clocks). ``None`` means "not measured", never zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from operator import attrgetter
from typing import Any

PARALLEL_MODES = ("ddp", "fsdp", "deepspeed", "dataparallel", "none")

# Phases of one training step, in the order they happen. The probe measures each; the report,
# the metrics and the dashboards list them in this order.
PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "collective_wait")

# In ``RankInfo.unmeasured``: the rank called collectives from a thread other than its training
# loop's (a metric or checkpoint thread). Their wait is in no step's phases (another thread's
# time is not the step's); ``RankInfo.off_thread_collectives`` counts the calls.
OFF_THREAD_COLLECTIVES = "collectives off the training thread"


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader settings a rank trains with (read once from the DataLoader object)."""

    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    batch_size: int | None
    drop_last: bool
    sampler: str
    dataset: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoaderConfig:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class RankInfo:
    """What a rank says about itself once (updated when it learns more, e.g. its DataLoader)."""

    rank: int
    world_size: int
    local_rank: int = 0
    host: str = ""
    pid: int = 0
    device: str = "cpu"
    parallel_mode: str = "none"
    # DataParallel: the device indices one process drives; DDP: the rank's one device.
    devices: tuple[int, ...] = ()
    device_uuids: tuple[str, ...] = ()
    loader: LoaderConfig | None = None
    # Phases the probe could not attach to on this rank (e.g. "collective_wait" when the
    # script registered a builtin comm hook, ``OFF_THREAD_COLLECTIVES``); the report says what
    # was not measured.
    unmeasured: tuple[str, ...] = ()
    job: str = ""
    # torch.distributed collectives the rank called off its training thread (not timed).
    off_thread_collectives: int = 0
    # ``auditor run --apply``: the loader levers the probe moved on this rank's training loader,
    # ``(lever, from, to)``, and those planned that it kept, ``(lever, reason)``
    # (``auditor.probe.apply``'s reason codes).
    applied: tuple[tuple[str, Any, Any], ...] = ()
    apply_kept: tuple[tuple[str, str], ...] = ()
    # Set by a node agent serving several jobs: the key it files this rank's samples under
    # (rank numbers repeat across jobs). None: the rank number is the key.
    key: int | None = None
    # Wall-clock bounds of the rank's process, for the account of its whole run
    # (``analysis.accounting``): ``started_at`` the process start as the probe reads it
    # (``/proc/self/stat``; else when the probe attached); ``ended_at`` when it ended: the
    # probe's goodbye, then the node agent's moment of end-of-file on the rank's socket. None:
    # not known (an older probe; a rank still running).
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def slot(self) -> int:
        """The key of this rank's samples in a node agent's state."""
        return self.rank if self.key is None else self.key

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RankInfo:
        d = dict(d)
        loader = d.get("loader")
        d["loader"] = LoaderConfig.from_dict(loader) if isinstance(loader, dict) else None
        for key in ("devices", "device_uuids", "unmeasured"):
            if key in d and d[key] is not None:
                d[key] = tuple(d[key])
        for key in ("applied", "apply_kept"):
            d[key] = tuple(tuple(x) for x in d.get(key) or () if isinstance(x, (list, tuple)))
        return _from_dict(cls, d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # Left off where unknown: recordings and the wire stay as they were.
        for name in ("key", "started_at", "ended_at"):  # key: a node-local detail
            if d[name] is None:
                del d[name]
        for name in ("applied", "apply_kept"):  # only under ``auditor run --apply``
            if not d[name]:
                del d[name]
        return d


@dataclass(frozen=True)
class StepSample:
    """One training step of one rank: the time between two optimizer steps, split by phase.

    The phases are exclusive: every instant of the step is booked to at most one of
    ``data_wait_s``, ``h2d_s``, ``forward_s``, ``backward_s``, ``optimizer_s`` and
    ``collective_wait_s``, whatever the framework nests in what (the innermost phase takes the
    time: a forward run inside ``optimizer.step(closure)`` is forward, not optimizer; the wait
    inside a collective called from forward or backward is collective wait, not forward or
    backward). They add up to at most ``step_s``; the rest, time in no measured phase (the loop's
    own Python, logging, framework bookkeeping), is :attr:`other_s`.

    * ``h2d_s``: the batch's copy to the device (``Tensor.to``/``.cuda``/``.pin_memory`` on the
      training thread between the batch's arrival and the step's first forward); about zero on
      a CPU job.
    * ``backward_s``: backward's own work, activation checkpointing's recompute included, the
      collective wait inside it excluded (except where the DDP gradient all-reduce could not be
      timed: ``collective_wait_s`` is then None and that wait stays inside ``backward_s``).
    * ``collective_wait_s``: the time the rank waited in collectives: the DDP gradient
      all-reduce (from the communication hook: last bucket ready to last all-reduce done) and
      every ``torch.distributed`` collective the script or its framework called (a synchronous
      call whole, an asynchronous one's ``Work.wait()``), by operation in ``collective_ops``.
      ``None`` where it could not be measured (no collective seen in the step, or a DDP builtin
      comm hook the probe cannot time).

    Recordings before ``auditor.recording/v2`` and probes that predate ``data_cpu_s`` counted the
    collective wait inside ``backward_s``; readers convert them (:meth:`from_row`,
    ``telemetry.recorded``).
    """

    rank: int
    step: int
    time: float
    step_s: float
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    collective_wait_s: float | None = None
    batch_size: int | None = None
    rss_bytes: int | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    mem_peak_bytes: int | None = None
    # CPU seconds the rank's own main thread spent while it waited for this step's batches
    # (``time.thread_time`` around the loader's ``__next__``): with ``num_workers=0`` that is the
    # loading's cost in CPU; near zero means the wait was I/O (or workers). None: not measured
    # (the probe reads it after a wait of 1 ms or more, else on every 16th step only).
    data_cpu_s: float | None = None
    # Collective wait of this step by operation (e.g. {"allreduce": 0.031, "all_gather": 0.002});
    # the values add up to ``collective_wait_s``. None: not measured.
    collective_ops: dict[str, float] | None = None
    # Micro-batches of this step: the DataLoader batches it consumed (gradient accumulation
    # folds several into one optimizer step); ``batch_size`` is their sum. 1 without
    # accumulation, from older probes and recordings, and in ``auditor serve``'s samples.
    micro_batches: int = 1
    # Seconds of this step's :attr:`other_s` the probe saw spent in named work outside the
    # training phases (``{"checkpoint": 1.8, "evaluation": 0.0, "logging": 0.01,
    # "loader_start": 0.07}``: the rank's own work between its steps, e.g. ``torch.save`` on
    # rank 0 alone, or its loader starting workers); None: nothing named.
    outside: dict[str, float] | None = None
    # The probe counted this step's FLOPs (``auditor.probe.flops``): the counting cost the step
    # time, so the per-rank statistics the rules read leave the step out (``FlopCount.cost_s``
    # says what it cost). False on every other step.
    flops_counted: bool = False
    # Bytes each collective op carried in this step (keys as in ``collective_ops``; NCCL-tests'
    # size convention: an all-reduce's buffer, an all-gather's whole output, a reduce-scatter's
    # whole input). An op whose payload is not known (pickled objects, a barrier) is absent;
    # None: no bytes known in the step.
    collective_bytes: dict[str, int] | None = None
    # Seconds of this step spent starting its DataLoader's workers anew: shutting the last
    # epoch's down (the epoch's last ``__next__``) and waiting for the new ones' first batch
    # (both in ``data_wait_s``), and creating the iterator that starts them (named work
    # ``loader_start`` in :attr:`outside`). A loader without ``persistent_workers`` does this
    # at every epoch. None: none started in this step (and from older probes).
    loader_start_s: float | None = None
    # Steps this sample stands for: 1 from the probe; more when ``auditor serve`` rebuilds the
    # mean step of a scrape interval from Prometheus counters. Statistics weight by it.
    count: int = 1

    # Compact wire form: a list in this field order (NDJSON rows stay small on the hot path).
    @classmethod
    def wire_fields(cls) -> tuple[str, ...]:
        return _WIRE_FIELDS

    def to_row(self) -> list[Any]:
        row = list(_WIRE_VALUES(self))  # one C call for every field (the flush thread's hot path)
        # Trailing fields at their defaults stay off the row: without accumulation and named
        # outside work the row is what it was before those fields.
        for name in reversed(_OPTIONAL_TAIL):
            if row[-1] != _TAIL_DEFAULTS[name]:
                break
            row.pop()
        return row

    @classmethod
    def from_row(cls, row: list[Any]) -> StepSample:
        # An older probe sends a prefix of today's fields (new ones are appended with defaults).
        if not _MIN_WIRE_FIELDS <= len(row) <= len(_WIRE_FIELDS):
            raise ValueError(f"step row has {len(row)} fields, expected {len(_WIRE_FIELDS)}")
        sample = cls(**dict(zip(_WIRE_FIELDS, row, strict=False)))
        if len(row) == _MIN_WIRE_FIELDS:
            return sample.with_wait_out_of_backward()
        return sample

    def with_wait_out_of_backward(self) -> StepSample:
        """This sample from an older probe or recording, whose ``backward_s`` included the
        collective wait, in today's exclusive form."""
        if not self.collective_wait_s:
            return self
        return replace(self, backward_s=max(0.0, self.backward_s - self.collective_wait_s))

    @property
    def micro_batch_size(self) -> float | None:
        """Samples per micro-batch (the DataLoader's batch, what the user sets): ``batch_size``
        over ``micro_batches``; the batch size itself without accumulation."""
        if self.batch_size is None:
            return None
        return self.batch_size / self.micro_batches if self.micro_batches > 1 else self.batch_size

    @property
    def compute_s(self) -> float:
        """Local work apart from data: h2d, forward, backward (its wait excluded), optimizer."""
        return self.h2d_s + self.forward_s + self.backward_s + self.optimizer_s

    @property
    def other_s(self) -> float:
        """Step time in no measured phase: the loop's own Python, logging, framework
        bookkeeping (and, where ``collective_wait_s`` is None, the waits in collectives the
        script called itself)."""
        booked = self.data_wait_s + self.compute_s + (self.collective_wait_s or 0.0)
        return max(0.0, self.step_s - booked)


# ``count`` stays off the wire: a rank always sends single steps.
_WIRE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepSample) if f.name != "count")
# The last wire fields, each left off a row (with those after it) at its default: a row
# without them (an older probe, no accumulation, nothing named outside the phases) reads as
# the defaults.
_OPTIONAL_TAIL = ("micro_batches", "outside", "flops_counted", "collective_bytes", "loader_start_s")
_TAIL_DEFAULTS: dict[str, Any] = {
    "micro_batches": 1,
    "outside": None,
    "flops_counted": False,
    "collective_bytes": None,
    "loader_start_s": None,
}
assert _WIRE_FIELDS[-len(_OPTIONAL_TAIL) :] == _OPTIONAL_TAIL
_WIRE_VALUES = attrgetter(*_WIRE_FIELDS)
# Rows from a probe that predates ``data_cpu_s`` end at ``mem_peak_bytes``.
_MIN_WIRE_FIELDS = _WIRE_FIELDS.index("mem_peak_bytes") + 1


@dataclass(frozen=True)
class ProcessCpu:
    """CPU of one rank's main process and of its DataLoader worker processes (node side)."""

    rank: int
    time: float
    pid: int
    main_cpu: float | None
    worker_cpu: tuple[float, ...] = ()
    rss_bytes: int | None = None
    worker_rss_bytes: int | None = None
    # Time spent runnable but waiting for a core (the kernel's run-queue delay), in seconds a
    # second like the CPU figures: the main thread's, and the workers' together. None where
    # not measured (no ``/proc/<pid>/schedstat``, or a process's first sample).
    main_wait: float | None = None
    worker_wait: float | None = None

    @property
    def workers(self) -> int:
        return len(self.worker_cpu)

    @property
    def worker_cpu_total(self) -> float:
        return sum(self.worker_cpu)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProcessCpu:
        d = dict(d)
        d["worker_cpu"] = tuple(d.get("worker_cpu") or ())
        return _from_dict(cls, d)


@dataclass(frozen=True)
class NodeCpu:
    """One node's CPU capacity and use."""

    host: str
    time: float
    cores: float
    busy_cores: float
    load1: float
    # Samples this one stands for: 1 from a host sampler; more when ``auditor serve`` rebuilds
    # the window's median from Prometheus.
    samples: int = 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeCpu:
        return _from_dict(cls, d)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (host PID as NVML reports it)."""

    pid: int
    used_bytes: int | None = None


@dataclass(frozen=True)
class DeviceSample:
    """One consistent NVML read of one physical GPU.

    Ratios are 0..1 (NVML's percentages / 100). ``None`` is "not supported or not permitted on
    this device", never zero. ``lost`` marks a GPU that fell off the bus: its other fields are
    None and it must not read as an idle GPU.
    """

    node: str
    index: int
    uuid: str
    time: float
    model: str = ""
    lost: bool = False
    gpu_util: float | None = None
    mem_util: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    # Decoded clock-event (throttle) reasons that are active, e.g. ("sw_thermal_slowdown",).
    throttle_reasons: tuple[str, ...] | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    processes: tuple[GpuProcess, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceSample:
        d = dict(d)
        d["processes"] = tuple(
            GpuProcess(**p) if isinstance(p, dict) else GpuProcess(*p)
            for p in d.get("processes") or ()
        )
        if d.get("throttle_reasons") is not None:
            d["throttle_reasons"] = tuple(d["throttle_reasons"])
        return _from_dict(cls, d)


@dataclass(frozen=True)
class Batch:
    """Samples handed from a node to whoever analyses them (the wire between actor and driver)."""

    infos: tuple[RankInfo, ...] = ()
    steps: tuple[StepSample, ...] = ()
    processes: tuple[ProcessCpu, ...] = ()
    nodes: tuple[NodeCpu, ...] = ()
    devices: tuple[DeviceSample, ...] = ()
    # Ranks whose connection closed: the rank process ended (normally or not).
    ended: tuple[int, ...] = field(default_factory=tuple)
    # Memory budgets the ranks measured (sent when they change; the latest per rank counts).
    memory: tuple[MemoryBudget, ...] = ()
    # Of ``ended``: ranks whose connection closed without the probe's goodbye (killed, crashed
    # hard): the rank died.
    died: tuple[int, ...] = ()
    # FLOPs per step the ranks counted (a few per rank: see ``FlopCount``).
    flops: tuple[FlopCount, ...] = ()


def _from_dict(cls: Any, d: dict[str, Any]) -> Any:
    """Build a dataclass from a dict, ignoring unknown keys (newer senders may add fields)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class MemoryBudget:
    """What one rank's training holds, measured from its tensors (``auditor.probe.memory``).

    memory = the fixed part (parameters + gradients + optimizer state + buffers) + batch x
    activations per sample. Bytes of unique storages (shared parameters and views count once);
    FSDP: this rank's shards; DataParallel: ``per_device`` adds the parameters' replica on each
    other device. ``optimizer_bytes_by_kind`` is keyed by the optimizer's state names
    (``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``, ``step``, ...). Activations are the
    bytes autograd saved for backward in one sampled forward (the first, then every
    ``activations_every``-th, less often while the figure holds: ``auditor.probe.memory``) of a
    batch of ``activation_batch``; None until one was sampled. ``other_module_bytes``:
    parameters and buffers of modules outside the model (an EMA or evaluation copy).
    ``device_total_bytes``: the GPU's total (None on CPU); ``device_outside_bytes``: what the
    GPU holds outside this process's caching allocator (its CUDA context, NCCL's buffers, other
    processes: total - free - reserved); ``device_peak_bytes``: the allocator's peak reserved
    bytes (temporaries, fragmentation and DDP's gradient buckets on top of what the budget
    counts). The host's figures are the whole host's, shared by ``local_ranks`` ranks.
    """

    rank: int
    time: float
    step: int
    device: str = "cpu"
    param_count: int = 0
    param_numel: int = 0
    param_bytes: int = 0
    param_bytes_by_dtype: dict[str, int] = field(default_factory=dict)
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    optimizer_bytes_by_kind: dict[str, int] = field(default_factory=dict)
    optimizer: str = ""
    buffer_bytes: int = 0
    per_device: dict[str, int] = field(default_factory=dict)
    sharded: bool = False
    replicas: int = 0
    other_module_bytes: int = 0
    activation_bytes: int | None = None
    activation_batch: int | None = None
    activation_step: int | None = None
    activations_every: int | None = None
    device_total_bytes: int | None = None
    device_outside_bytes: int | None = None
    device_peak_bytes: int | None = None
    host_total_bytes: int | None = None
    host_available_bytes: int | None = None
    local_ranks: int = 1

    @property
    def fixed_bytes(self) -> int:
        """Parameters, gradients, optimizer state and buffers: what does not grow with the
        batch (extra module copies apart)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.buffer_bytes

    @property
    def activations_per_sample(self) -> float | None:
        if self.activation_bytes is None or not self.activation_batch:
            return None
        return self.activation_bytes / self.activation_batch

    def parts(self) -> dict[str, int | None]:
        """The budget by part, as the metric catalog's ``part`` label names them."""
        return {
            "parameters": self.param_bytes,
            "gradients": self.grad_bytes,
            "optimizer_state": self.optimizer_bytes,
            "buffers": self.buffer_bytes,
            "other_modules": self.other_module_bytes,
            "activations": self.activation_bytes,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryBudget:
        return _from_dict(cls, d)


# The dtype classes a FLOP count is split by (``FlopCount.by_dtype``): "tf32" is an fp32 matmul or
# convolution on CUDA while TF32 was allowed for it; on CPU fp32 stays "fp32".
FLOP_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64", "fp8", "int8", "other")


@dataclass(frozen=True)
class FlopCount:
    """The FLOPs of one whole optimizer step of one rank, counted from the operations that ran
    (``auditor.probe.flops``): forward and backward of every micro-batch, each matrix multiply,
    convolution and attention kernel by ``torch.utils.flop_counter``'s formulas, never estimated
    from a parameter count. Counted once on a sampled step after warm-up, and again when the
    model's input shape changes.

    ``by_dtype``: the FLOPs by the dtype they ran in (keys among :data:`FLOP_DTYPES`; the values
    add up to ``flops``). ``micro_batches``: the model's forwards in the counted step (gradient
    accumulation); ``samples``: the samples they took (None: not known). ``device``: "cuda" or
    "cpu", where most of the counted FLOPs ran. ``cost_s``: the extra seconds the counted step
    took over the rank's steps on either side of it (the counting's cost; None: not known).
    """

    rank: int
    time: float
    step: int
    flops: float
    by_dtype: dict[str, float] = field(default_factory=dict)
    micro_batches: int = 1
    samples: int | None = None
    device: str = "cpu"
    cost_s: float | None = None

    @property
    def flops_per_micro_batch(self) -> float:
        return self.flops / self.micro_batches if self.micro_batches > 0 else self.flops

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FlopCount:
        d = dict(d)
        d["by_dtype"] = {str(k): float(v) for k, v in (d.get("by_dtype") or {}).items()}
        return _from_dict(cls, d)
