"""dcgm-exporter as a GPU source: its exposition, its fields in the auditor's units, its labels.

Most GPU fleets already run NVIDIA's dcgm-exporter (the GPU Operator's default). Where they do,
``auditor serve``, the dashboards and the alert rules read its series instead of the auditor's
own ``GpuMonitor`` actors (``auditor run --gpu-source dcgm`` starts none), and join them to the
job's ranks by GPU UUID: each rank reports the UUIDs of the GPUs it uses
(``auditor_gpu_owner_info``), dcgm-exporter labels every series with ``UUID``.

What dcgm-exporter exports (its ``default-counters.csv``; the GPU Operator's
``dcp-metrics-included.csv`` has the same device fields), in its own units:

* ``DCGM_FI_DEV_GPU_UTIL``, ``DCGM_FI_DEV_MEM_COPY_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` and
  ``DCGM_FI_DEV_FB_FREE`` (MiB), ``DCGM_FI_DEV_SM_CLOCK`` and ``DCGM_FI_DEV_MEM_CLOCK`` (MHz),
  ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_GPU_TEMP`` (C), ``DCGM_FI_DEV_XID_ERRORS`` (the
  last XID: 79 is "fallen off the bus", read as lost), and a few the rules do not read.
* labels ``gpu`` (the index), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia0``), ``modelName``,
  ``Hostname`` and ``DCGM_FI_DRIVER_VERSION``; under Kubernetes also ``pod``, ``namespace`` and
  ``container`` of the pod holding the GPU.

The default set has no throttle reasons, no maximum clocks, no power limit and no PCIe link.
:data:`AUDITOR_FIELDS` are the DCGM fields that carry them; ``deploy/dcgm/counters.csv`` is the
default set plus those lines and the two profiling fields of :data:`PROFILING_FIELDS` (SM and
tensor pipe activity), which the underused-node alert reads where a job reports no MFU. Without
the auditor's fields, the SM clock's maximum is taken as the highest SM clock any GPU of the same
model reached in the last hour (a throttled GPU still stands out from its peers), and the
throttle share and PCIe link are unknown (never zero); without the profiling fields, the alert
judges by busy time.

Names the auditor gives them: :data:`FIELDS` maps each onto its ``auditor_gpu_*`` metric and the
factor to the auditor's base units (ratios 0..1, bytes, hertz). Labels: ``UUID`` -> ``uuid``,
``Hostname`` -> ``node``, ``modelName`` -> ``model``, ``gpu`` stays. A GPU a rank uses takes the
rank's ``node`` (so ``Hostname`` need not match it); a GPU no rank uses keeps ``Hostname`` as its
node, which must then be the auditor's node name (the host name, or ``AUDITOR_NODE``) for serve to
see it idle on a job's node: relabel ``Hostname`` in the scrape config where they differ.

This module also serves that exposition for recorded GPUs (:class:`DcgmExposition`,
``auditor replay --gpu-source dcgm``), so tests and demos have a real Prometheus scrape
dcgm-exporter's names, labels and units on a machine without GPUs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Literal

from auditor.samples import DeviceSample

from . import catalog as C

MIB = 1 << 20
MHZ = 1e6
XID_FALLEN_OFF_BUS = 79
# Where DCGM_FI_DEV_MAX_SM_CLOCK is not exported: the highest SM clock any GPU of the same model
# reached over this long stands for the maximum.
CLOCK_PEAK_WINDOW = "1h"
# The labels dcgm-exporter puts on every device series, in its order.
LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")
# Its labels that name what the auditor's GPU labels name.
UUID_LABEL, HOST_LABEL, MODEL_LABEL, INDEX_LABEL = "UUID", "Hostname", "modelName", "gpu"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The clock-event (throttle) reasons bitmask, NVML's bits (DCGM reports NVML's mask as is).
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
    "board_limit": 0x200,
    "reliability": 0x400,
}
# DCGM 3.3 renamed the field; an exporter serves one of the two names.
THROTTLE_FIELDS = ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")


@dataclass(frozen=True)
class DcgmField:
    """One dcgm-exporter series: its name, type and help (as in its counters file), the
    ``auditor_gpu_*`` metric it maps onto ("" where none) and the factor to that metric's unit."""

    name: str
    type: Literal["gauge", "counter"]
    help: str
    auditor: str = ""
    scale: float = 1.0


