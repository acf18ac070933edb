"""The one metric catalog: every metric the auditor exports, read by the exporter, the dashboards
and the alert rules, so a name, a unit or a label set is defined exactly once.

Conventions (DESIGN.md): prefix ``auditor_``; base units in the name (``_seconds``, ``_bytes``,
``_ratio`` in 0..1, ``_cores`` for CPU); counters end in ``_total`` here (the exporter strips it
for prometheus_client, which appends it again). Every rank and node metric carries
``auditor_job`` (the training job) and ``node``; rank metrics also ``rank`` and ``local_rank``. GPU
metrics carry ``node``, ``gpu`` (the NVML index), ``uuid`` and ``model``, plus ``auditor_job`` and
``rank`` of the rank that owns the GPU (both empty when no rank of a known job uses it). The
training job is never ``job``: Prometheus sets that to the scrape job, and a default scrape config
(honor_labels false) would move ours to ``exported_job``. A value that was not measured is
exported as no series at all, never as zero.
"""

from __future__ import annotations

from auditor.metrics.labels import (
    COMMON_LABELS as COMMON_LABELS,
)
from auditor.metrics.labels import (
    CPU_PROCESSES as CPU_PROCESSES,
)
from auditor.metrics.labels import (
    FIX_INFO_LABELS as FIX_INFO_LABELS,
)
from auditor.metrics.labels import (
    GPU as GPU,
)
from auditor.metrics.labels import (
    GPU_INFO_LABELS as GPU_INFO_LABELS,
)
from auditor.metrics.labels import (
    GPU_SERIES_BUDGET as GPU_SERIES_BUDGET,
)
from auditor.metrics.labels import (
    INFO_LABELS as INFO_LABELS,
)
from auditor.metrics.labels import (
    JOB_LABEL as JOB_LABEL,
)
from auditor.metrics.labels import (
    LABEL_VALUES as LABEL_VALUES,
)
from auditor.metrics.labels import (
    LABELS as LABELS,
)
from auditor.metrics.labels import (
    LOADER_INFO_LABELS as LOADER_INFO_LABELS,
)
from auditor.metrics.labels import (
    MEMORY_KINDS as MEMORY_KINDS,
)
from auditor.metrics.labels import (
    MEMORY_PARTS as MEMORY_PARTS,
)
from auditor.metrics.labels import (
    NODE as NODE,
)
from auditor.metrics.labels import (
    PREFIX as PREFIX,
)
from auditor.metrics.labels import (
    RANK as RANK,
)
from auditor.metrics.labels import (
    RANK_SERIES_BUDGET as RANK_SERIES_BUDGET,
)
from auditor.metrics.labels import (
    THROTTLE_REASONS as THROTTLE_REASONS,
)
from auditor.metrics.labels import (
    UNIT_SUFFIX as UNIT_SUFFIX,
)
from auditor.metrics.labels import (
    MetricSpec as MetricSpec,
)
from auditor.metrics.labels import (
    MetricType as MetricType,
)

# --- per rank: identity and liveness --------------------------------------------------------------
RANK_INFO = MetricSpec(
    name="auditor_rank_info",
    type="gauge",
    unit="",
    help="Always 1; the rank's device, parallel mode and world size as labels.",
    labels=(*RANK, "device", "parallel_mode", "world_size"),
)
RANK_UP = MetricSpec(
    name="auditor_rank_up",
    type="gauge",
    unit="",
    help="1 while the rank's connection to the node agent is open, 0 after it ended.",
    labels=RANK,
)

# --- per rank: step counters (rate() them) --------------------------------------------------------
RANK_STEPS_TOTAL = MetricSpec(
    name="auditor_rank_steps_total",
    type="counter",
    unit="",
    help="Training steps (optimizer steps) the rank completed.",
    labels=RANK,
)
RANK_STEP_SECONDS_TOTAL = MetricSpec(
    name="auditor_rank_step_seconds_total",
    type="counter",
    unit="seconds",
    help="Sum of step durations; divide its rate by the steps rate for the mean step time.",
    labels=RANK,
)
RANK_PHASE_SECONDS_TOTAL = MetricSpec(
    name="auditor_rank_phase_seconds_total",
    type="counter",
    unit="seconds",
    help="Sum of time per step phase; phases are exclusive (backward excludes collective_wait). "
    "A phase that was never measured has no series.",
    labels=(*RANK, "phase"),
)
RANK_SAMPLES_TOTAL = MetricSpec(
    name="auditor_rank_samples_total",
    type="counter",
    unit="",
    help="Training samples the rank consumed (sum of known batch sizes).",
    labels=RANK,
)
RANK_MICRO_BATCHES_TOTAL = MetricSpec(
    name="auditor_rank_micro_batches_total",
    type="counter",
    unit="",
    help="DataLoader batches the rank's steps trained on: its steps times the micro-batches "
    "each accumulated (the same as the steps without gradient accumulation).",
    labels=RANK,
)

