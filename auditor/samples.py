"""Sample types shared by every layer: what a rank, a process and a node report.

This module is a leaf: it imports nothing from the package, so the probe (inside training
ranks), the telemetry sources, the cluster actors and the pure analysis can all use it.

Conventions: durations in seconds, memory in bytes, CPU in cores (1.0 = one core fully busy),
wall-clock times in seconds since the epoch (ranks on different hosts are aligned by wall clock;
durations themselves come from monotonic clocks). ``None`` means "not measured", never zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

PARALLEL_MODES = ("ddp", "fsdp", "dataparallel", "none")

# Phases of one training step, in the order they happen. The probe measures each; the report,
# the metrics and the dashboards list them in this order.
PHASES = ("data_wait", "h2d", "forward", "backward", "optimizer", "collective_wait")


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
    # script registered a builtin comm hook); the report says what was not measured.
    unmeasured: tuple[str, ...] = ()
    job: str = ""
    # Set by a node agent serving several jobs: the key it files this rank's samples under
    # (rank numbers repeat across jobs). None: the rank number is the key.
    key: int | None = None

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
        return _from_dict(cls, d)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["key"] is None:  # a node-local detail: recordings and the wire stay as they were
            del d["key"]
        return d


@dataclass(frozen=True)
class StepSample:
    """One training step of one rank: the time between two optimizer steps, split by phase.

    ``collective_wait_s`` is the time the rank waited for its peers at the gradient all-reduce
    after finishing its own backward work (from the DDP communication hook); it is included in
    ``backward_s``, which is wall time. ``None`` where it could not be measured.
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
    # loading's cost in CPU; near zero means the wait was I/O (or workers). None: not measured.
    data_cpu_s: float | None = None
    # Collective wait of this step by operation (e.g. {"allreduce": 0.031, "all_gather": 0.002});
    # the values add up to ``collective_wait_s``. None: not measured.
    collective_ops: dict[str, float] | None = None
    # Steps this sample stands for: 1 from the probe; more when ``auditor serve`` rebuilds the
    # mean step of a scrape interval from Prometheus counters. Statistics weight by it.
    count: int = 1

    # Compact wire form: a list in this field order (NDJSON rows stay small on the hot path).
    @classmethod
    def wire_fields(cls) -> tuple[str, ...]:
        return _WIRE_FIELDS

    def to_row(self) -> list[Any]:
        return [getattr(self, name) for name in _WIRE_FIELDS]

    @classmethod
    def from_row(cls, row: list[Any]) -> StepSample:
        # An older probe sends a prefix of today's fields (new ones are appended with defaults).
        if not _MIN_WIRE_FIELDS <= len(row) <= len(_WIRE_FIELDS):
            raise ValueError(f"step row has {len(row)} fields, expected {len(_WIRE_FIELDS)}")
        return cls(**dict(zip(_WIRE_FIELDS, row, strict=False)))

    @property
    def compute_s(self) -> float:
        """Local work apart from data: h2d, forward, backward minus the wait, optimizer."""
        wait = self.collective_wait_s or 0.0
        return self.h2d_s + self.forward_s + max(0.0, self.backward_s - wait) + self.optimizer_s


# ``count`` stays off the wire: a rank always sends single steps.
_WIRE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(StepSample) if f.name != "count")
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


def _from_dict(cls: Any, d: dict[str, Any]) -> Any:
    """Build a dataclass from a dict, ignoring unknown keys (newer senders may add fields)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})
