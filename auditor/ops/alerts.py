"""Prometheus alert rules, generated from code into ``deploy/prometheus/rules/auditor.rules.yml``.

Every alert reads catalog metrics or the recorded series of :mod:`auditor.ops.recording`, so an
alert and the dashboard panel that shows the same quantity cannot disagree. Thresholds are the
named constants below; each alert's ``doc`` says why its threshold and ``for:`` duration are what
they are. Missing data never reads as a problem of the training job: a GPU without utilisation
samples is not idle, an ended rank is not starved, a GPU no rank owns is nobody's waste. The
monitoring's own blind spots (exporter down, monitor down, stale samples) have their own alerts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml

from auditor.metrics import catalog as C
from auditor.ops import recording as R

Severity = Literal["warning", "critical"]
SEVERITIES: tuple[str, ...] = ("warning", "critical")

# Where the rendered file lives, relative to the repository root.
RULES_PATH = "deploy/prometheus/rules/auditor.rules.yml"
RECORDING_GROUP = "auditor-recording"
ALERT_GROUP = "auditor-alerts"

# Prometheus scrape-config job names (``up{job=...}`` keeps these; auditor_* series carry the
# training job in ``auditor_job``, which a default scrape config leaves alone).
NODES_SCRAPE_JOB = "auditor-nodes"
SERVE_SCRAPE_JOB = "auditor-serve"
# A scrape job name a setting may give: what a Prometheus job name holds in practice (a
# prometheus-operator PodMonitor's is ``namespace/name``), and nothing a regex would read.
SCRAPE_JOB_NAME = re.compile(r"^[A-Za-z0-9_:/-]+$")

# --- thresholds (documented defaults) -------------------------------------------------------------
# A job holding this many GPUs on one node is a multi-GPU allocation worth auditing; one GPU that
# is underused is a smaller problem with other causes (a notebook, a debug run).
UNDERUSED_MIN_GPUS = 2
# What a job's GPUs on a node achieve, by the best measure known there (recording.py's
# auditor:node_job_achieved:avg5m), and the 5-minute mean below which they count as underused.
# Model FLOPs utilisation, where the auditor runs in the job: a twentieth of the devices' dense
# peak for the dtypes the FLOPs ran in. Tuned transformer training reaches 30-60% and most
# convolutional nets well above 5%: below it the GPUs do a small part of what they could, whatever
# their busy time says.
UNDERUSED_MFU = 0.05
# DCGM's tensor pipe activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE): the pipe idle nine cycles in
# ten. It counts cycles the pipe issued at all, so the same work reads higher here than as MFU;
# matmuls in fp32 with TF32 off never use it and read 0, however busy the GPU.
UNDERUSED_TENSOR_PIPE_ACTIVE = 0.1
# DCGM's SM activity (DCGM_FI_PROF_SM_ACTIVE): half the SMs' cycles without a warp, the SM-level
# analogue of the busy-time threshold below (small kernels that occupy a few SMs read low here
# while NVML reads 100%).
UNDERUSED_SM_ACTIVE = 0.5
# NVML's busy time, the measure of last resort (neither MFU nor DCGM's profiling known): half of
# the time no kernel ran on the average GPU.
UNDERUSED_UTILIZATION = 0.5
UNDERUSED_THRESHOLDS: dict[str, float] = {
    R.MEASURE_MFU: UNDERUSED_MFU,
    R.MEASURE_TENSOR_PIPE: UNDERUSED_TENSOR_PIPE_ACTIVE,
    R.MEASURE_SM_ACTIVE: UNDERUSED_SM_ACTIVE,
    R.MEASURE_UTILIZATION: UNDERUSED_UTILIZATION,
}
UNDERUSED_FOR = "15m"
# Busiest minus idlest GPU of one job (5-minute busy time) above which the load is uneven: the
# 90% vs 50% case practitioners recognise is 0.4; 0.3 leaves room for normal jitter.
SPREAD_UTILIZATION = 0.3
SPREAD_MIN_GPUS = 2
SPREAD_FOR = "10m"
# Share of a rank's step time spent waiting for the DataLoader above which the rank is starved.
# Twice the data_starvation rule's 15%: the finding reports mild starvation with its fix, the
# alert interrupts someone only when a third of every step is lost.
DATA_WAIT_RATIO = 0.3
DATA_STARVED_FOR = "5m"
# A GPU owned by a job whose busy time never exceeded this over IDLE_WINDOW is idle: 5% tolerates
# the stray kernel of a rank that holds the GPU but trains elsewhere (on the CPU, on GPU 0).
IDLE_UTILIZATION = 0.05
IDLE_WINDOW = "10m"
IDLE_FOR = "10m"
EXPORTER_DOWN_FOR = "5m"
GPU_MONITOR_DOWN_FOR = "5m"
# Age of a GPU's latest sample (Prometheus' clock minus the node's) above which it is stale: far
# beyond a monitor's sampling period plus one 15-second scrape, with room for clock skew.
GPU_SAMPLE_MAX_AGE_SECONDS = 120
GPU_SAMPLES_STALE_FOR = "5m"
GPU_LOST_FOR = "1m"
# Age of the analysis service's latest successful evaluation above which its findings are stale:
# twenty of its default 15-second evaluation intervals, so a few slow or failed ones (retried on
# a backoff) do not count.
SERVE_MAX_EVALUATION_AGE_SECONDS = 300
SERVE_STALE_FOR = "5m"
CRITICAL_FINDING_FOR = "5m"
# A rank whose memory the auditor projects full within this many seconds at the rate it climbs:
# memory_growth's warning horizon (a day: a run of a day would crash). Within its critical
# horizon (30 minutes) the finding is critical and AuditorCriticalFinding pages as well.
MEMORY_FULL_WITHIN_SECONDS = 24 * 3600
MEMORY_FILLING_FOR = "2m"

# Prometheus' duration syntax: units from largest to smallest, each at most once ("1h30m").
_DURATION = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)


def duration_seconds(duration: str) -> float:
    """Seconds in a Prometheus duration (``"15m"``, ``"5m30s"``); ValueError if it is not one."""
    m = _DURATION.match(duration)
    if m is None or not duration:
        raise ValueError(f"invalid Prometheus duration {duration!r}")
    return sum(int(n) * unit for n, unit in zip(m.groups(), _UNIT_SECONDS, strict=True) if n)


def _label(name: str) -> str:
    return "{{ $labels." + name + " }}"


_PCT = "{{ $value | humanizePercentage }}"
_AGE = "{{ $value | humanizeDuration }}"


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _fixes(matchers: str, args: str, line: str, none: str) -> str:
    """A template listing the fixes ``auditor_finding_fix_info`` holds for the series the alert
    names: ``matchers`` (``auditor_job=%q,rank=%q``) filled from the alert's labels ``args``;
    ``line`` words one fix (``.Labels.rank``, ``.Labels.kind``, ``.Labels.fix``), ``none`` is
    said where there is none. Serve and a live run's endpoint export the same fix: ``max by``
    folds them."""
    query = f"max by (rank, kind, fix) ({C.FINDING_FIX_INFO.name}{{{matchers}}})"
    return (
        f'{{{{ with printf "{query}" {args} | query | sortByLabel "rank" }}}}'
        f"{{{{ range $i, $f := . }}}}{{{{ if $i }}}} {{{{ end }}}}{line}{{{{ end }}}}"
        f"{{{{ else }}}}{none}{{{{ end }}}}"
    )


_NO_FIX = "No fix is exported yet (auditor serve, or the run's endpoint, not scraped)."
# The change to make on the alert's rank, from any finding that blames it.
_RANK_FIX = _fixes(
    "auditor_job=%q,rank=%q",
    "$labels.auditor_job $labels.rank",
    "{{ $f.Labels.fix }} ({{ $f.Labels.kind }}).",
    _NO_FIX,
)
# The changes to make on each blamed rank of the alert's job (on its node, where it names one).
_JOB_FIXES = _fixes(
    "auditor_job=%q",
    "$labels.auditor_job",
    "Rank {{ $f.Labels.rank }} ({{ $f.Labels.kind }}): {{ $f.Labels.fix }}.",
    _NO_FIX,
)
_NODE_FIXES = _fixes(
    "auditor_job=%q,node=%q",
    "$labels.auditor_job $labels.node",
    "Rank {{ $f.Labels.rank }} ({{ $f.Labels.kind }}): {{ $f.Labels.fix }}.",
    _NO_FIX,
)
# The change the alert's finding proposes (rank empty: a GPU no rank owns).
_FINDING_FIX = _fixes(
    "auditor_job=%q,kind=%q,rank=%q",
    "$labels.auditor_job $labels.kind $labels.rank",
    "{{ $f.Labels.fix }}",
    _NO_FIX,
)


@dataclass(frozen=True)
class AlertRule:
    """One alert: name, PromQL, ``for:`` duration, severity label and annotation templates.

    ``summary``, ``description`` and ``fix`` are Prometheus templates (``{{ $labels.x }}``,
    ``{{ $value }}``, ``query``); ``fix``, where set, is the change to make on the rank (or each
    blamed rank of the job) the alert names, read from ``auditor_finding_fix_info``, and the
    description ends with it, so a page says what to change. ``doc`` is for people reading this
    module: the threshold and why the ``for:`` is what it is.
    """

    name: str
    expr: str
    for_: str
    severity: Severity
    summary: str
    description: str
    doc: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.name}: severity must be one of {SEVERITIES}")
        if not self.name.startswith("Auditor"):
            raise ValueError(f"{self.name}: alert names start with 'Auditor'")
        duration_seconds(self.for_)

    def to_dict(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description + (f" {self.fix}" if self.fix else ""),
                **({"fix": self.fix} if self.fix else {}),
            },
        }


def _by_measure(texts: dict[str, str]) -> str:
    """A template choosing the text of the alert's ``measure`` label (the last one: otherwise)."""
    *named, (_, last) = texts.items()
    out = ""
    for i, (measure, text) in enumerate(named):
        out += f'{{{{ {"if" if i == 0 else "else if"} eq $labels.measure "{measure}" }}}}{text}'
    return f"{out}{{{{ else }}}}{last}{{{{ end }}}}"