DEFAULT_FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        C.GPU_SM_CLOCK_HERTZ.name,
        MHZ,
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        C.GPU_MEMORY_CLOCK_HERTZ.name,
        MHZ,
    ),
    DcgmField(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        C.GPU_TEMPERATURE_CELSIUS.name,
    ),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", C.GPU_POWER_WATTS.name),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
    ),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    DcgmField(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        C.GPU_UTILIZATION_RATIO.name,
        0.01,
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        C.GPU_MEMORY_UTILIZATION_RATIO.name,
        0.01,
    ),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    DcgmField(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        C.GPU_MEMORY_USED_BYTES.name,
        MIB,
    ),
    DcgmField(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    DcgmField(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
)
"""dcgm-exporter's default counters that a recording can fill (memory temperature, PCIe and
NVLink throughput and vGPU licence status are left out: no recording holds them)."""

AUDITOR_FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        THROTTLE_FIELDS[0],
        "gauge",
        "Current clock throttle reasons (bitmask).",
    ),
    DcgmField(
        "DCGM_FI_DEV_MAX_SM_CLOCK",
        "gauge",
        "Maximum SM clock frequency (in MHz).",
        C.GPU_SM_CLOCK_MAX_HERTZ.name,
        MHZ,
    ),
    DcgmField(
        "DCGM_FI_DEV_MAX_MEM_CLOCK",
        "gauge",
        "Maximum memory clock frequency (in MHz).",
        C.GPU_MEMORY_CLOCK_MAX_HERTZ.name,
        MHZ,
    ),
    DcgmField(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "gauge",
        "Effective power limit (in W).",
        C.GPU_POWER_LIMIT_WATTS.name,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "gauge",
        "PCIe current link generation.",
        C.GPU_PCIE_LINK_GENERATION.name,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "gauge",
        "PCIe current link width.",
        C.GPU_PCIE_LINK_WIDTH.name,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "gauge",
        "PCIe max link generation.",
        C.GPU_PCIE_LINK_GENERATION_MAX.name,
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "gauge",
        "PCIe max link width.",
        C.GPU_PCIE_LINK_WIDTH_MAX.name,
    ),
)
"""The fields the auditor reads beyond the default set (``deploy/dcgm/counters.csv`` adds them)."""

PROFILING_FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        C.GPU_SM_ACTIVE_RATIO.name,
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        C.GPU_TENSOR_PIPE_ACTIVE_RATIO.name,
    ),
)
"""DCGM's profiling (DCP) fields that say what the GPU achieves, not only whether a kernel ran:
the share of cycles an SM had a warp, and the share the tensor pipe was active (0..1, already the
auditor's unit). ``AuditorUnderusedMultiGpuNode`` judges a job by them where the job reports no
MFU. DCGM reads them on data-center GPUs (Volta and later) only, one profiling session per GPU
(Nsight Compute or another DCGM profiling client on the GPU take it over); where it cannot, the
exporter leaves them out. The auditor's NVML monitors do not measure them and no recording holds
them: they are never in an exposition of recorded GPUs."""

FIELDS: tuple[DcgmField, ...] = DEFAULT_FIELDS + AUDITOR_FIELDS
# dcgm-exporter's other default counters: in the counters file, never in a recording.
UNRECORDED_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    DcgmField(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "counter",
        "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
    ),
    DcgmField(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "counter",
        "Total number of bytes received through PCIe RX (in KB) via NVML.",
    ),
    DcgmField(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
    ),
    DcgmField("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
)
BY_NAME: dict[str, DcgmField] = {f.name: f for f in FIELDS}
_PROFILING = frozenset(f.name for f in PROFILING_FIELDS)
# The auditor's metric -> the DCGM field it is read from (only fields that map one to one).
FOR_AUDITOR: dict[str, DcgmField] = {f.auditor: f for f in FIELDS if f.auditor}
COUNTER_SETS = {"default": DEFAULT_FIELDS, "auditor": FIELDS}


