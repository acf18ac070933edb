"""The cluster overview: every GPU and job the auditor sees, underused nodes, findings, and the
health of ``auditor serve``."""

from __future__ import annotations

from auditor.metrics import catalog as C
from auditor.ops import recording as R
from auditor.ops.boards.common import (
    BUSY_THRESHOLDS,
    JOB,
    MERGE,
    NODE,
    NODE_LINK,
    PERCENT,
    SPEEDUP_UNIT,
    TAGS,
    UNDERUSED_BUSY_RATIO,
    alarm_from,
    findings_table,
    fixes_table,
    instant,
    links,
    max_by,
    organize,
    override,
    sel,
    series,
    stat,
    variables,
)
from auditor.ops.grafana import (
    Dashboard,
    Heatmap,
    Json,
    Panel,
    Row,
    Table,
    Target,
    Threshold,
)


def _gpu(expr: str) -> str:
    return max_by("node, gpu", expr)


def cluster_overview() -> Dashboard:
    return Dashboard(
        uid="auditor-cluster",
        title="GPU Balance Auditor: cluster",
        description="Every GPU and job the auditor sees: busy time, underused nodes, findings.",
        tags=TAGS,
        rows=(
            _gpus(),
            _underused(),
            _jobs(),
            Row(title="Findings", panels=(findings_table(JOB, w=24, h=7), fixes_table(JOB))),
            Row(title="auditor serve", panels=_serve_panels()),
        ),
        variables=variables(),
        links=links(),
    )


def _gpus() -> Row:
    gpus_up = _gpu(sel(C.GPU_UP.name, JOB, NODE))
    unowned = _gpu(sel(C.GPU_UP.name, 'auditor_job=""', NODE))
    # (title, description, the GPUs counted, what colours the count)
    counts: tuple[tuple[str, str, str, tuple[Threshold, ...]], ...] = (
        ("GPUs reporting", "", f"{gpus_up} == 1", ()),
        ("GPUs down (monitor unreachable)", "", f"{gpus_up} == 0", alarm_from(1, "red")),
        (
            "GPUs no job uses",
            "GPUs whose monitor answers but that no rank of a known job holds.",
            f"{unowned} == 1",
            alarm_from(1, "orange"),
        ),
    )
    return Row(
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
                        expr=_gpu(sel(C.GPU_UTILIZATION_RATIO.name, JOB, NODE)),
                        legend_format="{{node}} gpu {{gpu}}",
                    ),
                ),
            ),
            *(
                stat(title, f"count({gpus}) or vector(0)", w=8, description=d, thresholds=t)
                for title, d, gpus, t in counts
            ),
        ),
    )


def _underused() -> Row:
    node_busy = sel(R.NODE_JOB_GPU_UTILIZATION_AVG.record, JOB, NODE)
    node_gpus = sel(R.NODE_JOB_GPUS.record, JOB, NODE)
    return Row(
        title="Underused nodes",
        panels=(
            Table(
                title="GPU busy per node and job (5 m mean), least busy first",
                description="Mean busy time of the GPUs one job holds on one node. A node well "
                "under the others, or under half busy, is where the job loses time.",
                w=12,
                h=9,
                targets=(instant(node_busy), instant(node_gpus)),
                transformations=(
                    MERGE,
                    organize(
                        exclude=("Time",), order=("node", "auditor_job", "Value #A", "Value #B")
                    ),
                ),
                overrides=(
                    override(
                        "Value #A",
                        ("displayName", "GPU busy (5m)"),
                        ("unit", "percentunit"),
                        ("min", 0),
                        ("max", 1),
                        ("custom.cellOptions", {"mode": "basic", "type": "gauge"}),
                        ("color", {"mode": "thresholds"}),
                    ),
                    override("Value #B", ("displayName", "GPUs")),
                    override("node", ("links", [NODE_LINK])),
                ),
                thresholds=BUSY_THRESHOLDS,
                sort_by="GPU busy (5m)",
                sort_desc=False,
            ),
            stat(
                f"Node-job pairs under {UNDERUSED_BUSY_RATIO:.0%} GPU busy",
                f"count({node_busy} < {UNDERUSED_BUSY_RATIO}) or vector(0)",
                h=9,
                thresholds=alarm_from(1, "orange"),
            ),
            series(
                "GPU busy per node and job (5 m mean)",
                (node_busy, "{{node}} {{auditor_job}}"),
                w=8,
                h=9,
                **PERCENT,
            ),
        ),
    )