# --- per rank: the latest step --------------------------------------------------------------------
RANK_LAST_STEP_SECONDS = MetricSpec(
    name="auditor_rank_last_step_seconds",
    type="gauge",
    unit="seconds",
    help="Duration of the rank's latest step.",
    labels=RANK,
)
RANK_LAST_STEP_TIMESTAMP_SECONDS = MetricSpec(
    name="auditor_rank_last_step_timestamp_seconds",
    type="gauge",
    unit="seconds",
    help="Wall-clock time (seconds since the epoch) of the rank's latest step.",
    labels=RANK,
)
RANK_BATCH_SIZE = MetricSpec(
    name="auditor_rank_batch_size",
    type="gauge",
    unit="samples",
    help="Batch size of the rank's latest step.",
    labels=RANK,
)
RANK_MEMORY_BYTES = MetricSpec(
    name="auditor_rank_memory_bytes",
    type="gauge",
    unit="bytes",
    help="Rank memory: host rss, device allocated, reserved and peak allocated. "
    "No series where it was not measured (e.g. device memory on a CPU rank).",
    labels=(*RANK, "memory"),
)
RANK_MEMORY_BUDGET_BYTES = MetricSpec(
    name="auditor_rank_memory_budget_bytes",
    type="gauge",
    unit="bytes",
    help="The rank's measured memory budget by part: parameters, gradients, optimizer_state, "
    "buffers, other_modules (modules outside the model) and activations (one sampled step's "
    "saved tensors). No series where the probe sent no budget.",
    labels=(*RANK, "part"),
)

# --- per rank: model FLOPs (counted on a sampled step, auditor.analysis.mfu) ----------------------
RANK_FLOPS_PER_STEP = MetricSpec(
    name="auditor_rank_flops_per_step",
    type="gauge",
    unit="",
    help="Model FLOPs of one optimizer step of the rank (forward and backward of every "
    "micro-batch), counted from the operations that ran on a sampled step. No series before a "
    "step was counted.",
    labels=RANK,
)
RANK_FLOPS_PER_SECOND = MetricSpec(
    name="auditor_rank_flops_per_second",
    type="gauge",
    unit="",
    help="Model FLOPs the live rank achieves per second: its FLOPs per step over its step time "
    "(the latest verdict's window). No series before a step was counted.",
    labels=RANK,
)
RANK_MFU_RATIO = MetricSpec(
    name="auditor_rank_mfu_ratio",
    type="gauge",
    unit="ratio",
    help="Model FLOPs utilisation of the live rank, 0..1: achieved FLOP/s over its device's dense "
    "peak for the dtypes its FLOPs ran in. No series on a CPU, on a device the peak table does "
    "not know, or before a step was counted.",
    labels=RANK,
)

# --- per rank: CPU and DataLoader -----------------------------------------------------------------
RANK_CPU_CORES = MetricSpec(
    name="auditor_rank_cpu_cores",
    type="gauge",
    unit="cores",
    help="CPU used by the rank's main process (process=main) and by all its DataLoader workers "
    "together (process=workers); 1.0 = one core fully busy.",
    labels=(*RANK, "process"),
)
RANK_DATALOADER_WORKERS = MetricSpec(
    name="auditor_rank_dataloader_workers",
    type="gauge",
    unit="",
    help="DataLoader worker processes of the rank that are alive now.",
    labels=RANK,
)
RANK_DATALOADER_CONFIG_WORKERS = MetricSpec(
    name="auditor_rank_dataloader_config_workers",
    type="gauge",
    unit="",
    help="num_workers the rank's DataLoader is configured with.",
    labels=RANK,
)

