"""Recording rules: the per-rank and per-job quantities the dashboards and the alert rules share.

Each rule is written once here, from catalog names, and rendered into
``deploy/prometheus/rules/auditor.rules.yml``; dashboards and alerts refer to the recorded name,
so a panel and the alert that fires on it cannot disagree about what "data wait" or "GPU busy"
means. Names follow Prometheus' ``level:metric:operations`` convention.

Windows: ``1m`` for step-level rates (a scrape every 15 s gives four points), ``5m`` for the GPU
busy averages the "underused" alerts judge (one slow minute is not underuse).
"""

from __future__ import annotations

from dataclasses import dataclass

from auditor.metrics import catalog as C
from auditor.metrics.promql import growth


@dataclass(frozen=True)
class RecordingRule:
    """One recording rule: the recorded series name, its PromQL and what it means."""

    record: str
    expr: str
    help: str

    def to_dict(self) -> dict[str, str]:
        return {"record": self.record, "expr": self.expr}


STEP_WINDOW = "1m"
GPU_WINDOW = "5m"

_steps = C.RANK_STEPS_TOTAL.name
_step_s = C.RANK_STEP_SECONDS_TOTAL.name
_phase_s = C.RANK_PHASE_SECONDS_TOTAL.name
_samples = C.RANK_SAMPLES_TOTAL.name
_gpu_util = C.GPU_UTILIZATION_RATIO.name
_gpu_up = C.GPU_UP.name

RANK_STEPS_RATE = RecordingRule(
    record="auditor:rank_steps:rate1m",
    expr=f"rate({_steps}[{STEP_WINDOW}])",
    help="Steps per second of each rank.",
)
# The ratios divide growths (not rates) so that a rank's phases add up to its step from its
# first minute on (:func:`auditor.metrics.promql.growth`).
_grown_steps = growth(_steps, STEP_WINDOW)
_grown_step_s = growth(_step_s, STEP_WINDOW)
_waits = _phase_s + '{phase=~"data_wait|collective_wait"}'
RANK_STEP_SECONDS_MEAN = RecordingRule(
    record="auditor:rank_step_seconds:mean1m",
    expr=f"{_grown_step_s} / {_grown_steps}",
    help="Mean step time of each rank (seconds).",
)
RANK_PHASE_SECONDS_MEAN = RecordingRule(
    record="auditor:rank_phase_seconds:mean1m",
    expr=f"{growth(_phase_s, STEP_WINDOW)} / ignoring(phase) group_left() {_grown_steps}",
    help="Mean time per step in each phase (seconds); phases are exclusive.",
)
RANK_PHASE_RATIO = RecordingRule(
    record="auditor:rank_phase:ratio1m",
    expr=f"{growth(_phase_s, STEP_WINDOW)} / ignoring(phase) group_left() {_grown_step_s}",
    help="Share of each rank's step time spent in each phase, 0..1 (data_wait: starvation).",
)
RANK_BUSY_RATIO = RecordingRule(
    record="auditor:rank_busy:ratio1m",
    expr=(f"clamp_min(1 - sum without(phase) {growth(_waits, STEP_WINDOW)} / {_grown_step_s}, 0)"),
    help="Share of each rank's step time not spent waiting for data or for its peers, 0..1.",
)
RANK_SAMPLES_RATE = RecordingRule(
    record="auditor:rank_samples:rate1m",
    expr=f"rate({_samples}[{STEP_WINDOW}])",
    help="Training samples per second of each rank.",
)
JOB_SAMPLES_RATE = RecordingRule(
    record="auditor:job_samples:rate1m",
    expr=f"sum by (auditor_job) ({RANK_SAMPLES_RATE.record})",
    help="Training samples per second of each job (all ranks).",
)
GPU_UTILIZATION_AVG = RecordingRule(
    record="auditor:gpu_utilization:avg5m",
    expr=f"avg_over_time({_gpu_util}[{GPU_WINDOW}])",
    help="Busy time of each GPU averaged over 5 minutes, 0..1.",
)
NODE_JOB_GPUS = RecordingRule(
    record="auditor:node_job_gpus:count",
    expr=f'count by (node, auditor_job) ({_gpu_up}{{auditor_job!=""}} == 1)',
    help="GPUs each job holds on each node (GPUs whose monitor answers).",
)
NODE_JOB_GPU_UTILIZATION_AVG = RecordingRule(
    record="auditor:node_job_gpu_utilization:avg5m",
    expr=f'avg by (node, auditor_job) ({GPU_UTILIZATION_AVG.record}{{auditor_job!=""}})',
    help="Mean 5-minute busy time of the GPUs one job holds on one node, 0..1.",
)
JOB_GPUS = RecordingRule(
    record="auditor:job_gpus:count",
    expr=f'count by (auditor_job) ({_gpu_up}{{auditor_job!=""}} == 1)',
    help="GPUs each job holds across the cluster.",
)
JOB_GPU_UTILIZATION_AVG = RecordingRule(
    record="auditor:job_gpu_utilization:avg5m",
    expr=f'avg by (auditor_job) ({GPU_UTILIZATION_AVG.record}{{auditor_job!=""}})',
    help="Mean 5-minute busy time of all the GPUs one job holds, 0..1.",
)
JOB_GPU_UTILIZATION_SPREAD = RecordingRule(
    record="auditor:job_gpu_utilization:spread5m",
    expr=(
        f'max by (auditor_job) ({GPU_UTILIZATION_AVG.record}{{auditor_job!=""}})'
        f' - min by (auditor_job) ({GPU_UTILIZATION_AVG.record}{{auditor_job!=""}})'
    ),
    help="Busiest minus idlest GPU of one job (5-minute busy time), 0..1.",
)