def counters_csv(
    fields: Sequence[DcgmField] = FIELDS + PROFILING_FIELDS + UNRECORDED_FIELDS,
) -> str:
    """A dcgm-exporter counters file (``-f``) with ``fields``: ``deploy/dcgm/counters.csv``."""
    lines = [
        "# dcgm-exporter counters for the GPU Balance Auditor: dcgm-exporter's default device",
        "# fields plus the ones the auditor's GPU rules read (throttle reasons, maximum clocks,",
        "# power limit, PCIe link) and the profiling fields its underused-node alert judges by",
        "# (SM and tensor pipe activity; data-center GPUs only). Generated by",
        "# `python -m auditor dashboards render`.",
        "# DCGM FIELD, Prometheus metric type, help message",
        "",
    ]
    lines += [f"{f.name}, {f.type}, {f.help}" for f in fields]
    return "\n".join(lines) + "\n"


def with_uuid(expr: str) -> str:
    """PromQL: ``expr``'s series with DCGM's ``UUID`` copied into the auditor's ``uuid``."""
    return f'label_replace({expr}, "uuid", "$1", "{UUID_LABEL}", "(.+)")'


def sm_clock_max(window: str = CLOCK_PEAK_WINDOW) -> str:
    """PromQL: each GPU's maximum SM clock in MHz, with dcgm-exporter's labels: its own
    ``DCGM_FI_DEV_MAX_SM_CLOCK`` where exported, else the highest SM clock any GPU of its model
    reached over ``window``."""
    clock = "DCGM_FI_DEV_SM_CLOCK"
    return (
        f"DCGM_FI_DEV_MAX_SM_CLOCK or on ({UUID_LABEL}) ({clock} * 0 + on ({MODEL_LABEL}) "
        f"group_left max by ({MODEL_LABEL}) (max_over_time({clock}[{window}])))"
    )


def with_auditor_labels(expr: str) -> str:
    """PromQL: ``expr``'s series with the auditor's GPU labels (``uuid``, ``node``, ``model``)
    copied from DCGM's (``UUID``, ``Hostname``, ``modelName``); ``gpu`` is the same in both."""
    out = with_uuid(expr)
    out = f'label_replace({out}, "node", "$1", "{HOST_LABEL}", "(.+)")'
    return f'label_replace({out}, "model", "$1", "{MODEL_LABEL}", "(.+)")'


# ------------------------------------------------------------------------------------------------
# the exposition of recorded GPUs


def throttle_mask(reasons: Iterable[str]) -> int:
    """NVML's bitmask of clock-event reasons named as the auditor names them."""
    mask = 0
    for reason in reasons:
        mask |= REASON_BITS.get(reason, 0)
    return mask