RANK_DATALOADER_INFO = MetricSpec(
    name="auditor_rank_dataloader_info",
    type="gauge",
    unit="",
    help="Always 1; the rank's DataLoader settings as labels (pin_memory and persistent_workers "
    "are true/false, prefetch_factor and batch_size empty where unset).",
    labels=(*RANK, *LOADER_INFO_LABELS),
)

# --- per node -------------------------------------------------------------------------------------
NODE_CPU_CORES = MetricSpec(
    name="auditor_node_cpu_cores",
    type="gauge",
    unit="cores",
    help="CPU cores available on the node.",
    labels=NODE,
)
NODE_CPU_BUSY_CORES = MetricSpec(
    name="auditor_node_cpu_busy_cores",
    type="gauge",
    unit="cores",
    help="CPU cores busy on the node (all processes).",
    labels=NODE,
)
NODE_LOAD1 = MetricSpec(
    name="auditor_node_load1",
    type="gauge",
    unit="",
    help="One-minute load average of the node.",
    labels=NODE,
)

# --- per GPU (NVML through a GpuMonitor actor; one set per physical GPU) -------------------------
# While a GPU's monitor is unreachable (restarting, or its answer timed out) only auditor_gpu_up 0
# and auditor_gpu_last_sample_timestamp_seconds are exported for it: stale values are not shown as
# current, and a missing GPU never reads as an idle one.
GPU_UP = MetricSpec(
    name="auditor_gpu_up",
    type="gauge",
    unit="",
    help="1 while the GPU's monitor answers with samples, 0 while it is unreachable or restarting.",
    labels=GPU,
)
GPU_LAST_SAMPLE_TIMESTAMP_SECONDS = MetricSpec(
    name="auditor_gpu_last_sample_timestamp_seconds",
    type="gauge",
    unit="seconds",
    help="Wall-clock time (seconds since the epoch) of the GPU's latest sample; it stops "
    "advancing while the monitor is down.",
    labels=GPU,
)
GPU_LOST = MetricSpec(
    name="auditor_gpu_lost",
    type="gauge",
    unit="",
    help="1 when NVML reports the GPU lost (fallen off the bus); its other values are then absent.",
    labels=GPU,
)
GPU_UTILIZATION_RATIO = MetricSpec(
    name="auditor_gpu_utilization_ratio",
    type="gauge",
    unit="ratio",
    help="Fraction of the last sample period in which a kernel ran on the GPU (NVML), 0..1.",
    labels=GPU,
)
GPU_MEMORY_UTILIZATION_RATIO = MetricSpec(
    name="auditor_gpu_memory_utilization_ratio",
    type="gauge",
    unit="ratio",
    help="Fraction of the last sample period in which device memory was read or written (NVML "
    "memory controller activity, not capacity), 0..1.",
    labels=GPU,
)
GPU_MEMORY_USED_BYTES = MetricSpec(
    name="auditor_gpu_memory_used_bytes",
    type="gauge",
    unit="bytes",
    help="Device memory in use (all processes).",
    labels=GPU,
)
GPU_MEMORY_TOTAL_BYTES = MetricSpec(
    name="auditor_gpu_memory_total_bytes",
    type="gauge",
    unit="bytes",
    help="Device memory installed.",
    labels=GPU,
)
GPU_SM_CLOCK_HERTZ = MetricSpec(
    name="auditor_gpu_sm_clock_hertz",
    type="gauge",
    unit="hertz",
    help="Current SM clock.",
    labels=GPU,
)
GPU_SM_CLOCK_MAX_HERTZ = MetricSpec(
    name="auditor_gpu_sm_clock_max_hertz",
    type="gauge",
    unit="hertz",
    help="Maximum SM clock of the GPU.",
    labels=GPU,
)
GPU_MEMORY_CLOCK_HERTZ = MetricSpec(
    name="auditor_gpu_memory_clock_hertz",
    type="gauge",
    unit="hertz",
    help="Current memory clock.",
    labels=GPU,
)
GPU_MEMORY_CLOCK_MAX_HERTZ = MetricSpec(
    name="auditor_gpu_memory_clock_max_hertz",
    type="gauge",
    unit="hertz",
    help="Maximum memory clock of the GPU.",
    labels=GPU,
)
GPU_THROTTLE_ACTIVE = MetricSpec(
    name="auditor_gpu_throttle_active",
    type="gauge",
    unit="",
    help="1 while the clock-event (throttle) reason is active, 0 while it is not; no series where "
    "the driver does not report reasons. reason=other: a reason outside the fixed list.",
    labels=(*GPU, "reason"),
)
GPU_POWER_WATTS = MetricSpec(
    name="auditor_gpu_power_watts",
    type="gauge",
    unit="watts",
    help="Power draw of the GPU.",
    labels=GPU,
)
GPU_POWER_LIMIT_WATTS = MetricSpec(
    name="auditor_gpu_power_limit_watts",
    type="gauge",
    unit="watts",
    help="Power limit the GPU enforces.",
    labels=GPU,
)
GPU_TEMPERATURE_CELSIUS = MetricSpec(
    name="auditor_gpu_temperature_celsius",
    type="gauge",
    unit="celsius",
    help="GPU core temperature.",
    labels=GPU,
)
GPU_PCIE_LINK_GENERATION = MetricSpec(
    name="auditor_gpu_pcie_link_generation",
    type="gauge",
    unit="",
    help="Current PCIe link generation (it drops at idle on some GPUs).",
    labels=GPU,
)
GPU_PCIE_LINK_GENERATION_MAX = MetricSpec(
    name="auditor_gpu_pcie_link_generation_max",
    type="gauge",
    unit="",
    help="Maximum PCIe link generation of the GPU and its slot.",
    labels=GPU,
)
GPU_PCIE_LINK_WIDTH = MetricSpec(
    name="auditor_gpu_pcie_link_width",
    type="gauge",
    unit="",
    help="Current PCIe link width (lanes).",
    labels=GPU,
)
GPU_PCIE_LINK_WIDTH_MAX = MetricSpec(
    name="auditor_gpu_pcie_link_width_max",
    type="gauge",
    unit="",
    help="Maximum PCIe link width (lanes) of the GPU and its slot.",
    labels=GPU,
)
GPU_PROCESSES = MetricSpec(
    name="auditor_gpu_processes",
    type="gauge",
    unit="",
    help="Processes holding memory on the GPU.",
    labels=GPU,
)
# dcgm-exporter's profiling (DCP) fields, recorded under the auditor's GPU labels by the rules of
# ``auditor.ops.recording`` (DCGM_RULES) where dcgm-exporter exports them. The auditor's NVML
# monitors do not measure them: no node endpoint exports these, and they are outside the GPU
# series budget (:func:`gpu_specs`).
GPU_SM_ACTIVE_RATIO = MetricSpec(
    name="auditor_gpu_sm_active_ratio",
    type="gauge",
    unit="ratio",
    help="Share of cycles an SM had at least one warp assigned, averaged over the SMs, 0..1 "
    "(dcgm-exporter's DCGM_FI_PROF_SM_ACTIVE, recorded by the auditor's rules).",
    labels=GPU,
)
GPU_TENSOR_PIPE_ACTIVE_RATIO = MetricSpec(
    name="auditor_gpu_tensor_pipe_active_ratio",
    type="gauge",
    unit="ratio",
    help="Share of cycles the tensor (HMMA) pipe was active, 0..1 (dcgm-exporter's "
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, recorded by the auditor's rules).",
    labels=GPU,
)
DCGM_ONLY: tuple[MetricSpec, ...] = (GPU_SM_ACTIVE_RATIO, GPU_TENSOR_PIPE_ACTIVE_RATIO)