_ACHIEVED = R.NODE_JOB_ACHIEVED_AVG.record
_UNDERUSED_WHERE = " or ".join(
    f'{_ACHIEVED}{{{R.MEASURE_LABEL}="{measure}"}} < {threshold}'
    for measure, threshold in UNDERUSED_THRESHOLDS.items()
)
_JOB_ON_NODE = f"job {_label('auditor_job')} holds on node {_label('node')}"
_MEAN = "mean of the last 5 minutes, threshold"
UNDERUSED_MULTI_GPU_NODE = AlertRule(
    name="AuditorUnderusedMultiGpuNode",
    expr=(
        f"({_UNDERUSED_WHERE})"
        f" and on (node, auditor_job) ({R.NODE_JOB_GPUS.record} >= {UNDERUSED_MIN_GPUS})"
    ),
    for_=UNDERUSED_FOR,
    severity="warning",
    summary=(
        f"Job {_label('auditor_job')} underuses its GPUs on node {_label('node')} ("
        + _by_measure(
            {
                R.MEASURE_MFU: f"MFU {_PCT}",
                R.MEASURE_TENSOR_PIPE: f"tensor pipe active {_PCT}",
                R.MEASURE_SM_ACTIVE: f"SM active {_PCT}",
                R.MEASURE_UTILIZATION: f"busy {_PCT}",
            }
        )
        + ")"
    ),
    description=_by_measure(
        {
            R.MEASURE_MFU: (
                f"The GPUs {_JOB_ON_NODE} achieved {_PCT} of their peak FLOP/s: model FLOPs"
                " utilisation, the job's FLOPs the auditor counted in its ranks over the"
                " devices' dense peak for the dtypes they ran in"
                f" ({_MEAN} {_pct(UNDERUSED_MFU)})"
            ),
            R.MEASURE_TENSOR_PIPE: (
                f"The tensor pipes of the GPUs {_JOB_ON_NODE} were active {_PCT} of their"
                " cycles: dcgm-exporter's DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, the job reporting no"
                f" MFU ({_MEAN} {_pct(UNDERUSED_TENSOR_PIPE_ACTIVE)})"
            ),
            R.MEASURE_SM_ACTIVE: (
                f"The SMs of the GPUs {_JOB_ON_NODE} had work {_PCT} of their cycles:"
                " dcgm-exporter's DCGM_FI_PROF_SM_ACTIVE, neither MFU nor tensor pipe activity"
                f" known ({_MEAN} {_pct(UNDERUSED_SM_ACTIVE)})"
            ),
            R.MEASURE_UTILIZATION: (
                f"The GPUs {_JOB_ON_NODE} were busy {_PCT} of the time: NVML utilisation, the"
                " share of time any kernel ran, neither MFU nor DCGM's profiling counters known"
                f" ({_MEAN} {_pct(UNDERUSED_UTILIZATION)})"
            ),
        }
    )
    + (
        f" for {UNDERUSED_FOR}. They wait for something else (data, the host, one slow rank) or"
        " run below their speed (fp32 matmuls where bf16 or TF32 would serve, batches too small"
        " to fill them). What to change:"
    ),
    fix=_NODE_FIXES,
    doc=(
        f"Fires when a job holding >= {UNDERUSED_MIN_GPUS} GPUs on one node achieves little on"
        " them by the best measure known there (recording.py's auditor:node_job_achieved:avg5m,"
        " its measure label in the alert): model FLOPs utilisation below"
        f" {UNDERUSED_MFU} where the auditor runs in the job; else DCGM's tensor pipe activity"
        f" below {UNDERUSED_TENSOR_PIPE_ACTIVE}; else DCGM's SM activity below"
        f" {UNDERUSED_SM_ACTIVE}; else NVML's busy time below {UNDERUSED_UTILIZATION}, an"
        " occupancy flag that reads 100% for a GPU running small fp32 kernels. The 5-minute"
        f" average already smooths single steps; {UNDERUSED_FOR} of it more is what makes the"
        " waste worth an operator's time (a warm-up, a checkpoint or a validation pass ends"
        " sooner). A change of measure (MFU appearing once a step is counted) starts the"
        " `for:` again. A job with one GPU on the node never fires."
    ),
)