def _jobs() -> Row:
    imbalance = max_by("auditor_job", sel(C.JOB_IMBALANCE_RATIO.name, JOB))
    job_samples = sel(R.JOB_SAMPLES_RATE.record, JOB)
    # The table's columns: its query, and the column's name and field properties.
    columns: tuple[tuple[str, str, tuple[tuple[str, object], ...]], ...] = (
        (max_by("auditor_job", sel(C.JOB_RANKS.name, JOB)), "ranks", ()),
        (sel(R.JOB_GPUS.record, JOB), "GPUs", ()),
        (
            sel(R.JOB_GPU_UTILIZATION_AVG.record, JOB),
            "GPU busy (5m)",
            (("unit", "percentunit"),),
        ),
        (job_samples, "samples/s", (("decimals", 1),)),
        (imbalance, "imbalance", (("unit", "percentunit"),)),
        (
            max_by("auditor_job", sel(C.JOB_PREDICTED_SPEEDUP.name, JOB)),
            "predicted speed-up",
            (("unit", SPEEDUP_UNIT), ("decimals", 2)),
        ),
    )
    return Row(
        title="Jobs",
        panels=(
            Table(
                title="Jobs",
                description="Ranks and imbalance come from auditor serve; GPUs, busy time and "
                "samples/s from the node endpoints.",
                w=24,
                h=7,
                targets=tuple(instant(expr) for expr, _, _ in columns),
                transformations=(MERGE, organize(exclude=("Time",))),
                overrides=tuple(
                    override(f"Value #{chr(ord('A') + i)}", ("displayName", name), *properties)
                    for i, (_, name, properties) in enumerate(columns)
                ),
                sort_by="predicted speed-up",
            ),
            series(
                "Job imbalance ratio",
                (imbalance, "{{auditor_job}}"),
                description="1 - fastest/slowest step time across the job's ranks: the share "
                "of each step the least-loaded rank waits. 0 = balanced.",
                w=12,
                **PERCENT,
            ),
            series(
                "Samples per second per job",
                (job_samples, "{{auditor_job}}"),
                w=12,
                unit="none",
            ),
        ),
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
    per_minute = "sum(rate({}[$__rate_interval])) * 60"
    return (
        stat(
            "Prometheus reachable",
            f"max({C.SERVE_PROMETHEUS_UP.name})",
            no_value=not_scraped,
            mappings=(up_mappings,),
            color_mode="background",
            thresholds=(Threshold(None, "red"), Threshold(1, "green")),
        ),
        stat(
            "Last evaluation age",
            f"time() - max({C.SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS.name})",
            unit="s",
            no_value=not_scraped,
            thresholds=(Threshold(None, "green"), Threshold(120, "orange"), Threshold(600, "red")),
        ),
        stat("Jobs evaluated", f"max({C.SERVE_JOBS.name})", no_value=not_scraped),
        stat(
            "Evaluation time",
            f"max({C.SERVE_EVALUATION_SECONDS.name})",
            unit="s",
            no_value=not_scraped,
        ),
        series(
            "Evaluations and failures per minute",
            (per_minute.format(C.SERVE_EVALUATIONS_TOTAL.name), "evaluations"),
            (per_minute.format(C.SERVE_FAILURES_TOTAL.name), "failures"),
            w=8,
            h=4,
            legend_calcs=(),
        ),
    )
