"""What the three dashboards share: the label matchers, the query builders, the variables and
links, the findings and fixes tables, and the small constructors that turn a (query, legend) list
into a panel.

Every query names catalog metrics (``C.X.name``) or recorded series (``R.X.record``), never a
literal metric name, so a renamed metric breaks the build here rather than a panel in production.
Template variables only ever appear in ``=~`` matchers; their All value is ``.*``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from auditor.metrics import catalog as C
from auditor.ops import recording as R
from auditor.ops.grafana import (
    DatasourceVariable,
    Json,
    Link,
    QueryVariable,
    Stat,
    Table,
    Target,
    Threshold,
    TimeSeries,
)

TAGS = ("auditor", "gpu")
# The uid of the data source dashboards/provisioning creates (auditor/ops/render.py).
DATASOURCE_UID = "auditor-prometheus"
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

# A share of the whole, from 0 to 1 (TimeSeries/Stat keyword arguments).
PERCENT: dict[str, Any] = {"unit": "percentunit", "min": 0, "max": 1}


# --- queries --------------------------------------------------------------------------------------


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


def max_by(labels: str, expr: str) -> str:
    """``max by (labels) (expr)``: one series per value of ``labels`` whichever target sent it."""
    return f"max by ({labels}) ({expr})"


# --- panels ---------------------------------------------------------------------------------------


def series(title: str, *queries: tuple[str, str], **options: Any) -> TimeSeries:
    """A time series of ``(expr, legend)`` queries; ``options`` are the panel's other fields."""
    return TimeSeries(
        title=title,
        targets=tuple(Target(expr=expr, legend_format=legend) for expr, legend in queries),
        **options,
    )


def stat(title: str, expr: str, **options: Any) -> Stat:
    """A 4 x 4 stat of one query (``options`` may change the size)."""
    return Stat(title=title, **{"w": 4, "h": 4, **options}, targets=(Target(expr=expr),))


def instant(expr: str) -> Target:
    """An instant query whose result is a table (one row per series, labels as columns)."""
    return Target(expr=expr, instant=True, format="table")


def organize(
    exclude: Sequence[str] = (),
    order: Sequence[str] | None = None,
    rename: dict[str, str] | None = None,
) -> Json:
    """The ``organize`` transformation: hide ``exclude``, put the columns in ``order``, rename."""
    options: Json = {"excludeByName": {name: True for name in exclude}}
    if order is not None:
        options["indexByName"] = {name: i for i, name in enumerate(order)}
    options["renameByName"] = dict(rename or {})
    return {"id": "organize", "options": options}


MERGE: Json = {"id": "merge", "options": {}}


def override(name: str, *properties: tuple[str, object]) -> Json:
    """Field properties for the column or series named ``name``."""
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": pid, "value": value} for pid, value in properties],
    }


def dashed(regex: str) -> Json:
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
# Colour bands of MFU: red under a twentieth of the peak (where AuditorUnderusedMultiGpuNode
# judges a node underused), green from what tuned transformer training reaches.
MFU_THRESHOLDS = (
    Threshold(None, "red"),
    Threshold(0.05, "yellow"),
    Threshold(0.3, "green"),
)
# What the MFU panels say about a missing value: not measured, never zero.
MFU_NOT_MEASURED = (
    "No value where it is not measured: a CPU rank (FLOP/s only), a GPU the peak table does not "
    "know, or no step counted yet."
)


def alarm_from(value: float, color: str) -> tuple[Threshold, ...]:
    """Green below ``value``, ``color`` from it up."""
    return (Threshold(None, "green"), Threshold(value, color))


SEVERITY_MAPPINGS: Json = {
    "options": {
        "critical": {"color": "red", "index": 0, "text": "critical"},
        "warning": {"color": "orange", "index": 1, "text": "warning"},
        "info": {"color": "blue", "index": 2, "text": "info"},
    },
    "type": "value",
}


# --- what every dashboard has ---------------------------------------------------------------------


def variables() -> tuple[DatasourceVariable | QueryVariable, ...]:
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
    )


def links() -> tuple[Link, ...]:
    return (Link(title="Auditor dashboards", tags=("auditor",), include_vars=True, keep_time=True),)


def findings_table(*matchers: str, w: int = 16, h: int = 9) -> Table:
    """The current findings (job, kind, severity, rank, node) with their predicted speed-up.

    Two instant queries merged on their shared labels; the speed-up query keeps only findings the
    first one selected (``and on``), so a filter on node or rank holds for both columns.
    """
    finding = max_by("auditor_job, kind, rank, node, severity", sel(C.FINDING.name, *matchers))
    speedup_matchers = tuple(m for m in matchers if not m.startswith("node"))
    speedup = (
        max_by("auditor_job, kind, rank", sel(C.FINDING_PREDICTED_SPEEDUP.name, *speedup_matchers))
        + f" and on (auditor_job, kind, rank) {finding}"
    )
    return Table(
        title="Current findings",
        description="One row per blamed rank (rank empty: the whole job). What to change on each "
        "rank is in the table below.",
        w=w,
        h=h,
        targets=(instant(finding), instant(speedup)),
        transformations=(
            MERGE,
            organize(
                exclude=("Time", "Value #A"),
                order=("auditor_job", "kind", "severity", "rank", "node", "Value #B"),
            ),
        ),
        overrides=(
            override(
                "Value #B",
                ("displayName", "predicted speed-up"),
                ("unit", SPEEDUP_UNIT),
                ("decimals", 2),
            ),
            override(
                "severity",
                ("mappings", [SEVERITY_MAPPINGS]),
                ("custom.cellOptions", {"type": "color-text"}),
            ),
            override("node", ("links", [NODE_LINK])),
            override("rank", ("links", [RANK_LINK])),
        ),
        sort_by="predicted speed-up",
        no_value="no findings",
    )


def fixes_table(*matchers: str, w: int = 24, h: int = 8) -> Table:
    """What to change on each blamed rank: the ``fix`` words of ``auditor_finding_fix_info``, one
    row per finding and rank (its levers folded into the words), read from Prometheus like every
    other panel, so the one thing an operator came for needs no other port. Rank empty: a GPU
    no rank owns."""
    fixes = max_by("auditor_job, kind, rank, node, fix", sel(C.FINDING_FIX_INFO.name, *matchers))
    return Table(
        title="What to change, per rank",
        description="The change the auditor proposes for each blamed rank, with the speed-up to "
        "expect where it is predicted (auditor_finding_fix_info; the same words as the verdict "
        "of auditor run and the JSON of auditor serve).",
        w=w,
        h=h,
        targets=(instant(fixes),),
        transformations=(
            organize(
                exclude=("Time", "Value"),
                order=("auditor_job", "rank", "node", "kind", "fix"),
            ),
        ),
        overrides=(
            override(
                "fix",
                ("displayName", "what to change"),
                ("custom.cellOptions", {"type": "auto", "wrapText": True}),
            ),
            override("auditor_job", ("custom.width", 160)),
            override("rank", ("custom.width", 60), ("links", [RANK_LINK])),
            override("node", ("custom.width", 120), ("links", [NODE_LINK])),
            override("kind", ("custom.width", 170)),
        ),
        sort_by="rank",
        sort_desc=False,
        no_value="nothing to change",
    )
