"""The three Grafana dashboards: cluster overview, one job, one node.

Every query names catalog metrics (``C.X.name``) or recorded series (``R.X.record``), never a
literal metric name, so a renamed metric breaks the build here rather than a panel in production.
Template variables only ever appear in ``=~`` matchers; their All value is ``.*``.

Series from several scrape targets (``auditor serve`` and node endpoints both export findings; an
agent restart starts a new series) are folded with ``max by (...)`` over the labels a panel shows,
so a panel never shows two rows for one thing.
"""

from __future__ import annotations

from collections.abc import Callable

from auditor.metrics import catalog as C
from auditor.ops import recording as R
from auditor.ops.grafana import (
    Dashboard,
    DatasourceVariable,
    Heatmap,
    Json,
    Link,
    Panel,
    QueryVariable,
    Row,
    Stat,
    Table,
    Target,
    Text,
    TextboxVariable,
    Threshold,
    TimeSeries,
)
from auditor.samples import PHASES

TAGS = ("auditor", "gpu")
SERVE_URL_DEFAULT = "http://127.0.0.1:9410"
# The uid of the data source dashboards/provisioning creates (auditor/ops/render.py).
DATASOURCE_UID = "auditor-prometheus"
FINDINGS_PATH = "/api/v1/findings"
# Colour bands of the "underused" tables: below half busy is red. The alert rules judge with their
# own thresholds (auditor/ops/alerts.py); this is only how the table is coloured.
UNDERUSED_BUSY_RATIO = 0.5
SPEEDUP_UNIT = "suffix:x"

JOB = 'auditor_job=~"$job"'
NODE = 'node=~"$node"'
RANK = 'rank=~"$rank"'
OWNED = 'auditor_job!=""'  # GPUs held by a rank of a known job

PHASE_TITLES = {
    "data_wait": "data wait",
    "h2d": "host-to-device copy",
    "forward": "forward",
    "backward": "backward (compute)",
    "optimizer": "optimizer",
    "collective_wait": "collective wait",
}


def sel(metric: str, *matchers: str) -> str:
    """``metric{m1, m2}``: a series selector."""
    return f"{metric}{{{', '.join(matchers)}}}" if matchers else metric


def phase(name: str, *matchers: str) -> str:
    """Mean seconds per step of one phase, for the ranks ``matchers`` select. The probe's phases
    are exclusive (backward holds no collective wait), so they stack as they are."""
    return sel(R.RANK_PHASE_SECONDS_MEAN.record, *matchers, f'phase="{name}"')


def phase_breakdown(*matchers: str) -> str:
    """Every phase's mean seconds per step in one vector: one table row per rank, one column per
    phase."""
    return sel(R.RANK_PHASE_SECONDS_MEAN.record, *matchers)


def _override(name: str, *properties: tuple[str, object]) -> Json:
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": pid, "value": value} for pid, value in properties],
    }


def _dashed(regex: str) -> Json:
    """Series whose name matches ``regex`` drawn as an unfilled dashed line (limits, totals)."""
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [
            {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "custom.stacking", "value": {"group": "A", "mode": "none"}},
        ],
    }


def _link(title: str, url: str) -> Json:
    return {"targetBlank": False, "title": title, "url": url}


NODE_LINK = _link(
    "Node view", "/d/auditor-node/auditor-node?${__url_time_range}&var-node=${__value.raw}"
)
RANK_LINK = _link(
    "Job view of this rank",
    "/d/auditor-job/auditor-job?${__url_time_range}"
    "&var-job=${__data.fields.auditor_job}&var-rank=${__value.raw}",
)
BUSY_THRESHOLDS = (
    Threshold(None, "red"),
    Threshold(UNDERUSED_BUSY_RATIO, "yellow"),
    Threshold(0.8, "green"),
)
SEVERITY_MAPPINGS: Json = {
    "options": {
        "critical": {"color": "red", "index": 0, "text": "critical"},
        "warning": {"color": "orange", "index": 1, "text": "warning"},
        "info": {"color": "blue", "index": 2, "text": "info"},
    },
    "type": "value",
}