GPU_UTILIZATION_SPREAD = AlertRule(
    name="AuditorGpuUtilizationSpread",
    expr=(
        f"{R.JOB_GPU_UTILIZATION_SPREAD.record} > {SPREAD_UTILIZATION}"
        f" and on (auditor_job) ({R.JOB_GPUS.record} >= {SPREAD_MIN_GPUS})"
    ),
    for_=SPREAD_FOR,
    severity="warning",
    summary=f"GPUs of job {_label('auditor_job')} are unevenly busy",
    description=(
        f"The busiest and the idlest GPU of job {_label('auditor_job')} differ by {_PCT} of"
        " 5-minute busy"
        f" time (threshold {_pct(SPREAD_UTILIZATION)}) for {SPREAD_FOR}. Look at the batch split,"
        " the data path of the idle GPUs' ranks and whether one device is slower. What to"
        " change:"
    ),
    fix=_JOB_FIXES,
    doc=(
        f"Fires when the 5-minute busy time of one job's GPUs spreads by more than"
        f" {SPREAD_UTILIZATION} while the job holds >= {SPREAD_MIN_GPUS} live GPUs (with one"
        " live GPU left, the spread would only compare it with the stale 5-minute average a GPU"
        " whose monitor went down leaves behind)."
        f" {SPREAD_FOR} on top of the 5-minute average: an imbalance that lasts that long is"
        " structural, not a passing data hiccup. Under DDP the waiting ranks look busy, so the"
        " spread understates the imbalance; the alert is a pointer to the findings, not a verdict."
    ),
)

