"""The catalog's vocabulary: the prefix, the label names and the bounded label values, the units
and the name suffix each requires, the series budgets, and :class:`MetricSpec`, the shape of one
metric. :mod:`auditor.metrics.catalog` declares every metric with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from auditor.analysis.findings import SEVERITIES
from auditor.analysis.fixes import LEVERS
from auditor.analysis.rules import KINDS
from auditor.samples import PHASES

MetricType = Literal["gauge", "counter", "info"]

PREFIX = "auditor_"

# Values of the bounded, metric-specific labels. They bound the series count per rank and give
# dashboards and alert rules a fixed list to iterate over.
MEMORY_KINDS = ("rss", "allocated", "reserved", "peak")
CPU_PROCESSES = ("main", "workers")
# Parts of a rank's measured memory budget (``auditor.probe.memory``): the fixed part's terms,
# modules outside the model (an EMA or eval copy) and one sampled step's activations.
MEMORY_PARTS = (
    "parameters",
    "gradients",
    "optimizer_state",
    "buffers",
    "other_modules",
    "activations",
)
# NVML clock-event (throttle) reasons as ``auditor.telemetry.nvml`` decodes them, plus "other" for
# a name outside this list (a newer driver, a recording): the series count per GPU stays bounded.
THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
    "board_limit",
    "reliability",
    "other",
)

LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "lever": tuple(LEVERS),
    "phase": PHASES,
    "memory": MEMORY_KINDS,
    "part": MEMORY_PARTS,
    "process": CPU_PROCESSES,
    "kind": KINDS,
    "severity": SEVERITIES,
    "reason": THROTTLE_REASONS,
}

# The training job's label. Not ``job``: Prometheus sets that to the scrape job, and a default
# scrape config (honor_labels false) would rename ours to ``exported_job``.
JOB_LABEL = "auditor_job"

# The shared vocabulary (DESIGN.md) plus the specific labels above, the descriptive labels of
# ``auditor_rank_info`` and the GPU's model name. A label outside this set is a catalog bug.
COMMON_LABELS = (JOB_LABEL, "node", "rank", "local_rank", "gpu", "uuid")
INFO_LABELS = ("device", "parallel_mode", "world_size")
# Descriptive labels of ``auditor_rank_dataloader_info``: one series per rank, the settings the
# rank's DataLoader was built with (what ``auditor serve`` needs to write a fix).
LOADER_INFO_LABELS = ("pin_memory", "persistent_workers", "prefetch_factor", "batch_size")
GPU_INFO_LABELS = ("model",)
# Descriptive labels of ``auditor_finding_fix_info``: a fix's values and its words (short).
FIX_INFO_LABELS = ("current", "proposed", "fix")
LABELS: frozenset[str] = frozenset(
    COMMON_LABELS
    + INFO_LABELS
    + LOADER_INFO_LABELS
    + GPU_INFO_LABELS
    + FIX_INFO_LABELS
    + tuple(LABEL_VALUES)
)

# Units a metric may declare, and the name suffix each one requires ("" = dimensionless count).
UNIT_SUFFIX: dict[str, str] = {
    "seconds": "_seconds",
    "bytes": "_bytes",
    "ratio": "_ratio",
    "cores": "_cores",
    "hertz": "_hertz",
    "watts": "_watts",
    "celsius": "_celsius",
    "samples": "",
    "": "",
}

# The most series the ``auditor_rank_*`` metrics may produce for one rank: keeps a 1000-rank job
# at a size Prometheus takes without thought (36 000 series).
RANK_SERIES_BUDGET = 36
# The most series the ``auditor_gpu_*`` metrics may produce for one GPU.
GPU_SERIES_BUDGET = 40

RANK = (JOB_LABEL, "node", "rank", "local_rank")
NODE = (JOB_LABEL, "node")
# Identity first (stable for the GPU's life), then the owning rank's job and rank ("" if none).
GPU = ("node", "gpu", "uuid", "model", JOB_LABEL, "rank")


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric: its full name (counters with ``_total``), type, unit, help, labels."""

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...]