def variables() -> tuple[DatasourceVariable | QueryVariable | TextboxVariable, ...]:
    """The variables every auditor dashboard has."""
    return (
        DatasourceVariable(default_uid=DATASOURCE_UID),
        QueryVariable(
            name="job", label="Job", query=f"label_values({C.RANK_INFO.name}, auditor_job)"
        ),
        QueryVariable(
            name="node",
            label="Node",
            # Nodes running a rank of the job, or holding a GPU of it (any GPU with All).
            query=(
                f'label_values({{__name__=~"{C.RANK_INFO.name}|{C.GPU_UP.name}", {JOB}}}, node)'
            ),
        ),
        QueryVariable(
            name="rank",
            label="Rank",
            query=f"label_values({sel(C.RANK_INFO.name, JOB)}, rank)",
            sort=3,
        ),
        TextboxVariable(name="serve_url", label="auditor serve URL", default=SERVE_URL_DEFAULT),
    )


def links() -> tuple[Link, ...]:
    return (
        Link(title="Auditor dashboards", tags=("auditor",), include_vars=True, keep_time=True),
        Link(
            title="Findings with per-rank fixes (auditor serve)",
            url="${serve_url}" + FINDINGS_PATH,
            tooltip="JSON from auditor serve: every finding with its fix for each rank",
        ),
    )


def findings_table(*matchers: str, w: int = 16, h: int = 9) -> Table:
    """The current findings (job, kind, severity, rank, node) with their predicted speed-up.

    Two instant queries merged on their shared labels; the speed-up query keeps only findings the
    first one selected (``and on``), so a filter on node or rank holds for both columns.
    """
    finding = f"max by (auditor_job, kind, rank, node, severity) ({sel(C.FINDING.name, *matchers)})"
    speedup_matchers = tuple(m for m in matchers if not m.startswith("node"))
    speedup = (
        "max by (auditor_job, kind, rank) "
        f"({sel(C.FINDING_PREDICTED_SPEEDUP.name, *speedup_matchers)})"
        f" and on (auditor_job, kind, rank) {finding}"
    )
    return Table(
        title="Current findings",
        description="One row per blamed rank (rank empty: the whole job). The fix for each rank "
        "is in the auditor serve JSON (link on the right).",
        w=w,
        h=h,
        targets=(
            Target(expr=finding, instant=True, format="table"),
            Target(expr=speedup, instant=True, format="table"),
        ),
        transformations=(
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value #A": True},
                    "indexByName": {
                        "auditor_job": 0,
                        "kind": 1,
                        "severity": 2,
                        "rank": 3,
                        "node": 4,
                        "Value #B": 5,
                    },
                    "renameByName": {},
                },
            },
        ),
        overrides=(
            _override(
                "Value #B",
                ("displayName", "predicted speed-up"),
                ("unit", SPEEDUP_UNIT),
                ("decimals", 2),
            ),
            _override(
                "severity",
                ("mappings", [SEVERITY_MAPPINGS]),
                ("custom.cellOptions", {"type": "color-text"}),
            ),
            _override("node", ("links", [NODE_LINK])),
            _override("rank", ("links", [RANK_LINK])),
        ),
        sort_by="predicted speed-up",
        no_value="no findings",
    )


def fixes_text(w: int = 8, h: int = 9) -> Text:
    url = "${serve_url}" + FINDINGS_PATH
    return Text(
        title="Per-rank fixes",
        w=w,
        h=h,
        content=(
            "The fix for each blamed rank is text, not a metric: `auditor serve` serves every "
            f"current finding as JSON at\n\n**[{url}]({url})**\n\n"
            "Each entry has `job`, `kind`, `severity`, `ranks`, `summary`, `fixes` "
            "(`{rank: what to change}`) and `predicted_speedup`.\n\n"
            "Point the *auditor serve URL* variable at your `auditor serve` if it is not "
            f"`{SERVE_URL_DEFAULT}`."
        ),
    )


# --- cluster overview -----------------------------------------------------------------------------