DATA_STARVED_RANK = AlertRule(
    name="AuditorDataStarvedRank",
    expr=(
        f'max by (auditor_job, node, rank) ({R.RANK_PHASE_RATIO.record}{{phase="data_wait"}})'
        f" > {DATA_WAIT_RATIO}"
        f" and on (auditor_job, node, rank) ({C.RANK_UP.name} == 1)"
    ),
    for_=DATA_STARVED_FOR,
    severity="warning",
    summary=(
        f"Rank {_label('rank')} of job {_label('auditor_job')} on {_label('node')} waits for data"
        f" {_PCT} of its step time"
    ),
    description=(
        f"Rank {_label('rank')} of job {_label('auditor_job')} on node {_label('node')}"
        f" spent {_PCT} of"
        f" its step time waiting for the DataLoader (threshold {_pct(DATA_WAIT_RATIO)}) for"
        f" {DATA_STARVED_FOR}. More num_workers (within the node's free cores), pin_memory and"
        f" persistent_workers keep batches ready. What to change on rank {_label('rank')}:"
    ),
    fix=_RANK_FIX,
    doc=(
        f"Fires when a live rank (auditor_rank_up 1) spends more than {DATA_WAIT_RATIO} of its"
        f" step time in data_wait (1-minute rates). {DATA_STARVED_FOR}: five one-minute windows"
        " rule out the first epoch's worker start-up and a single slow shard; a rank that ended"
        " drops out at once instead of firing on its last minute of counters."
    ),
)

