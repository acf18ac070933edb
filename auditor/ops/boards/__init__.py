"""The three Grafana dashboards: cluster overview (:mod:`.cluster`), one job (:mod:`.job`), one
node (:mod:`.node`); what they share is :mod:`.common`.

Series from several scrape targets (``auditor serve`` and node endpoints both export findings; an
agent restart starts a new series) are folded with ``max by (...)`` over the labels a panel shows,
so a panel never shows two rows for one thing.
"""

from __future__ import annotations

from collections.abc import Callable

from auditor.ops.boards.cluster import cluster_overview
from auditor.ops.boards.common import (
    DATASOURCE_UID,
    JOB,
    NODE,
    PHASE_TITLES,
    RANK,
    phase,
    phase_breakdown,
    sel,
)
from auditor.ops.boards.job import job_view
from auditor.ops.boards.node import node_view
from auditor.ops.grafana import Dashboard

__all__ = [
    "DASHBOARDS",
    "DATASOURCE_UID",
    "JOB",
    "NODE",
    "PHASE_TITLES",
    "RANK",
    "cluster_overview",
    "job_view",
    "node_view",
    "phase",
    "phase_breakdown",
    "sel",
]

DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "auditor-cluster": cluster_overview,
    "auditor-job": job_view,
    "auditor-node": node_view,
}