def cluster_overview() -> Dashboard:
    gpu = "max by (node, gpu) ({})"
    gpus_up = gpu.format(sel(C.GPU_UP.name, JOB, NODE))
    unowned = gpu.format(sel(C.GPU_UP.name, 'auditor_job=""', NODE))
    node_busy = sel(R.NODE_JOB_GPU_UTILIZATION_AVG.record, JOB, NODE)
    node_gpus = sel(R.NODE_JOB_GPUS.record, JOB, NODE)
    ranks = f"max by (auditor_job) ({sel(C.JOB_RANKS.name, JOB)})"
    imbalance = f"max by (auditor_job) ({sel(C.JOB_IMBALANCE_RATIO.name, JOB)})"
    job_speedup = f"max by (auditor_job) ({sel(C.JOB_PREDICTED_SPEEDUP.name, JOB)})"
    job_samples = sel(R.JOB_SAMPLES_RATE.record, JOB)

    gpus = Row(
        title="GPUs",
        panels=(
            Heatmap(
                title="GPU busy by node",
                description="Share of time a kernel ran on each GPU (NVML), one row per GPU. "
                "Red rows next to green ones on one node: an imbalance to explain.",
                w=24,
                h=10,
                unit="percentunit",
                color_min=0,
                color_max=1,
                targets=(
                    Target(
                        expr=gpu.format(sel(C.GPU_UTILIZATION_RATIO.name, JOB, NODE)),
                        legend_format="{{node}} gpu {{gpu}}",
                    ),
                ),
            ),
            Stat(
                title="GPUs reporting",
                w=8,
                h=4,
                targets=(Target(expr=f"count({gpus_up} == 1) or vector(0)"),),
            ),
            Stat(
                title="GPUs down (monitor unreachable)",
                w=8,
                h=4,
                thresholds=(Threshold(None, "green"), Threshold(1, "red")),
                targets=(Target(expr=f"count({gpus_up} == 0) or vector(0)"),),
            ),
            Stat(
                title="GPUs no job uses",
                description="GPUs whose monitor answers but that no rank of a known job holds.",
                w=8,
                h=4,
                thresholds=(Threshold(None, "green"), Threshold(1, "orange")),
                targets=(Target(expr=f"count({unowned} == 1) or vector(0)"),),
            ),
        ),
    )
    underused = Row(
        title="Underused nodes",
        panels=(
            Table(
                title="GPU busy per node and job (5 m mean), least busy first",
                description="Mean busy time of the GPUs one job holds on one node. A node well "
                "under the others, or under half busy, is where the job loses time.",
                w=12,
                h=9,
                targets=(
                    Target(expr=node_busy, instant=True, format="table"),
                    Target(expr=node_gpus, instant=True, format="table"),
                ),
                transformations=(
                    {"id": "merge", "options": {}},
                    {
                        "id": "organize",
                        "options": {
                            "excludeByName": {"Time": True},
                            "indexByName": {
                                "node": 0,
                                "auditor_job": 1,
                                "Value #A": 2,
                                "Value #B": 3,
                            },
                            "renameByName": {},
                        },
                    },
                ),
                overrides=(
                    _override(
                        "Value #A",
                        ("displayName", "GPU busy (5m)"),
                        ("unit", "percentunit"),
                        ("min", 0),
                        ("max", 1),
                        ("custom.cellOptions", {"mode": "basic", "type": "gauge"}),
                        ("color", {"mode": "thresholds"}),
                    ),
                    _override("Value #B", ("displayName", "GPUs")),
                    _override("node", ("links", [NODE_LINK])),
                ),
                thresholds=BUSY_THRESHOLDS,
                sort_by="GPU busy (5m)",
                sort_desc=False,
            ),
            Stat(
                title=f"Node-job pairs under {UNDERUSED_BUSY_RATIO:.0%} GPU busy",
                w=4,
                h=9,
                thresholds=(Threshold(None, "green"), Threshold(1, "orange")),
                targets=(Target(expr=f"count({node_busy} < {UNDERUSED_BUSY_RATIO}) or vector(0)"),),
            ),
            TimeSeries(
                title="GPU busy per node and job (5 m mean)",
                w=8,
                h=9,
                unit="percentunit",
                min=0,
                max=1,
                targets=(Target(expr=node_busy, legend_format="{{node}} {{auditor_job}}"),),
            ),
        ),
    )
    jobs = Row(
        title="Jobs",
        panels=(
            Table(
                title="Jobs",
                description="Ranks and imbalance come from auditor serve; GPUs, busy time and "
                "samples/s from the node endpoints.",
                w=24,
                h=7,
                targets=(
                    Target(expr=ranks, instant=True, format="table"),
                    Target(expr=sel(R.JOB_GPUS.record, JOB), instant=True, format="table"),
                    Target(
                        expr=sel(R.JOB_GPU_UTILIZATION_AVG.record, JOB),
                        instant=True,
                        format="table",
                    ),
                    Target(expr=job_samples, instant=True, format="table"),
                    Target(expr=imbalance, instant=True, format="table"),
                    Target(expr=job_speedup, instant=True, format="table"),
                ),
                transformations=(
                    {"id": "merge", "options": {}},
                    {
                        "id": "organize",
                        "options": {"excludeByName": {"Time": True}, "renameByName": {}},
                    },
                ),
                overrides=(
                    _override("Value #A", ("displayName", "ranks")),
                    _override("Value #B", ("displayName", "GPUs")),
                    _override(
                        "Value #C", ("displayName", "GPU busy (5m)"), ("unit", "percentunit")
                    ),
                    _override("Value #D", ("displayName", "samples/s"), ("decimals", 1)),
                    _override("Value #E", ("displayName", "imbalance"), ("unit", "percentunit")),
                    _override(
                        "Value #F",
                        ("displayName", "predicted speed-up"),
                        ("unit", SPEEDUP_UNIT),
                        ("decimals", 2),
                    ),
                ),
                sort_by="predicted speed-up",
            ),
            TimeSeries(
                title="Job imbalance ratio",
                description="1 - fastest/slowest step time across the job's ranks: the share "
                "of each step the least-loaded rank waits. 0 = balanced.",
                w=12,
                unit="percentunit",
                min=0,
                max=1,
                targets=(Target(expr=imbalance, legend_format="{{auditor_job}}"),),
            ),
            TimeSeries(
                title="Samples per second per job",
                w=12,
                unit="none",
                targets=(Target(expr=job_samples, legend_format="{{auditor_job}}"),),
            ),
        ),
    )
    findings = Row(title="Findings", panels=(findings_table(JOB), fixes_text()))
    serve = Row(
        title="auditor serve",
        panels=_serve_panels(),
    )
    return Dashboard(
        uid="auditor-cluster",
        title="GPU Balance Auditor: cluster",
        description="Every GPU and job the auditor sees: busy time, underused nodes, findings.",
        tags=TAGS,
        rows=(gpus, underused, jobs, findings, serve),
        variables=variables(),
        links=links(),
    )