# From the rank's own word (the CUDA UUIDs its probe read), not from a GPU monitor: exported
# with or without the auditor's monitors, so another GPU source (dcgm-exporter, whose series carry
# ``UUID`` and ``Hostname``) can be joined to the job's ranks by UUID.
GPU_OWNER_INFO = MetricSpec(
    name="auditor_gpu_owner_info",
    type="gauge",
    unit="",
    help="Always 1 while a live rank uses the GPU: the rank's job, rank and node, the GPU's uuid "
    "and index as the rank reported them (model where a monitor knows it).",
    labels=(*GPU, "local_rank"),
)

# --- findings (one series per blamed rank; rank="" for a job-wide finding) ------------------------
FINDING = MetricSpec(
    name="auditor_finding",
    type="gauge",
    unit="",
    help="Always 1 while the analysis holds this finding against the rank.",
    labels=(JOB_LABEL, "kind", "rank", "node", "severity"),
)
FINDING_PREDICTED_SPEEDUP = MetricSpec(
    name="auditor_finding_predicted_speedup",
    type="gauge",
    unit="",
    help="Expected job step-rate gain (x, 1.0 = none) if every fix of the finding is applied; "
    "repeated on each blamed rank, aggregate with max().",
    labels=(JOB_LABEL, "kind", "rank"),
)
FINDING_FIX_INFO = MetricSpec(
    name="auditor_finding_fix_info",
    type="gauge",
    unit="",
    help="Always 1; one fix of a finding for one rank (rank empty: a GPU no rank owns): the "
    "lever, its current and proposed value (empty where not a value) and the rank's change in "
    "words (fix). One series per finding kind, rank and lever.",
    labels=(JOB_LABEL, "kind", "rank", "node", "lever", *FIX_INFO_LABELS),
)