IDLE_ALLOCATED_GPU = AlertRule(
    name="AuditorIdleAllocatedGpu",
    expr=(
        f'max_over_time({C.GPU_UTILIZATION_RATIO.name}{{auditor_job!=""}}[{IDLE_WINDOW}])'
        f" < {IDLE_UTILIZATION}"
        f" and on (node, uuid, auditor_job, rank) ({C.GPU_UP.name} == 1)"
    ),
    for_=IDLE_FOR,
    severity="warning",
    summary=(
        f"GPU {_label('gpu')} on node {_label('node')} is held by job {_label('auditor_job')}"
        " but does no work"
    ),
    description=(
        f"GPU {_label('gpu')} ({_label('uuid')}, {_label('model')}) on node {_label('node')},"
        f" owned by rank {_label('rank')} of job {_label('auditor_job')}, was at most {_PCT}"
        " busy over"
        f" the last {IDLE_WINDOW} (threshold {_pct(IDLE_UTILIZATION)}) for {IDLE_FOR}. The job"
        " holds a GPU it does not use: check the rank's device placement. What to change on"
        f" rank {_label('rank')}:"
    ),
    fix=_RANK_FIX,
    doc=(
        f"Fires when every utilisation sample of a GPU some rank owns stayed below"
        f" {IDLE_UTILIZATION} for {IDLE_WINDOW} while its monitor answers. A GPU without"
        " utilisation samples (not supported, monitor down) has no series and never reads as"
        ' idle; an unowned GPU (auditor_job="") is not the job\'s waste.'
        f" The {IDLE_FOR} `for:` covers a"
        " GPU that just changed owner, whose series is younger than the window: its first"
        " samples alone must not make it idle."
    ),
)

# How far back AuditorExporterDown looks for the node a down endpoint served (its last
# auditor_node_cpu_cores series): an endpoint down longer than this loses its node label, and the
# alert its node inhibition.
ENDPOINT_NODE_MEMORY = "1d"


def exporter_down(
    nodes_job: str = NODES_SCRAPE_JOB, serve_job: str = SERVE_SCRAPE_JOB
) -> AlertRule:
    """AuditorExporterDown for the scrape jobs named ``nodes_job`` (node endpoints: ``auditor
    fleet``'s agents, ``auditor run --sd-file``) and ``serve_job`` (``auditor serve``): settings
    of the generated rules, since an operator's Prometheus names its own jobs."""
    for name in (nodes_job, serve_job):
        if not SCRAPE_JOB_NAME.match(name):
            raise ValueError(f"scrape job name {name!r}: use letters, digits and _ : / - only")
    return AlertRule(
        name="AuditorExporterDown",
        # A file-SD target carries no node label of its own (it would rename the series' node to
        # exported_node): the node comes from the endpoint's last node series, so the alert
        # names it and Alertmanager's inhibition by node holds. `or on` keeps the endpoints that
        # never served one (auditor serve, a target that never answered) without it; topk keeps
        # one node per endpoint (a renamed node must not make the match ambiguous).
        expr=(
            f'(up{{job=~"{nodes_job}|{serve_job}"}} == 0)'
            f" + on (instance, job) group_left (node) (0 * topk by (instance, job) (1,"
            f" last_over_time({C.NODE_CPU_CORES.name}[{ENDPOINT_NODE_MEMORY}])))"
            f' or on (instance, job) (up{{job=~"{nodes_job}|{serve_job}"}} == 0)'
        ),
        for_=EXPORTER_DOWN_FOR,
        severity="critical",
        # A node endpoint is named by the node its last series carried; the service by none.
        summary=(
            f"Auditor endpoint {_label('instance')} ({_label('job')}"
            f"{{{{ if $labels.node }}}}, node {_label('node')}{{{{ end }}}}) is down"
        ),
        description=(
            f"Prometheus could not scrape {_label('instance')} of scrape job {_label('job')} for"
            f" {EXPORTER_DOWN_FOR}. Its GPU and rank metrics (or the analysis service's"
            " findings) are missing, so the other auditor alerts are blind there. Check the node"
            " agent or `auditor serve` process and the address in the service discovery file."
        ),
        doc=(
            "Fires on the scrape targets of the auditor's own scrape jobs. Critical because every"
            f" other alert is blind while it lasts; {EXPORTER_DOWN_FOR} lets a node agent or the"
            " service restart without paging. A node endpoint's alert carries the node its"
            f" series named within {ENDPOINT_NODE_MEMORY} (Alertmanager silences that node's"
            " other alerts by it)."
        ),
    )