def _serve_panels() -> tuple[Panel, ...]:
    """Health of ``auditor serve`` (its own metrics carry no training job label)."""
    up_mappings: Json = {
        "options": {
            "0": {"color": "red", "index": 0, "text": "no"},
            "1": {"color": "green", "index": 1, "text": "yes"},
        },
        "type": "value",
    }
    not_scraped = "serve not scraped"
    evaluations = f"sum(rate({C.SERVE_EVALUATIONS_TOTAL.name}[$__rate_interval])) * 60"
    failures = f"sum(rate({C.SERVE_FAILURES_TOTAL.name}[$__rate_interval])) * 60"
    return (
        Stat(
            title="Prometheus reachable",
            w=4,
            h=4,
            no_value=not_scraped,
            mappings=(up_mappings,),
            color_mode="background",
            thresholds=(Threshold(None, "red"), Threshold(1, "green")),
            targets=(Target(expr=f"max({C.SERVE_PROMETHEUS_UP.name})"),),
        ),
        Stat(
            title="Last evaluation age",
            w=4,
            h=4,
            unit="s",
            no_value=not_scraped,
            thresholds=(Threshold(None, "green"), Threshold(120, "orange"), Threshold(600, "red")),
            targets=(
                Target(
                    expr=f"time() - max({C.SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS.name})",
                ),
            ),
        ),
        Stat(
            title="Jobs evaluated",
            w=4,
            h=4,
            no_value=not_scraped,
            targets=(Target(expr=f"max({C.SERVE_JOBS.name})"),),
        ),
        Stat(
            title="Evaluation time",
            w=4,
            h=4,
            unit="s",
            no_value=not_scraped,
            targets=(Target(expr=f"max({C.SERVE_EVALUATION_SECONDS.name})"),),
        ),
        TimeSeries(
            title="Evaluations and failures per minute",
            w=8,
            h=4,
            legend_calcs=(),
            targets=(
                Target(expr=evaluations, legend_format="evaluations"),
                Target(expr=failures, legend_format="failures"),
            ),
        ),
    )