def field_value(field: DcgmField, s: DeviceSample, energy_mj: float = 0.0) -> float | None:
    """``field`` of sample ``s`` in dcgm-exporter's unit; None where the sample does not have it
    (dcgm-exporter then exports no series for it)."""
    name = field.name
    if name == "DCGM_FI_DEV_XID_ERRORS":
        return float(XID_FALLEN_OFF_BUS if s.lost else 0)
    if s.lost:
        return None  # a GPU off the bus answers nothing else
    if name in _PROFILING:
        return None  # NVML does not read them: a recording has none (never zero)
    if name == "DCGM_FI_DEV_FB_FREE":
        if s.mem_total_bytes is None or s.mem_used_bytes is None:
            return None
        return float((s.mem_total_bytes - s.mem_used_bytes) // MIB)
    if name == "DCGM_FI_DEV_FB_USED":
        return None if s.mem_used_bytes is None else float(s.mem_used_bytes // MIB)
    if name in THROTTLE_FIELDS:
        return None if s.throttle_reasons is None else float(throttle_mask(s.throttle_reasons))
    if name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":
        return None if s.power_w is None else round(energy_mj)
    source: dict[str, float | int | None] = {
        "DCGM_FI_DEV_SM_CLOCK": s.sm_clock_mhz,
        "DCGM_FI_DEV_MEM_CLOCK": s.mem_clock_mhz,
        "DCGM_FI_DEV_GPU_TEMP": s.temperature_c,
        "DCGM_FI_DEV_POWER_USAGE": s.power_w,
        "DCGM_FI_DEV_GPU_UTIL": None if s.gpu_util is None else round(s.gpu_util * 100),
        "DCGM_FI_DEV_MEM_COPY_UTIL": None if s.mem_util is None else round(s.mem_util * 100),
        "DCGM_FI_DEV_MAX_SM_CLOCK": s.sm_clock_max_mhz,
        "DCGM_FI_DEV_MAX_MEM_CLOCK": s.mem_clock_max_mhz,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": s.power_limit_w,
        "DCGM_FI_DEV_PCIE_LINK_GEN": s.pcie_gen,
        "DCGM_FI_DEV_PCIE_LINK_WIDTH": s.pcie_width,
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": s.pcie_gen_max,
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": s.pcie_width_max,
    }
    if name in source:
        value = source[name]
        return None if value is None else float(value)
    return 0.0  # counters and gauges nothing in a recording moves: errors, retries, enc/dec


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


@dataclass(frozen=True)
class Gpu:
    """One GPU to expose: its latest sample and the energy it used so far (mJ)."""

    sample: DeviceSample
    energy_mj: float = 0.0


def exposition(
    gpus: Sequence[Gpu],
    *,
    hostname: str,
    fields: Sequence[DcgmField] = FIELDS,
    driver: str = "550.90.07",
) -> str:
    """dcgm-exporter's text exposition of ``gpus``: ``# HELP`` and ``# TYPE`` per field, one series
    per GPU labelled as dcgm-exporter labels it, no timestamps (Prometheus stamps the scrape)."""
    ordered = sorted(gpus, key=lambda g: (g.sample.index, g.sample.uuid))
    lines: list[str] = []
    for field in fields:
        rows = []
        for g in ordered:
            value = field_value(field, g.sample, g.energy_mj)
            if value is None:
                continue
            s = g.sample
            labels = (
                str(s.index),
                s.uuid,
                f"00000000:{0x18 + 0x10 * s.index:02X}:00.0",
                f"nvidia{s.index}",
                s.model,
                hostname,
                driver,
            )
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in zip(LABELS, labels, strict=True))
            rows.append(f"{field.name}{{{text}}} {_number(value)}")
        if rows:
            lines += [f"# HELP {field.name} {field.help}", f"# TYPE {field.name} {field.type}"]
            lines += rows
    return "\n".join(lines) + "\n" if lines else ""


class DcgmExposition:
    """The exposition of the GPUs ``samples()`` returns (each GPU's latest sample), with the
    energy counter integrated from the power draw between successive samples of a GPU."""

    def __init__(
        self,
        samples: Callable[[], Iterable[DeviceSample]],
        *,
        hostname: str,
        fields: Sequence[DcgmField] = FIELDS,
    ) -> None:
        self._samples = samples
        self.hostname = hostname
        self.fields = tuple(fields)
        self._energy: dict[str, tuple[float, float]] = {}  # uuid -> (sample time, mJ so far)
        self._lock = threading.Lock()

    def text(self) -> str:
        gpus = []
        with self._lock:
            for s in self._samples():
                at, mj = self._energy.get(s.uuid, (s.time, 0.0))
                if s.power_w is not None and s.time > at:
                    mj += s.power_w * (s.time - at) * 1000.0
                self._energy[s.uuid] = (max(at, s.time), mj)
                gpus.append(Gpu(s, mj))
        return exposition(gpus, hostname=self.hostname, fields=self.fields)


class DcgmServer:
    """``GET /metrics`` of a :class:`DcgmExposition` on ``host:port`` (0: any free port), as
    dcgm-exporter serves it; binds at construction (a taken port raises :class:`OSError`)."""

    def __init__(self, exposition: DcgmExposition, *, host: str = "127.0.0.1", port: int = 0):
        source = exposition

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = source.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="auditor-dcgm", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