EXPORTER_DOWN = exporter_down()

GPU_MONITOR_DOWN = AlertRule(
    name="AuditorGpuMonitorDown",
    expr=f"{C.GPU_UP.name} == 0",
    for_=GPU_MONITOR_DOWN_FOR,
    severity="warning",
    summary=f"GPU monitor of GPU {_label('gpu')} on node {_label('node')} is not answering",
    description=(
        f"The GpuMonitor of GPU {_label('gpu')} ({_label('uuid')}) on node {_label('node')} has"
        f" not answered for {GPU_MONITOR_DOWN_FOR}; the GPU's values are missing (not zero)."
        " The actor may be restarting in a loop or NVML may hang on this device."
    ),
    doc=(
        f"Fires when a GPU's monitor stays unreachable for {GPU_MONITOR_DOWN_FOR}; shorter gaps"
        " are actor restarts the node agent handles itself."
    ),
)

GPU_SAMPLES_STALE = AlertRule(
    name="AuditorGpuSamplesStale",
    expr=(
        f"time() - {C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name} > {GPU_SAMPLE_MAX_AGE_SECONDS}"
        f" unless on (node, uuid) ({C.GPU_UP.name} == 0)"
    ),
    for_=GPU_SAMPLES_STALE_FOR,
    severity="warning",
    summary=f"Samples of GPU {_label('gpu')} on node {_label('node')} are stale",
    description=(
        f"The latest sample of GPU {_label('gpu')} ({_label('uuid')}) on node {_label('node')}"
        f" is {_AGE} old (threshold {GPU_SAMPLE_MAX_AGE_SECONDS}s) although its monitor reports"
        " up. The sampler may be stuck, or the node's clock is far from Prometheus' clock."
    ),
    doc=(
        f"Fires when a GPU's latest sample is older than {GPU_SAMPLE_MAX_AGE_SECONDS} s by"
        " Prometheus' clock while its monitor does not report down (that case is"
        f" AuditorGpuMonitorDown, which would otherwise fire twice). {GPU_SAMPLES_STALE_FOR} of"
        " `for:` on top of the age threshold keeps a node's clock step from paging."
    ),
)

GPU_LOST = AlertRule(
    name="AuditorGpuLost",
    expr=f"{C.GPU_LOST.name} == 1",
    for_=GPU_LOST_FOR,
    severity="critical",
    summary=f"GPU {_label('gpu')} on node {_label('node')} is lost",
    description=(
        f"NVML reports GPU {_label('gpu')} ({_label('uuid')}, {_label('model')}) on node"
        f" {_label('node')} lost (fallen off the bus)."
        "{{ if $labels.auditor_job }}"
        f" Rank {_label('rank')} of job {_label('auditor_job')} on it will fail"
        " or hang.{{ end }} Drain the node; the GPU needs a reset or the node a reboot."
    ),
    doc=(
        "Fires on a GPU NVML reports lost. Critical: the device does not come back by itself."
        f" {GPU_LOST_FOR} of `for:` only rules out a single bad sample."
    ),
)

