"""``auditor_finding_memory_full_seconds``: a climbing rank's projected time to full, exported
from the run's endpoint beside its finding, so the alert and dashboards read it; nothing where
no time is projected."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from auditor.analysis.rules import memory_growth
from auditor.metrics import catalog as C
from auditor.metrics.exporter import make_registry
from auditor.metrics.state import ExportState
from tests.helpers.growth import FLAT, growth_snapshot, host_budget, leak
from tests.helpers.units import GIB, MIB


def _series(state: ExportState) -> dict[str, float]:
    text = generate_latest(make_registry(lambda: state)).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == C.FINDING_MEMORY_FULL_SECONDS.name:
                labels = sample.labels
                assert labels["kind"] == "memory_growth" and labels["auditor_job"] == "train"
                out[labels["rank"]] = sample.value
    return out


def test_each_climbing_rank_exports_its_time_to_full() -> None:
    snap = growth_snapshot(
        {0: leak(2 * MIB), 1: leak(1 * MIB), 2: FLAT},
        flush=10,
        budgets={0: host_budget(0, available=16 * GIB, at_step=599)},
        host="h0",
    )
    findings = memory_growth.RULE(snap)
    state = ExportState(job="train", node="h0", findings=findings)
    got = _series(state)
    # Rank 0: a budget gives its capacity (it fills the host with rank 1); rank 1 has none and
    # projects no time: no series, never a zero.
    (climbing,) = [f for f in findings if 0 in f.ranks]
    assert got == {"0": climbing.facts.ranks[0].full_in_s}
    assert got["0"] == pytest.approx(16 * GIB / (60 * MIB))


def test_no_finding_no_series() -> None:
    assert _series(ExportState(job="train", node="h0", findings=[])) == {}
