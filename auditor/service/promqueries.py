"""What ``auditor serve`` asks Prometheus: one instant query per figure of an evaluation
(window aggregates, one value per series), by the name its answer is filed under.
:mod:`.promsnapshot` decodes the answers into snapshots."""

from __future__ import annotations

from auditor.metrics import catalog as C
from auditor.metrics import dcgm as D
from auditor.metrics.promql import growth
from auditor.samples import PHASES

GPU_SOURCES = ("auto", "auditor", "dcgm")
"""Where serve reads GPU figures: ``auditor`` (the auditor's monitors, ``auditor_gpu_*``),
``dcgm`` (dcgm-exporter's ``DCGM_FI_*`` series) or ``auto`` (both: a GPU the monitors export is
read from them, any other GPU dcgm-exporter exports from it)."""
DCGM = "dcgm:"
"""The prefix of the answers read from dcgm-exporter's series (:func:`dcgm_queries`)."""


def queries(window_s: float, gpu_source: str = "auto") -> dict[str, str]:
    """Every query of one evaluation, by the name its answer is filed under; ``gpu_source``
    (:data:`GPU_SOURCES`) picks the GPU series read."""
    q = _queries(window_s)
    if gpu_source == "dcgm":
        q = {k: v for k, v in q.items() if not k.startswith("gpu_")}
    if gpu_source != "auditor":
        q |= dcgm_queries(window_s)
    return q


def _growth(metric: str, window: str, by: str, selector: str = "") -> str:
    """A counter's growth over the window (:func:`auditor.metrics.promql.growth`), per rank."""
    return f"sum by ({by}) {growth(metric + selector, window)}"


def _queries(window_s: float) -> dict[str, str]:
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
        "steps": _growth(C.RANK_STEPS_TOTAL.name, w, r),
        "step_seconds": _growth(C.RANK_STEP_SECONDS_TOTAL.name, w, r),
        "samples": _growth(C.RANK_SAMPLES_TOTAL.name, w, r),
        # DataLoader batches per step: gradient accumulation's micro-batches (absent from an
        # older endpoint: one per step).
        "micro_batches": _growth(C.RANK_MICRO_BATCHES_TOTAL.name, w, r),
        "workers": f"max by ({r}) (max_over_time({C.RANK_DATALOADER_WORKERS.name}[{w}]))",
    }
    # A figure split by a label (a phase, a memory kind, a process) is one query per value,
    # each labelled by rank alone: its answer lines up with the others' (one comparison of
    # label lists finds every rank's row), where one answer split by the label cost a key
    # lookup per series (some 45,000 at 4,096 ranks).
    for phase in PHASES:
        q[sub_key("phase_seconds", phase)] = _growth(
            C.RANK_PHASE_SECONDS_TOTAL.name, w, r, f'{{phase="{phase}"}}'
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


def dcgm_queries(window_s: float) -> dict[str, str]:
    """The GPU figures of :func:`queries` read from dcgm-exporter's series (keys prefixed
    :data:`DCGM`), in the auditor's units and keyed by ``uuid`` as the auditor's are, plus the
    ranks' word on which GPU each uses (``gpu_owner``) to join them to the ranks, and the
    highest SM clock per model (the clock's maximum where DCGM_FI_DEV_MAX_SM_CLOCK is not
    exported). The identity (``gpu_up``) comes first: where it is empty, the rest is not asked."""
    w = f"{max(2, round(window_s))}s"
    half = f"{max(1, round(window_s / 2))}s"
    # Subqueries (a figure of an expression over the window) step once a second, up to 60 steps.
    res = f"{max(1, round(window_s / 60))}s"
    util, xid = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_XID_ERRORS"
    used, free = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
    reasons = '{__name__=~"' + "|".join(D.THROTTLE_FIELDS) + '"}'

    def by_uuid(expr: str, scale: float = 1.0) -> str:
        out = f"max by (uuid) ({D.with_uuid(expr)})"
        return out if scale == 1.0 else f"{out} * {scale!r}"

    ident = "uuid, node, gpu, model"
    q = {
        # Every GPU dcgm-exporter answers for (XID errors: also a GPU that fell off the bus).
        "gpu_up": f"max by ({ident}) ({D.with_auditor_labels(f'last_over_time({xid}[{w}])')})"
        f" or max by ({ident}) ({D.with_auditor_labels(f'last_over_time({util}[{w}])')})",
        "gpu_owner": f"max by (uuid, {C.JOB_LABEL}, rank, node) "
        f"(last_over_time({C.GPU_OWNER_INFO.name}[{w}]))",
        "gpu_samples": f"{by_uuid(f'count_over_time({xid}[{w}])')}"
        f" or {by_uuid(f'count_over_time({util}[{w}])')}",
        "gpu_span": f"{by_uuid(f'max_over_time(timestamp({util})[{w}:{res}])')}"
        f" - {by_uuid(f'min_over_time(timestamp({util})[{w}:{res}])')}",
        "gpu_lost": by_uuid(f"last_over_time({xid}[{w}]) == bool {D.XID_FALLEN_OFF_BUS}"),
        "gpu_mem_trend": by_uuid(f"deriv({used}[{w}])", D.MIB),
        "gpu_mem_recent": by_uuid(f"deriv({used}[{half}])", D.MIB),
        "gpu_mem_total": by_uuid(
            f"last_over_time({used}[{w}]) + last_over_time({free}[{w}])", D.MIB
        ),
        "gpu_throttle": "("
        + " or ".join(
            f"label_replace({by_uuid(f'avg_over_time((floor({reasons} / {bit}) % 2)[{w}:{res}])')}"
            f', "reason", "{reason}", "", "")'
            for reason, bit in D.REASON_BITS.items()
        )
        + ") > 0",
        "gpu_throttle_read": f"count by (uuid) ({D.with_uuid(f'last_over_time({reasons}[{w}])')})",
        "gpu_sm_clock_peak": f"max by ({D.MODEL_LABEL}) "
        f"(max_over_time(DCGM_FI_DEV_SM_CLOCK[{D.CLOCK_PEAK_WINDOW}]))",
    }
    for key, spec in GPU_MEDIANS.items():
        field = D.FOR_AUDITOR[spec.name]
        q[key] = by_uuid(f"quantile_over_time(0.5, {field.name}[{w}])", field.scale)
    for key, spec in GPU_MAXIMA.items():
        if key in q:
            continue
        field = D.FOR_AUDITOR[spec.name]
        q[key] = by_uuid(f"max_over_time({field.name}[{w}])", field.scale)
    return {DCGM + key: expr for key, expr in q.items()}


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