_serve_age = f"time() - {C.SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS.name}"
_serve_prom_down = f"{C.SERVE_PROMETHEUS_UP.name} == 0"
SERVE_STALE = AlertRule(
    name="AuditorServeStale",
    # Two causes, told apart by a "reason" label. When Prometheus is unreachable the evaluations
    # stop too; `unless` keeps that one cause from firing as two alerts.
    expr=(
        f'label_replace({_serve_prom_down}, "reason", "prometheus_unreachable", "", "")'
        f" or label_replace({_serve_age} > {SERVE_MAX_EVALUATION_AGE_SECONDS},"
        f' "reason", "evaluation_stale", "", "")'
        f" unless on (instance, job) ({_serve_prom_down})"
    ),
    for_=SERVE_STALE_FOR,
    severity="warning",
    summary=f"auditor serve on {_label('instance')} is not evaluating jobs ({_label('reason')})",
    description=(
        '{{ if eq $labels.reason "prometheus_unreachable" }}'
        f"auditor serve on {_label('instance')} cannot query Prometheus"
        f" ({C.SERVE_PROMETHEUS_UP.name} 0 for {SERVE_STALE_FOR})."
        "{{ else }}"
        f"auditor serve on {_label('instance')} completed its latest evaluation {_AGE} ago"
        f" (threshold {SERVE_MAX_EVALUATION_AGE_SECONDS}s)."
        "{{ end }}"
        " Its findings and the auditor_finding series are stale: check the service's log and"
        " its Prometheus URL."
    ),
    doc=(
        "Fires when the analysis service's latest successful evaluation is older than"
        f" {SERVE_MAX_EVALUATION_AGE_SECONDS} s or it cannot reach Prometheus, for"
        f" {SERVE_STALE_FOR}: findings older than that no longer describe the running jobs. The"
        " service not being scraped at all is AuditorExporterDown."
    ),
)

_speedup_query = (
    f'printf "max({C.FINDING_PREDICTED_SPEEDUP.name}{{auditor_job=%q,kind=%q,rank=%q}})"'
    " $labels.auditor_job $labels.kind $labels.rank"
)
CRITICAL_FINDING = AlertRule(
    name="AuditorCriticalFinding",
    # Node endpoints of live runs export the same finding as the service: max by dedupes them.
    expr=f'max by (auditor_job, kind, rank, node) ({C.FINDING.name}{{severity="critical"}})',
    for_=CRITICAL_FINDING_FOR,
    severity="critical",
    # rank="" is a job-wide finding: the templates then name the job alone.
    summary=(
        f"Critical {_label('kind')} finding"
        f"{{{{ if $labels.rank }}}} on rank {_label('rank')}{{{{ end }}}}"
        f" of job {_label('auditor_job')}"
    ),
    description=(
        f"The auditor holds a critical {_label('kind')} finding against"
        f"{{{{ if $labels.rank }}}} rank {_label('rank')} (node {_label('node')}) of{{{{ end }}}}"
        f" job {_label('auditor_job')} for {CRITICAL_FINDING_FOR}. "
        f"{{{{ with {_speedup_query} | query }}}}"
        "Applying its fixes is predicted to speed the job up"
        ' {{ . | first | value | printf "%.2f" }}x. '
        "{{ end }}"
        "What to change{{ if $labels.rank }} on rank {{ $labels.rank }}{{ end }}:"
    ),
    fix=_FINDING_FIX,
    doc=(
        "Fires on any critical finding (from `auditor serve` or a live run's node endpoint)."
        f" {CRITICAL_FINDING_FOR}: the service re-evaluates every job continuously, and a finding"
        " that survives several evaluations is not a transient of one window."
    ),
)