FINDING_MEMORY_FULL_SECONDS = MetricSpec(
    name="auditor_finding_memory_full_seconds",
    type="gauge",
    unit="seconds",
    help="Projected seconds until the rank's GPU (or host) memory is full at the rate it climbs "
    "(kind memory_growth); no series where its memory does not climb or the time is unknown.",
    labels=(JOB_LABEL, "kind", "rank", "node"),
)

# --- per job, from ``auditor serve`` -----------------------------------------------------------
JOB_IMBALANCE_RATIO = MetricSpec(
    name="auditor_job_imbalance_ratio",
    type="gauge",
    unit="ratio",
    help="1 - fastest/slowest local step time across the job's ranks over the analysis window "
    "(time the least-loaded rank waits at each step, as a share); 0 = balanced.",
    labels=(JOB_LABEL,),
)
JOB_MFU_RATIO = MetricSpec(
    name="auditor_job_mfu_ratio",
    type="gauge",
    unit="ratio",
    help="Model FLOPs utilisation of the whole job, 0..1: the time its counted FLOPs would take "
    "at its devices' dense peaks over its step time. No series where it is not known (a CPU "
    "job, a device the peak table does not know, no step counted yet).",
    labels=(JOB_LABEL,),
)
JOB_RANKS = MetricSpec(
    name="auditor_job_ranks",
    type="gauge",
    unit="",
    help="Ranks of the job that the latest evaluation judged.",
    labels=(JOB_LABEL,),
)
JOB_PREDICTED_SPEEDUP = MetricSpec(
    name="auditor_job_predicted_speedup",
    type="gauge",
    unit="",
    help="Largest predicted speed-up (x) among the job's current findings; 1.0 = nothing to gain.",
    labels=(JOB_LABEL,),
)

# --- the analysis service's own health (``auditor serve``) --------------------------------------
SERVE_PROMETHEUS_UP = MetricSpec(
    name="auditor_serve_prometheus_up",
    type="gauge",
    unit="",
    help="1 if the latest evaluation reached Prometheus and got answers, 0 while it cannot.",
    labels=(),
)
SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS = MetricSpec(
    name="auditor_serve_last_evaluation_timestamp_seconds",
    type="gauge",
    unit="seconds",
    help="Wall-clock time (seconds since the epoch) of the latest successful evaluation.",
    labels=(),
)
SERVE_EVALUATION_SECONDS = MetricSpec(
    name="auditor_serve_evaluation_seconds",
    type="gauge",
    unit="seconds",
    help="Duration of the latest successful evaluation, queries included.",
    labels=(),
)
SERVE_ANALYSIS_SECONDS = MetricSpec(
    name="auditor_serve_analysis_seconds",
    type="gauge",
    unit="seconds",
    help="Part of the latest evaluation spent building snapshots and running the rules.",
    labels=(),
)
SERVE_EVALUATIONS_TOTAL = MetricSpec(
    name="auditor_serve_evaluations_total",
    type="counter",
    unit="",
    help="Evaluations that completed.",
    labels=(),
)
SERVE_FAILURES_TOTAL = MetricSpec(
    name="auditor_serve_failures_total",
    type="counter",
    unit="",
    help="Evaluations that failed (Prometheus unreachable, slow or answering errors).",
    labels=(),
)
SERVE_JOBS = MetricSpec(
    name="auditor_serve_jobs",
    type="gauge",
    unit="",
    help="Running jobs the latest evaluation found.",
    labels=(),
)