# --- achieved work: what AuditorUnderusedMultiGpuNode judges --------------------------------------
# The GPUs a job holds on a node did how much of what they could, by the best measure known there,
# in this order: the job's model FLOPs utilisation (the auditor runs in the job and counted its
# FLOPs), dcgm-exporter's tensor pipe activity, its SM activity, and NVML's busy time (the share
# of time any kernel ran: an occupancy flag, the measure of last resort). Each is a 5-minute mean
# over the node's GPUs (or ranks, for MFU) of that job.
MEASURE_LABEL = "measure"
MEASURE_MFU = "mfu"
MEASURE_TENSOR_PIPE = "tensor_pipe_active"
MEASURE_SM_ACTIVE = "sm_active"
MEASURE_UTILIZATION = "gpu_utilization"
MEASURES = (MEASURE_MFU, MEASURE_TENSOR_PIPE, MEASURE_SM_ACTIVE, MEASURE_UTILIZATION)

NODE_JOB_MFU_AVG = RecordingRule(
    record="auditor:node_job_mfu:avg5m",
    expr=f"avg by (node, auditor_job) (avg_over_time({C.RANK_MFU_RATIO.name}[{GPU_WINDOW}]))",
    help="Mean 5-minute model FLOPs utilisation of one job's ranks on one node, 0..1.",
)
GPU_TENSOR_PIPE_ACTIVE_AVG = RecordingRule(
    record="auditor:gpu_tensor_pipe_active:avg5m",
    expr=f"avg_over_time({C.GPU_TENSOR_PIPE_ACTIVE_RATIO.name}[{GPU_WINDOW}])",
    help="Tensor pipe activity of each GPU (dcgm-exporter) averaged over 5 minutes, 0..1.",
)
NODE_JOB_TENSOR_PIPE_ACTIVE_AVG = RecordingRule(
    record="auditor:node_job_tensor_pipe_active:avg5m",
    expr=f'avg by (node, auditor_job) ({GPU_TENSOR_PIPE_ACTIVE_AVG.record}{{auditor_job!=""}})',
    help="Mean 5-minute tensor pipe activity of the GPUs one job holds on one node, 0..1.",
)
GPU_SM_ACTIVE_AVG = RecordingRule(
    record="auditor:gpu_sm_active:avg5m",
    expr=f"avg_over_time({C.GPU_SM_ACTIVE_RATIO.name}[{GPU_WINDOW}])",
    help="SM activity of each GPU (dcgm-exporter) averaged over 5 minutes, 0..1.",
)
NODE_JOB_SM_ACTIVE_AVG = RecordingRule(
    record="auditor:node_job_sm_active:avg5m",
    expr=f'avg by (node, auditor_job) ({GPU_SM_ACTIVE_AVG.record}{{auditor_job!=""}})',
    help="Mean 5-minute SM activity of the GPUs one job holds on one node, 0..1.",
)


def _measured(record: str, measure: str) -> str:
    return f'label_replace({record}, "{MEASURE_LABEL}", "{measure}", "", "")'


NODE_JOB_ACHIEVED_AVG = RecordingRule(
    record="auditor:node_job_achieved:avg5m",
    # `or on (node, auditor_job)`: a measure counts only where no better one is known for that
    # job on that node (the measure label differs, so a plain `or` would keep them all).
    expr=" or on (node, auditor_job) ".join(
        _measured(record, measure)
        for record, measure in (
            (NODE_JOB_MFU_AVG.record, MEASURE_MFU),
            (NODE_JOB_TENSOR_PIPE_ACTIVE_AVG.record, MEASURE_TENSOR_PIPE),
            (NODE_JOB_SM_ACTIVE_AVG.record, MEASURE_SM_ACTIVE),
            (NODE_JOB_GPU_UTILIZATION_AVG.record, MEASURE_UTILIZATION),
        )
    ),
    help="What one job's GPUs on one node achieved (5-minute mean, 0..1) by the best measure "
    "known there, named by the measure label: mfu, tensor_pipe_active, sm_active or "
    "gpu_utilization.",
)