MEMORY_FILLING_UP = AlertRule(
    name="AuditorRankMemoryFillingUp",
    # Node endpoints of live runs export the same finding each: min by keeps the soonest.
    expr=(
        f"min by (auditor_job, node, rank) ({C.FINDING_MEMORY_FULL_SECONDS.name})"
        f" < {MEMORY_FULL_WITHIN_SECONDS}"
    ),
    for_=MEMORY_FILLING_FOR,
    severity="warning",
    summary=(
        f"Memory of rank {_label('rank')} of job {_label('auditor_job')} on {_label('node')}"
        f" is full in {_AGE}"
    ),
    description=(
        f"The memory of rank {_label('rank')} of job {_label('auditor_job')} on node"
        f" {_label('node')} climbs step after step past its warm-up (memory_growth): at its"
        f" current rate its GPU (or host) is full in {_AGE} (threshold"
        f" {MEMORY_FULL_WITHIN_SECONDS // 3600}h), and the rank then runs out of memory."
        " Something is kept from every step. What to change on rank"
        f" {_label('rank')}:"
    ),
    fix=_RANK_FIX,
    doc=(
        "Fires when the auditor projects a rank's GPU or host memory full within"
        f" {MEMORY_FULL_WITHIN_SECONDS // 3600} hours at the rate it climbs (the memory_growth"
        " rule's warning horizon; within its critical horizon of 30 minutes the finding is"
        " critical and AuditorCriticalFinding pages too). The rule already requires a steady"
        f" climb over many steps past warm-up, so {MEMORY_FILLING_FOR} of `for:` only rules out"
        " a single evaluation; a leak that fills a GPU in half an hour leaves no time for more."
    ),
)

ALERT_RULES: tuple[AlertRule, ...] = (
    UNDERUSED_MULTI_GPU_NODE,
    GPU_UTILIZATION_SPREAD,
    DATA_STARVED_RANK,
    IDLE_ALLOCATED_GPU,
    EXPORTER_DOWN,
    GPU_MONITOR_DOWN,
    GPU_SAMPLES_STALE,
    GPU_LOST,
    SERVE_STALE,
    CRITICAL_FINDING,
    MEMORY_FILLING_UP,
)

BY_NAME: dict[str, AlertRule] = {a.name: a for a in ALERT_RULES}


def alert_rules(
    nodes_job: str = NODES_SCRAPE_JOB, serve_job: str = SERVE_SCRAPE_JOB
) -> tuple[AlertRule, ...]:
    """:data:`ALERT_RULES` for an operator's scrape job names (the defaults: deploy/'s)."""
    down = exporter_down(nodes_job, serve_job)
    return tuple(down if a.name == down.name else a for a in ALERT_RULES)


def rules_document(
    nodes_job: str = NODES_SCRAPE_JOB, serve_job: str = SERVE_SCRAPE_JOB
) -> dict[str, Any]:
    """The rules file as data: the recording group (in dependency order), then the alerts."""
    return {
        "groups": [
            {"name": RECORDING_GROUP, "rules": [r.to_dict() for r in R.RECORDING_RULES]},
            {
                "name": ALERT_GROUP,
                "rules": [a.to_dict() for a in alert_rules(nodes_job, serve_job)],
            },
            # dcgm-exporter's GPU series as auditor_gpu_* (R.DCGM_RULES: a fleet without it
            # records nothing here).
            {"name": R.DCGM_GROUP, "rules": [r.to_dict() for r in R.DCGM_RULES]},
        ]
    }


_HEADER = (
    "# Prometheus recording and alert rules of the GPU Balance Auditor.\n"
    "# generated by `auditor dashboards render` from auditor/ops/recording.py and\n"
    "# auditor/ops/alerts.py; do not edit.\n"
)


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings as literal blocks; a subclass, so the global
    yaml state stays untouched."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _represent_str)


def render_rules(nodes_job: str = NODES_SCRAPE_JOB, serve_job: str = SERVE_SCRAPE_JOB) -> str:
    """The rules file's text: header comment and YAML in a stable key order, deterministic."""
    body = yaml.dump(
        rules_document(nodes_job, serve_job),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=False,
        width=1_000_000,
    )
    return _HEADER + body


# A metric name as it appears in PromQL or in a template's query string, not inside a longer
# identifier: auditor_* exported names and auditor:* recorded names.
_METRIC = re.compile(r"(?<![A-Za-z0-9_:])auditor(?:_[A-Za-z0-9_]+|:[A-Za-z0-9_:]+)")


def referenced_metrics(expr: str) -> set[str]:
    """The auditor metric names (``auditor_*`` and recorded ``auditor:*``) ``expr`` reads (the
    training job's label, ``auditor_job``, is no metric)."""
    return set(_METRIC.findall(expr)) - {C.JOB_LABEL}