CATALOG: tuple[MetricSpec, ...] = (
    RANK_INFO,
    RANK_UP,
    RANK_STEPS_TOTAL,
    RANK_STEP_SECONDS_TOTAL,
    RANK_PHASE_SECONDS_TOTAL,
    RANK_SAMPLES_TOTAL,
    RANK_MICRO_BATCHES_TOTAL,
    RANK_LAST_STEP_SECONDS,
    RANK_LAST_STEP_TIMESTAMP_SECONDS,
    RANK_BATCH_SIZE,
    RANK_MEMORY_BYTES,
    RANK_MEMORY_BUDGET_BYTES,
    RANK_FLOPS_PER_STEP,
    RANK_FLOPS_PER_SECOND,
    RANK_MFU_RATIO,
    RANK_CPU_CORES,
    RANK_DATALOADER_WORKERS,
    RANK_DATALOADER_CONFIG_WORKERS,
    RANK_DATALOADER_INFO,
    NODE_CPU_CORES,
    NODE_CPU_BUSY_CORES,
    NODE_LOAD1,
    GPU_UP,
    GPU_LAST_SAMPLE_TIMESTAMP_SECONDS,
    GPU_LOST,
    GPU_UTILIZATION_RATIO,
    GPU_MEMORY_UTILIZATION_RATIO,
    GPU_MEMORY_USED_BYTES,
    GPU_MEMORY_TOTAL_BYTES,
    GPU_SM_CLOCK_HERTZ,
    GPU_SM_CLOCK_MAX_HERTZ,
    GPU_MEMORY_CLOCK_HERTZ,
    GPU_MEMORY_CLOCK_MAX_HERTZ,
    GPU_THROTTLE_ACTIVE,
    GPU_POWER_WATTS,
    GPU_POWER_LIMIT_WATTS,
    GPU_TEMPERATURE_CELSIUS,
    GPU_PCIE_LINK_GENERATION,
    GPU_PCIE_LINK_GENERATION_MAX,
    GPU_PCIE_LINK_WIDTH,
    GPU_PCIE_LINK_WIDTH_MAX,
    GPU_PROCESSES,
    GPU_SM_ACTIVE_RATIO,
    GPU_TENSOR_PIPE_ACTIVE_RATIO,
    GPU_OWNER_INFO,
    FINDING,
    FINDING_PREDICTED_SPEEDUP,
    FINDING_FIX_INFO,
    FINDING_MEMORY_FULL_SECONDS,
    JOB_IMBALANCE_RATIO,
    JOB_MFU_RATIO,
    JOB_RANKS,
    JOB_PREDICTED_SPEEDUP,
    SERVE_PROMETHEUS_UP,
    SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS,
    SERVE_EVALUATION_SECONDS,
    SERVE_ANALYSIS_SECONDS,
    SERVE_EVALUATIONS_TOTAL,
    SERVE_FAILURES_TOTAL,
    SERVE_JOBS,
)

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in CATALOG}


def spec(name: str) -> MetricSpec:
    """The catalog entry for ``name``; a KeyError names the missing metric."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"metric {name!r} is not in the catalog") from None


def rank_specs() -> tuple[MetricSpec, ...]:
    """The per-rank metrics: the ones counted against :data:`RANK_SERIES_BUDGET`."""
    return tuple(s for s in CATALOG if s.name.startswith(PREFIX + "rank_"))


def gpu_specs() -> tuple[MetricSpec, ...]:
    """The per-GPU metrics a GPU's monitor exports: the ones counted against
    :data:`GPU_SERIES_BUDGET` (``auditor_gpu_owner_info`` is the ranks' word, one series per
    rank that uses the GPU, exported whether or not a monitor runs; :data:`DCGM_ONLY` are
    recorded from dcgm-exporter, never exported by a monitor)."""
    return tuple(
        s
        for s in CATALOG
        if s.name.startswith(PREFIX + "gpu_") and s is not GPU_OWNER_INFO and s not in DCGM_ONLY
    )


def max_series(metric: MetricSpec) -> int:
    """Most series ``metric`` yields for one rank/node/GPU: the product of its bounded labels."""
    n = 1
    for label in metric.labels:
        if label in LABEL_VALUES:
            n *= len(LABEL_VALUES[label])
    return n


def series_per_rank() -> int:
    """Upper bound of the ``auditor_rank_*`` series one rank produces."""
    return sum(max_series(s) for s in rank_specs())


def series_per_gpu() -> int:
    """Upper bound of the ``auditor_gpu_*`` series one GPU produces (for one owner)."""
    return sum(max_series(s) for s in gpu_specs())
