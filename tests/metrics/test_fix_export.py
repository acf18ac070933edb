"""``auditor_finding_fix_info``: each finding's fix for each rank, exported from the run's
endpoint and from ``auditor serve`` alike, with the words the verdict prints, so Grafana and the
alert annotations read what to change on which rank from Prometheus alone.

The findings are the real ones the rules reach on the recorded scenarios in ``tests/data``."""

from __future__ import annotations

import subprocess
from functools import cache

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.audit import Audit, Verdict
from auditor.metrics import catalog as C
from auditor.metrics.exporter import (
    FIX_VALUE_MAX,
    FIX_WORDS_MAX,
    SeriesSet,
    add_findings,
    make_registry,
    registry_for,
)
from auditor.metrics.state import ExportState
from auditor.report.phrasing import phrase
from auditor.service import http
from auditor.service.service import Health, Published
from auditor.telemetry.recorded import read_recording
from tests.helpers.tools import require_tool

SCENARIOS = ("input_bound_4gpu", "throttled_gpu", "idle_allocated_gpu", "dp_batch_30_over_4")
Labels = dict[str, str]


@cache
def verdict(scenario: str) -> Verdict:
    rec = read_recording(f"tests/data/{scenario}/recording.jsonl")
    audit = Audit(rec.job)
    audit.add(rec.batch)
    now = audit.store.latest_time()
    assert now is not None
    _, judged = audit.judge(now)
    assert judged.findings, scenario
    return judged


def fix_series(text: str) -> list[Labels]:
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == C.FINDING_FIX_INFO.name:
                assert sample.value == 1.0
                out.append(dict(sample.labels))
    return out


def node_endpoint_text(v: Verdict) -> str:
    state = ExportState(job=v.job, node="gpu-node-07", findings=list(v.findings))
    return generate_latest(make_registry(lambda: state)).decode()


def serve_text(*verdicts: Verdict) -> str:
    published = Published(results={v.job: v for v in verdicts}, health=Health())
    return generate_latest(http.make_registry(lambda: published)).decode()


def expected(v: Verdict) -> list[Labels]:
    """One series per (kind, rank, lever), the rule's first fix of each; the words of the
    verdict (the rank's fix, or for a GPU no rank owns the finding's note)."""
    out: list[Labels] = []
    seen: set[tuple[str, str, str]] = set()
    for f in v.findings:
        said = phrase(f)
        for fix in f.fixes:
            rank = "" if fix.rank is None else str(fix.rank)
            if (f.kind, rank, fix.lever) in seen:
                continue
            seen.add((f.kind, rank, fix.lever))
            words = said.fixes[fix.rank] if fix.rank is not None else said.notes["fix"]
            out.append(
                {
                    "auditor_job": v.job,
                    "kind": f.kind,
                    "rank": rank,
                    "node": "" if fix.rank is None else v.nodes.get(fix.rank, ""),
                    "lever": fix.lever,
                    "current": "" if fix.current is None else _value(fix.current),
                    "proposed": "" if fix.proposed is None else _value(fix.proposed),
                    "fix": str(words),
                }
            )
    return out


def _value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _key(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_serve_exports_every_fix_with_the_verdicts_words(scenario: str) -> None:
    v = verdict(scenario)
    got = fix_series(serve_text(v))
    assert sorted(map(_key, got)) == sorted(map(_key, expected(v)))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_run_endpoint_exports_the_same_fixes(scenario: str) -> None:
    v = verdict(scenario)
    got = fix_series(node_endpoint_text(v))
    # This state holds no rank's info, so no rank has a node to name.
    want = [{**labels, "node": ""} for labels in expected(v)]
    assert sorted(map(_key, got)) == sorted(map(_key, want))


def test_the_starved_ranks_fix_reads_as_in_the_verdict() -> None:
    got = fix_series(serve_text(verdict("input_bound_4gpu")))
    assert {s["rank"] for s in got} == {"0", "1", "2", "3"}
    rank1 = next(s for s in got if s["rank"] == "1")
    assert rank1["kind"] == "data_starvation" and rank1["lever"] == "num_workers"
    assert (rank1["current"], rank1["proposed"]) == ("8", "24")
    assert rank1["fix"] == "num_workers 8 -> 24; expect about 2.1x"


def test_a_gpu_no_rank_owns_is_named_by_the_findings_note() -> None:
    (idle,) = fix_series(serve_text(verdict("idle_allocated_gpu")))
    assert idle["rank"] == "" and idle["node"] == ""
    assert idle["kind"] == "idle_device" and idle["lever"] == "stray_process"
    assert idle["current"] == "39127"
    assert "kill 39127" in idle["fix"]


def test_one_series_per_kind_rank_and_lever_the_first_wins() -> None:
    """dp_batch_30_over_4 proposes two batch sizes for rank 0 (32, or 28): the first one is the
    series; the words hold both."""
    got = fix_series(serve_text(verdict("dp_batch_30_over_4")))
    batch = [s for s in got if s["lever"] == "batch_size"]
    assert len(batch) == 1 and batch[0]["proposed"] == "32"
    assert "32" in batch[0]["fix"] and "28" in batch[0]["fix"]
    keys = [(s["auditor_job"], s["kind"], s["rank"], s["lever"]) for s in got]
    assert len(keys) == len(set(keys))


def test_a_lever_on_several_findings_is_a_series_per_finding() -> None:
    """throttled_gpu: hardware_straggler and the utilization_imbalance it explains name the same
    levers on rank 2; each finding kind keeps its own series (the alert and the table fold them
    by words)."""
    got = fix_series(serve_text(verdict("throttled_gpu")))
    kinds = {s["kind"] for s in got if s["lever"] == "device"}
    assert kinds == {"hardware_straggler", "utilization_imbalance"}
    assignment = next(s for s in got if s["lever"] == "gpu_assignment")
    assert assignment["current"] == "GPU-7b87a9e2-5fef-e911-ff22-a27b02c7bff2"


def test_series_stay_bounded_and_short() -> None:
    for scenario in SCENARIOS:
        for s in fix_series(serve_text(verdict(scenario))):
            assert len(s["current"]) <= FIX_VALUE_MAX and len(s["proposed"]) <= FIX_VALUE_MAX
            assert len(s["fix"]) <= FIX_WORDS_MAX
            assert s["lever"] in C.LABEL_VALUES["lever"]


def test_long_values_are_cut_and_values_are_labels() -> None:
    fix = Fix("rank_work", 0, current="x" * 100, proposed=0.123456789)
    finding = Finding("compute_straggler", "warning", (0,), fixes=(fix,))
    out = SeriesSet()
    add_findings(out, "j", [finding], lambda r: "n1")
    registry_text = generate_latest(make_registry_of(out)).decode()
    (s,) = fix_series(registry_text)
    assert s["current"] == "x" * (FIX_VALUE_MAX - 3) + "..."
    assert s["proposed"] == "0.1235"
    assert s["fix"] == ""  # a finding built without facts has no words; the values remain


def test_a_finding_without_fixes_exports_no_fix() -> None:
    out = SeriesSet()
    add_findings(out, "j", [Finding("utilization_imbalance", "info", (1,))], lambda r: "n1")
    assert not fix_series(generate_latest(make_registry_of(out)).decode())


def test_promtool_finds_no_problems_with_the_fix_series() -> None:
    text = serve_text(*(verdict(s) for s in SCENARIOS))
    assert fix_series(text)
    proc = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def make_registry_of(out: SeriesSet) -> CollectorRegistry:
    families = list(out.families())
    return registry_for(lambda: families)