# --- one job --------------------------------------------------------------------------------------


def job_view() -> Dashboard:
    ranks_up = (
        f"count by (auditor_job) (max by (auditor_job, rank) ({sel(C.RANK_UP.name, JOB)}) == 1)"
    )
    stats = Row(
        title="Job",
        panels=(
            Stat(title="Ranks up", w=4, h=4, targets=(Target(expr=ranks_up),)),
            Stat(
                title="Samples per second",
                w=4,
                h=4,
                decimals=1,
                graph=True,
                targets=(Target(expr=sel(R.JOB_SAMPLES_RATE.record, JOB)),),
            ),
            Stat(
                title="GPU busy (5m mean)",
                w=4,
                h=4,
                unit="percentunit",
                thresholds=BUSY_THRESHOLDS,
                targets=(Target(expr=sel(R.JOB_GPU_UTILIZATION_AVG.record, JOB)),),
            ),
            Stat(
                title="GPU busy spread (busiest - idlest)",
                w=4,
                h=4,
                unit="percentunit",
                thresholds=(Threshold(None, "green"), Threshold(0.2, "orange")),
                targets=(Target(expr=sel(R.JOB_GPU_UTILIZATION_SPREAD.record, JOB)),),
            ),
            Stat(
                title="Imbalance",
                w=4,
                h=4,
                unit="percentunit",
                thresholds=(Threshold(None, "green"), Threshold(0.1, "orange")),
                targets=(
                    Target(expr=f"max by (auditor_job) ({sel(C.JOB_IMBALANCE_RATIO.name, JOB)})"),
                ),
            ),
            Stat(
                title="Predicted speed-up",
                w=4,
                h=4,
                unit=SPEEDUP_UNIT,
                decimals=2,
                targets=(
                    Target(expr=f"max by (auditor_job) ({sel(C.JOB_PREDICTED_SPEEDUP.name, JOB)})"),
                ),
            ),
        ),
    )
    ratio = R.RANK_PHASE_RATIO.record
    step = Row(
        title="Step time per rank",
        panels=(
            TimeSeries(
                title="Step time per rank",
                w=8,
                unit="s",
                targets=(
                    Target(
                        expr=sel(R.RANK_STEP_SECONDS_MEAN.record, JOB, RANK),
                        legend_format="rank {{rank}}",
                    ),
                ),
            ),
            TimeSeries(
                title="Data wait share per rank",
                description="Share of the step spent waiting for the DataLoader: a starved "
                "rank stands out here.",
                w=8,
                unit="percentunit",
                min=0,
                max=1,
                targets=(
                    Target(
                        expr=sel(ratio, JOB, RANK, 'phase="data_wait"'),
                        legend_format="rank {{rank}}",
                    ),
                ),
            ),
            TimeSeries(
                title="Collective wait share per rank",
                description="Share of the step spent waiting for the other ranks in the "
                "all-reduce. The rank that waits least is the one the others wait for.",
                w=8,
                unit="percentunit",
                min=0,
                max=1,
                targets=(
                    Target(
                        expr=sel(ratio, JOB, RANK, 'phase="collective_wait"'),
                        legend_format="rank {{rank}}",
                    ),
                ),
            ),
            _breakdown_table(),
        ),
    )
    stacked = Row(title="Step breakdown of each rank", panels=(_breakdown_panel(),))
    batches = Row(
        title="Batches",
        panels=(
            TimeSeries(
                title="Batch size per rank",
                w=12,
                targets=(
                    Target(
                        expr=sel(C.RANK_BATCH_SIZE.name, JOB, RANK),
                        legend_format="rank {{rank}}",
                    ),
                ),
            ),
            TimeSeries(
                title="Samples per second per rank",
                w=12,
                targets=(
                    Target(
                        expr=sel(R.RANK_SAMPLES_RATE.record, JOB, RANK),
                        legend_format="rank {{rank}}",
                    ),
                ),
            ),
        ),
    )
    gpu_legend = "rank {{rank}}: {{node}} gpu {{gpu}}"
    used = sel(C.GPU_MEMORY_USED_BYTES.name, JOB, OWNED, RANK)
    total = sel(C.GPU_MEMORY_TOTAL_BYTES.name, JOB, OWNED, RANK)
    gpus = Row(
        title="GPUs of the job",
        panels=(
            TimeSeries(
                title="GPU busy per GPU",
                w=8,
                unit="percentunit",
                min=0,
                max=1,
                targets=(
                    Target(
                        expr=sel(C.GPU_UTILIZATION_RATIO.name, JOB, OWNED, RANK),
                        legend_format=gpu_legend,
                    ),
                ),
            ),
            TimeSeries(
                title="GPU memory used / total per GPU",
                w=8,
                unit="percentunit",
                min=0,
                max=1,
                targets=(Target(expr=f"{used} / {total}", legend_format=gpu_legend),),
            ),
            TimeSeries(
                title="Rank device memory (allocated, reserved, peak)",
                description="What PyTorch's allocator holds on each rank's device.",
                w=8,
                unit="bytes",
                targets=(
                    Target(
                        expr=sel(
                            C.RANK_MEMORY_BYTES.name,
                            JOB,
                            RANK,
                            'memory=~"allocated|reserved|peak"',
                        ),
                        legend_format="rank {{rank}} {{memory}}",
                    ),
                ),
            ),
        ),
    )
    cpu = Row(
        title="CPU and DataLoader",
        panels=(
            TimeSeries(
                title="Rank CPU cores (main process / DataLoader workers)",
                description="1.0 = one core fully busy. workers: all the rank's DataLoader "
                "workers together.",
                w=12,
                targets=(
                    Target(
                        expr=sel(C.RANK_CPU_CORES.name, JOB, RANK),
                        legend_format="rank {{rank}} {{process}}",
                    ),
                ),
            ),
            TimeSeries(
                title="DataLoader workers (alive / configured)",
                w=12,
                overrides=(_dashed(".* configured$"),),
                targets=(
                    Target(
                        expr=sel(C.RANK_DATALOADER_WORKERS.name, JOB, RANK),
                        legend_format="rank {{rank}} alive",
                    ),
                    Target(
                        expr=sel(C.RANK_DATALOADER_CONFIG_WORKERS.name, JOB, RANK),
                        legend_format="rank {{rank}} configured",
                    ),
                ),
            ),
        ),
    )
    # rank="" is a job-wide finding: kept whichever ranks are selected.
    findings = Row(
        title="Findings of the job",
        panels=(findings_table(JOB, 'rank=~"$rank|"'), fixes_text()),
    )
    return Dashboard(
        uid="auditor-job",
        title="GPU Balance Auditor: job",
        description="One training job rank by rank: where each step's time goes, batches, "
        "GPUs, CPU and DataLoader workers, findings. Pick one job.",
        tags=TAGS,
        rows=(stats, step, stacked, batches, gpus, cpu, findings),
        variables=variables(),
        links=links(),
    )


