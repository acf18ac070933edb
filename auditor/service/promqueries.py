"""What ``auditor serve`` asks Prometheus: one instant query per figure of an evaluation
(window aggregates, one value per series), by the name its answer is filed under.
:mod:`.promsnapshot` decodes the answers into snapshots."""

from __future__ import annotations

from auditor.metrics import catalog as C
from auditor.samples import PHASES


def queries(window_s: float) -> dict[str, str]:
    """Every query of one evaluation, by the name its answer is filed under."""
    w = f"{max(2, round(window_s))}s"
    half = f"{max(1, round(window_s / 2))}s"
    # Figures are aggregated ``by`` the labels :mod:`.promsnapshot` reads: smaller answers,
    # fewer labels to decode per series (a 4,096-rank job answers in about 200,000 series
    # otherwise).
    r = f"{C.JOB_LABEL}, rank"
    g = "uuid"
    q = {
        # ranks: identity (all labels) ...
        "rank_info": f"last_over_time({C.RANK_INFO.name}[{w}])",
        "loader_info": f"last_over_time({C.RANK_DATALOADER_INFO.name}[{w}])",
        # ... and figures
        "config_workers": f"max by ({r}) "
        f"(last_over_time({C.RANK_DATALOADER_CONFIG_WORKERS.name}[{w}]))",
        "rank_up": f"max by ({r}) (last_over_time({C.RANK_UP.name}[{w}]))",
        # The scrape time of each rank's latest sample (the instant selector keeps it).
        "rank_seen": f"max by ({r}) (timestamp({C.RANK_UP.name}))",
        "steps": f"sum by ({r}) (increase({C.RANK_STEPS_TOTAL.name}[{w}]))",
        "step_seconds": f"sum by ({r}) (increase({C.RANK_STEP_SECONDS_TOTAL.name}[{w}]))",
        "samples": f"sum by ({r}) (increase({C.RANK_SAMPLES_TOTAL.name}[{w}]))",
        # DataLoader batches per step: gradient accumulation's micro-batches (absent from an
        # older endpoint: one per step).
        "micro_batches": f"sum by ({r}) (increase({C.RANK_MICRO_BATCHES_TOTAL.name}[{w}]))",
        "workers": f"max by ({r}) (max_over_time({C.RANK_DATALOADER_WORKERS.name}[{w}]))",
    }
    # A figure split by a label (a phase, a memory kind, a process) is one query per value,
    # each labelled by rank alone: its answer lines up with the others' (one comparison of
    # label lists finds every rank's row), where one answer split by the label cost a key
    # lookup per series (some 45,000 at 4,096 ranks).
    for phase in PHASES:
        q[sub_key("phase_seconds", phase)] = (
            f'sum by ({r}) (increase({C.RANK_PHASE_SECONDS_TOTAL.name}{{phase="{phase}"}}[{w}]))'
        )
    # The kinds the rules read (reserved memory is the dashboards', not the rules').
    for kind in MEMORY_KINDS:
        q[sub_key("memory", kind)] = (
            f"max by ({r}) (quantile_over_time(0.5, "
            f'{C.RANK_MEMORY_BYTES.name}{{memory="{kind}"}}[{w}]))'
        )
    for process in C.CPU_PROCESSES:
        q[sub_key("cpu", process)] = (
            f'max by ({r}) (avg_over_time({C.RANK_CPU_CORES.name}{{process="{process}"}}[{w}]))'
        )
    q |= {
        # nodes
        "node_cores": f"max by (auditor_job, node) (max_over_time({C.NODE_CPU_CORES.name}[{w}]))",
        "node_busy": "max by (auditor_job, node) "
        f"(quantile_over_time(0.5, {C.NODE_CPU_BUSY_CORES.name}[{w}]))",
        "node_load": f"max by (auditor_job, node) (avg_over_time({C.NODE_LOAD1.name}[{w}]))",
        "node_samples": "max by (auditor_job, node) "
        f"(count_over_time({C.NODE_CPU_BUSY_CORES.name}[{w}]))",
        # GPUs: identity (all labels) ...
        "gpu_up": f"last_over_time({C.GPU_UP.name}[{w}])",
        # ... and figures
        "gpu_samples": f"max by ({g}) (sum_over_time({C.GPU_UP.name}[{w}]))",
        # Seconds between the first and the last GPU read in the window (one query, not two).
        "gpu_span": f"max by ({g}) "
        f"(max_over_time({C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name}[{w}])) - min by ({g}) "
        f"(min_over_time({C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name}[{w}]))",
        "gpu_lost": f"max by ({g}) (max_over_time({C.GPU_LOST.name}[{w}]))",
        "gpu_mem_trend": f"max by ({g}) (deriv({C.GPU_MEMORY_USED_BYTES.name}[{w}]))",
        "gpu_mem_recent": f"max by ({g}) (deriv({C.GPU_MEMORY_USED_BYTES.name}[{half}]))",
        # Only reasons that were active at all (usually none), and whether reasons are read.
        "gpu_throttle": f"max by ({g}, reason) "
        f"(avg_over_time({C.GPU_THROTTLE_ACTIVE.name}[{w}])) > 0",
        "gpu_throttle_read": f"count by ({g}) (last_over_time({C.GPU_THROTTLE_ACTIVE.name}[{w}]))",
    }
    for key, spec in GPU_MEDIANS.items():
        q[key] = f"max by ({g}) (quantile_over_time(0.5, {spec.name}[{w}]))"
    for key, spec in GPU_MAXIMA.items():
        q[key] = f"max by ({g}) (max_over_time({spec.name}[{w}]))"
    return q


def sub_key(figure: str, value: str) -> str:
    """The answer key of ``figure`` for one value of the label it is split by:
    ``sub_key("phase_seconds", "forward")`` is ``"phase_seconds:forward"``."""
    return f"{figure}:{value}"


GPU_MEDIANS = {
    "gpu_util": C.GPU_UTILIZATION_RATIO,
    "gpu_mem_used": C.GPU_MEMORY_USED_BYTES,
    "gpu_sm_clock": C.GPU_SM_CLOCK_HERTZ,
    "gpu_sm_clock_max": C.GPU_SM_CLOCK_MAX_HERTZ,
    "gpu_temperature": C.GPU_TEMPERATURE_CELSIUS,
    "gpu_power": C.GPU_POWER_WATTS,
    "gpu_power_limit": C.GPU_POWER_LIMIT_WATTS,
}
GPU_MAXIMA = {
    "gpu_mem_used_max": C.GPU_MEMORY_USED_BYTES,
    "gpu_mem_total": C.GPU_MEMORY_TOTAL_BYTES,
    "gpu_pcie_gen": C.GPU_PCIE_LINK_GENERATION,
    "gpu_pcie_gen_max": C.GPU_PCIE_LINK_GENERATION_MAX,
    "gpu_pcie_width": C.GPU_PCIE_LINK_WIDTH,
    "gpu_pcie_width_max": C.GPU_PCIE_LINK_WIDTH_MAX,
}
# Rank memory kinds the rules read (RankStats: rss, allocated, peak).
MEMORY_KINDS = ("rss", "allocated", "peak")

GPU_FIGURES = (
    "gpu_samples",
    "gpu_span",
    "gpu_lost",
    "gpu_mem_trend",
    "gpu_mem_recent",
    *GPU_MEDIANS,
    *GPU_MAXIMA,
)