# Order matters: Prometheus evaluates a group's rules in order, so a rule reading another
# recorded series comes after it and sees the same evaluation's value.
RECORDING_RULES: tuple[RecordingRule, ...] = (
    RANK_STEPS_RATE,
    RANK_STEP_SECONDS_MEAN,
    RANK_PHASE_SECONDS_MEAN,
    RANK_PHASE_RATIO,
    RANK_BUSY_RATIO,
    RANK_SAMPLES_RATE,
    JOB_SAMPLES_RATE,
    GPU_UTILIZATION_AVG,
    NODE_JOB_GPUS,
    NODE_JOB_GPU_UTILIZATION_AVG,
    JOB_GPUS,
    JOB_GPU_UTILIZATION_AVG,
    JOB_GPU_UTILIZATION_SPREAD,
    NODE_JOB_MFU_AVG,
    GPU_TENSOR_PIPE_ACTIVE_AVG,
    NODE_JOB_TENSOR_PIPE_ACTIVE_AVG,
    GPU_SM_ACTIVE_AVG,
    NODE_JOB_SM_ACTIVE_AVG,
    NODE_JOB_ACHIEVED_AVG,
)

RECORDED: dict[str, RecordingRule] = {r.record: r for r in RECORDING_RULES}


# --- dcgm-exporter's series under the auditor's names --------------------------------------------
# Where a node runs dcgm-exporter instead of the auditor's monitors, these rules record its device
# series as the ``auditor_gpu_*`` metrics (the auditor's units and labels: node, gpu, uuid, model,
# and auditor_job/rank of the rank that reported using the GPU), so the dashboards and the alerts
# above read either source. A GPU the auditor's monitors export (a scraped ``auditor_gpu_up``,
# which has a ``job`` label; recorded series have none) is left to them. A GPU a rank uses takes
# the rank's node; a GPU no rank uses keeps dcgm-exporter's ``Hostname`` as its node.
DCGM_GROUP = "auditor-dcgm"
_dcgm_owner = (
    f"topk by (uuid) (1, max by (uuid, {C.JOB_LABEL}, rank, node) ({C.GPU_OWNER_INFO.name}))"
)
_dcgm_scraped = f'{_gpu_up}{{job!=""}}'


def _dcgm(expr: str, scale: float = 1.0, *, exclusive: bool = True) -> str:
    """``expr`` (of dcgm-exporter's series) per GPU with the auditor's labels and owner.
    ``exclusive``: left out for a GPU the auditor's monitors export (a field they measure too);
    a field only DCGM measures (profiling) is recorded for every GPU."""
    from auditor.metrics.dcgm import with_auditor_labels

    gpu = f"max by (node, gpu, uuid, model) ({with_auditor_labels(expr)})"
    if scale != 1.0:
        gpu = f"{gpu} * {scale!r}"
    owned = (
        f"({gpu}) * on (uuid) group_left ({C.JOB_LABEL}, rank, node) {_dcgm_owner}"
        f" or on (uuid) ({gpu})"
    )
    return f"({owned}) unless on (uuid) {_dcgm_scraped}" if exclusive else owned


def _dcgm_rules() -> tuple[RecordingRule, ...]:
    from auditor.metrics import dcgm as D

    xid, util = "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_UTIL"
    rules = [
        RecordingRule(_gpu_up, _dcgm(f"{xid} * 0 + 1"), "1 for every GPU dcgm-exporter reports."),
        RecordingRule(
            C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name,
            _dcgm(f"timestamp({util})"),
            "Time of the GPU's latest dcgm-exporter sample.",
        ),
        RecordingRule(
            C.GPU_LOST.name,
            _dcgm(f"{xid} == bool {D.XID_FALLEN_OFF_BUS}"),
            "1 when the GPU's last XID error is 79 (fallen off the bus).",
        ),
        RecordingRule(
            C.GPU_MEMORY_TOTAL_BYTES.name,
            _dcgm("DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE", D.MIB),
            "Framebuffer used plus free, in bytes.",
        ),
    ]
    for field in D.FIELDS:
        if field.auditor == C.GPU_SM_CLOCK_MAX_HERTZ.name:
            # The model's peak clock where DCGM_FI_DEV_MAX_SM_CLOCK is not exported.
            rules.append(
                RecordingRule(
                    field.auditor, _dcgm(D.sm_clock_max(), D.MHZ), D.sm_clock_max.__doc__ or ""
                )
            )
        elif field.auditor:
            rules.append(
                RecordingRule(
                    field.auditor,
                    _dcgm(field.name, field.scale),
                    f"{field.name} in the auditor's unit.",
                )
            )
    for field in D.PROFILING_FIELDS:
        rules.append(
            RecordingRule(
                field.auditor,
                _dcgm(field.name, field.scale, exclusive=False),
                f"{field.name} (a ratio already), for every GPU: the auditor's monitors do"
                " not measure it.",
            )
        )
    reasons = '{__name__=~"' + "|".join(D.THROTTLE_FIELDS) + '"}'
    rules.append(
        RecordingRule(
            C.GPU_THROTTLE_ACTIVE.name,
            " or ".join(
                f'label_replace({_dcgm(f"floor({reasons} / {bit}) % 2")}, "reason", "{reason}",'
                ' "", "")'
                for reason, bit in D.REASON_BITS.items()
            ),
            "Each clock-event reason's bit of dcgm-exporter's throttle reasons bitmask.",
        )
    )
    return tuple(rules)


DCGM_RULES: tuple[RecordingRule, ...] = _dcgm_rules()