def _breakdown_panel() -> TimeSeries:
    """The stacked step breakdown, repeated for each selected rank; the stack sums to the
    measured part of the step and the dashed line is the whole step."""
    targets = [
        Target(expr=phase(name, JOB, RANK), legend_format=PHASE_TITLES[name]) for name in PHASES
    ]
    targets.append(
        Target(expr=sel(R.RANK_STEP_SECONDS_MEAN.record, JOB, RANK), legend_format="step time")
    )
    return TimeSeries(
        title="Step breakdown: rank $rank",
        description="Mean seconds per step in each phase (1 m). The phases are exclusive "
        "(backward excludes the collective wait inside it); the dashed line is the whole step.",
        w=12,
        h=8,
        unit="s",
        stack=True,
        fill=60,
        repeat="rank",
        max_per_row=2,
        legend_calcs=("lastNotNull",),
        legend_placement="right",
        overrides=(_dashed("^step time$"),),
        targets=tuple(targets),
    )


def _breakdown_table() -> Table:
    """Latest seconds per step of each phase: a row per rank, a column per phase."""
    columns = ["rank\\phase", *PHASES]
    return Table(
        title="Step breakdown by rank (seconds per step, 1 m mean)",
        description="backward (compute) excludes the collective wait inside backward.",
        w=24,
        h=8,
        unit="s",
        decimals=3,
        targets=(Target(expr=phase_breakdown(JOB, RANK), instant=True, format="table"),),
        transformations=(
            {
                "id": "groupingToMatrix",
                "options": {"columnField": "phase", "rowField": "rank", "valueField": "Value"},
            },
            {
                "id": "organize",
                "options": {
                    "excludeByName": {},
                    "indexByName": {name: i for i, name in enumerate(columns)},
                    "renameByName": {
                        "rank\\phase": "rank",
                        **{p: PHASE_TITLES[p] for p in PHASES},
                    },
                },
            },
        ),
        sort_by="rank",
        sort_desc=False,
    )


# --- one node -------------------------------------------------------------------------------------


def node_view() -> Dashboard:
    def gpu(metric: str, *matchers: str) -> str:
        return f"max by (node, gpu) ({sel(metric, NODE, *matchers)})"

    legend = "{{node}} gpu {{gpu}}"
    inventory = f"max by (node, gpu, model, uuid, auditor_job, rank) ({sel(C.GPU_UP.name, NODE)})"
    gpus = Row(
        title="GPUs of the node",
        panels=(
            Table(
                title="GPUs and their owners",
                description="Each GPU's model and the job and rank using it (empty: none).",
                w=24,
                h=6,
                targets=(Target(expr=inventory, instant=True, format="table"),),
                transformations=(
                    {
                        "id": "organize",
                        "options": {
                            "excludeByName": {"Time": True},
                            "indexByName": {
                                "node": 0,
                                "gpu": 1,
                                "model": 2,
                                "auditor_job": 3,
                                "rank": 4,
                                "uuid": 5,
                                "Value": 6,
                            },
                            "renameByName": {"Value": "monitor up"},
                        },
                    },
                ),
                sort_by="gpu",
                sort_desc=False,
            ),
            TimeSeries(
                title="GPU busy",
                w=12,
                unit="percentunit",
                min=0,
                max=1,
                targets=(Target(expr=gpu(C.GPU_UTILIZATION_RATIO.name), legend_format=legend),),
            ),
            TimeSeries(
                title="GPU memory used and installed",
                w=12,
                unit="bytes",
                overrides=(_dashed(".* total$"),),
                targets=(
                    Target(expr=gpu(C.GPU_MEMORY_USED_BYTES.name), legend_format=legend + " used"),
                    Target(
                        expr=gpu(C.GPU_MEMORY_TOTAL_BYTES.name), legend_format=legend + " total"
                    ),
                ),
            ),
            TimeSeries(
                title="Clocks vs maximum (SM and memory)",
                description="Current clock as a share of the GPU's maximum: a GPU held well "
                "below its peers is throttled (see the reasons).",
                w=12,
                unit="percentunit",
                min=0,
                targets=(
                    Target(
                        expr=(
                            f"{gpu(C.GPU_SM_CLOCK_HERTZ.name)}"
                            f" / {gpu(C.GPU_SM_CLOCK_MAX_HERTZ.name)}"
                        ),
                        legend_format=legend + " SM",
                    ),
                    Target(
                        expr=(
                            f"{gpu(C.GPU_MEMORY_CLOCK_HERTZ.name)}"
                            f" / {gpu(C.GPU_MEMORY_CLOCK_MAX_HERTZ.name)}"
                        ),
                        legend_format=legend + " memory",
                    ),
                ),
            ),
            TimeSeries(
                title="Throttle reasons active",
                description="1 while NVML reports the clock-event reason active; gpu_idle is "
                "normal for an idle GPU.",
                w=12,
                min=0,
                max=1,
                targets=(
                    Target(
                        expr=(
                            "max by (node, gpu, reason) "
                            f"({sel(C.GPU_THROTTLE_ACTIVE.name, NODE)}) > 0"
                        ),
                        legend_format=legend + ": {{reason}}",
                    ),
                ),
            ),
            TimeSeries(
                title="Power draw vs limit",
                w=12,
                unit="watt",
                overrides=(_dashed(".* limit$"),),
                targets=(
                    Target(expr=gpu(C.GPU_POWER_WATTS.name), legend_format=legend),
                    Target(expr=gpu(C.GPU_POWER_LIMIT_WATTS.name), legend_format=legend + " limit"),
                ),
            ),
            TimeSeries(
                title="Temperature",
                w=12,
                unit="celsius",
                targets=(Target(expr=gpu(C.GPU_TEMPERATURE_CELSIUS.name), legend_format=legend),),
            ),
        ),
    )

    def host(metric: str) -> str:
        # One series per node whichever job's agent exported it.
        return f"max by (node) ({sel(metric, NODE)})"

    cpu = Row(
        title="CPU of the node",
        panels=(
            TimeSeries(
                title="CPU cores: available vs busy",
                w=12,
                overrides=(_dashed(".* cores$"),),
                targets=(
                    Target(expr=host(C.NODE_CPU_BUSY_CORES.name), legend_format="{{node}} busy"),
                    Target(expr=host(C.NODE_CPU_CORES.name), legend_format="{{node}} cores"),
                ),
            ),
            TimeSeries(
                title="Load average (1 m) vs cores",
                w=12,
                overrides=(_dashed(".* cores$"),),
                targets=(
                    Target(expr=host(C.NODE_LOAD1.name), legend_format="{{node}} load1"),
                    Target(expr=host(C.NODE_CPU_CORES.name), legend_format="{{node}} cores"),
                ),
            ),
        ),
    )
    rank_legend = "{{auditor_job}} rank {{rank}}"
    loaders = Row(
        title="Ranks and DataLoaders on the node",
        panels=(
            TimeSeries(
                title="DataLoader workers per rank",
                w=8,
                targets=(
                    Target(
                        expr=sel(C.RANK_DATALOADER_WORKERS.name, NODE, JOB),
                        legend_format=rank_legend,
                    ),
                ),
            ),
            TimeSeries(
                title="DataLoader worker CPU cores per rank",
                description="All the rank's workers together; 1.0 = one core fully busy.",
                w=8,
                targets=(
                    Target(
                        expr=sel(C.RANK_CPU_CORES.name, NODE, JOB, 'process="workers"'),
                        legend_format=rank_legend,
                    ),
                ),
            ),
            TimeSeries(
                title="Main process CPU cores per rank",
                w=8,
                targets=(
                    Target(
                        expr=sel(C.RANK_CPU_CORES.name, NODE, JOB, 'process="main"'),
                        legend_format=rank_legend,
                    ),
                ),
            ),
        ),
    )
    findings = Row(
        title="Findings on the node",
        panels=(findings_table(JOB, NODE), fixes_text()),
    )
    return Dashboard(
        uid="auditor-node",
        title="GPU Balance Auditor: node",
        description="One node: its GPUs (busy, memory, clocks, power, temperature, throttling), "
        "its CPU, and the DataLoader workers of the ranks it runs.",
        tags=TAGS,
        rows=(gpus, cpu, loaders, findings),
        variables=variables(),
        links=links(),
    )


DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "auditor-cluster": cluster_overview,
    "auditor-job": job_view,
    "auditor-node": node_view,
}
