"""``compare``: two reports side by side, the measured against the predicted speed-up."""

from __future__ import annotations

import json
from typing import Any

import pytest

from auditor.analysis import analyze
from auditor.report.compare import (
    SCHEMA,
    compare_reports,
    diff_findings,
    job_step,
    predicting_finding,
    render_compare,
)
from auditor.report.json_report import build_report
from auditor.report.model import ReportFinding
from tests.helpers.jobs import JobBuilder, balanced, with_rank


def finding(kind: str, ranks: list[int], severity: str, speedup: float | None) -> dict[str, Any]:
    return {
        "kind": kind,
        "severity": severity,
        "ranks": ranks,
        "summary": f"{kind} on {ranks}",
        "evidence": {},
        "fixes": {str(r): "do something" for r in ranks},
        "predicted_speedup": speedup,
        "cause": None,
    }


def rank(r: int, step: float | None, **kw: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": r,
        "host": "vm",
        "step_s": step,
        "data_wait_s": 0.0,
        "h2d_s": 0.0,
        "forward_s": None if step is None else step * 0.25,
        "backward_s": None if step is None else step * 0.75,
        "optimizer_s": 0.0,
        "collective_wait_s": None if step is None else step * 0.5,
        "batch_size": 32,
        "samples_per_s": None if not step else 32 / step,
        "loader": {"num_workers": 1, "batch_size": 32, "pin_memory": False},
    }
    entry.update(kw)
    return entry


def report(ranks: list[dict[str, Any]], findings: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "auditor.report/v1",
        "job": {"name": "starved_rank", "world_size": len(ranks), "parallel_mode": "ddp"},
        "ranks": ranks,
        "findings": findings,
        "notes": [],
    }


BEFORE = report(
    [
        rank(0, 0.136),
        rank(
            1, 0.140, data_wait_s=0.117, forward_s=0.012, collective_wait_s=0.001, backward_s=0.01
        ),
    ],
    [
        finding("data_starvation", [1], "critical", 5.6),
        finding("utilization_imbalance", [1], "warning", 5.6),
        finding("compute_straggler", [0], "info", 9.0),  # info: promises nothing
        finding("batch_split", [0], "warning", None),
    ],
)
AFTER = report(
    [
        rank(0, 0.0305, loader={"num_workers": 10, "batch_size": 32, "pin_memory": False}),
        rank(1, 0.0300, loader={"num_workers": 10, "batch_size": 32, "pin_memory": False}),
    ],
    [
        finding("batch_split", [0], "info", None),
        finding("cpu_oversubscription", [1], "warning", None),
    ],
)


def test_measured_against_predicted() -> None:
    result = compare_reports(BEFORE, AFTER, before_source="b.json", after_source="a.json")
    assert result["schema"] == SCHEMA
    speed = result["speedup"]
    # The slowest rank's median step: 140 ms before, 30.5 ms after.
    assert speed["measured"] == pytest.approx(0.140 / 0.0305, abs=1e-3)
    assert speed["predicted"] == 5.6
    assert speed["predicted_by"] == {
        "kind": "data_starvation",
        "ranks": [1],
        "severity": "critical",
    }
    assert result["before"]["step_s"] == 0.14 and result["before"]["step_rank"] == 1
    assert result["after"]["step_rank"] == 0
    json.dumps(result, allow_nan=False)


def _timed(r: dict[str, Any], steps: int, steps_s: float) -> dict[str, Any]:
    """``r`` with a time account: ``steps`` steps that took ``steps_s`` seconds in all."""
    account = {"wall_s": steps_s + 3.0, "startup_s": 2.0, "steps": steps, "teardown_s": 1.0}
    return {**r, "time": {**account, "data_wait_s": steps_s / 2, "forward_s": steps_s / 2}}


def test_runs_with_a_time_account_compare_their_pace_not_their_median() -> None:
    # BEFORE's workers start anew at every epoch: a median step of 119 ms (most of the step's
    # duration-weighted time sits on the epochs' first steps), 40 ms a step over the run;
    # AFTER keeps them: 22 ms either way. The run got 1.8x faster, not 5.4x.
    before = report([_timed(rank(r, 0.119), 200, 8.0) for r in (0, 1)], [])
    after = report([_timed(rank(r, 0.022), 360, 7.92) for r in (0, 1)], [])
    speed = compare_reports(before, after)["speedup"]
    assert speed["step_basis"] == "run_pace"
    assert speed["measured"] == pytest.approx((8.0 / 200) / (7.92 / 360), abs=1e-3)
    assert speed["throughput_ratio"] == pytest.approx(speed["measured"], abs=1e-3)
    text = " ".join(render_compare(compare_reports(before, after)).split())
    assert "(40.0 ms -> 22.0 ms per step, slowest rank, over its steps)" in text
    # One report without an account (an older one): both compare their medians.
    speed = compare_reports(report([rank(0, 0.119)], []), after)["speedup"]
    assert speed["step_basis"] == "median_step"
    assert speed["measured"] == pytest.approx(0.119 / 0.022, abs=1e-3)


def test_findings_gone_new_and_remaining() -> None:
    result = compare_reports(BEFORE, AFTER)
    found = result["findings"]
    assert [(f["kind"], f["ranks"]) for f in found["gone"]] == [
        ("data_starvation", [1]),
        ("utilization_imbalance", [1]),
        ("compute_straggler", [0]),
    ]
    assert [(f["kind"], f["ranks"]) for f in found["new"]] == [("cpu_oversubscription", [1])]
    assert [(f["kind"], f["severity_before"], f["severity"]) for f in found["remain"]] == [
        ("batch_split", "warning", "info")
    ]
    # The same kind on other ranks is another finding.
    gone, new, remain = diff_findings(
        [ReportFinding.from_dict(finding("data_starvation", [1], "critical", 2.0))],
        [ReportFinding.from_dict(finding("data_starvation", [0], "critical", 2.0))],
    )
    assert len(gone) == len(new) == 1 and remain == []


def test_phase_shares_per_rank() -> None:
    result = compare_reports(BEFORE, AFTER)
    r1 = next(r for r in result["ranks"] if r["rank"] == 1)
    before = r1["before"]["shares"]
    assert before["data_wait"] == pytest.approx(0.117 / 0.140, abs=1e-3)
    assert sum(v for v in before.values() if v is not None) == pytest.approx(1.0, abs=1e-3)
    assert r1["changed"] == ["num_workers 1 -> 10"]


def test_text_fits_80_columns_and_names_what_changed() -> None:
    text = render_compare(compare_reports(BEFORE, AFTER, before_source="b.json"))
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    head = " ".join(line.strip() for line in lines[: lines.index("") - 2])
    assert head.startswith("Compare: 4.6x faster per step; gone: data_starvation (rank 1)")
    assert head.endswith("; new: cpu_oversubscription (rank 1)")
    assert "Measured speed-up: 4.59x (140 ms -> 30.5 ms per step" in text
    assert "Predicted by BEFORE's verdict: 5.60x (data_starvation on rank 1)" in text
    assert "  gone    data_starvation rank 1 (critical)" in lines
    assert "  new     cpu_oversubscription rank 1 (warning)" in lines
    assert "  remains batch_split rank 0 (warning -> info)" in lines
    assert "  rank 1: num_workers 1 -> 10" in lines
    table = lines[lines.index("Per rank (median step, and each phase's share of it):") + 1 :]
    assert table[0].split() == [
        "rank",
        "run",
        "step",
        "ms",
        "data",
        "h2d",
        "fwd",
        "bwd",
        "opt",
        "wait",
        "other",
    ]
    assert table[3].split()[:4] == ["1", "before", "140", "84%"]


def test_untimed_runs_and_no_prediction() -> None:
    empty = report([rank(0, None)], [])
    result = compare_reports(empty, AFTER)
    assert result["speedup"]["measured"] is None
    assert result["speedup"]["predicted"] is None
    text = render_compare(result)
    assert "Measured speed-up: - (a run has no timed steps)" in text
    assert "Predicted by BEFORE's verdict: none (no finding there predicts one)" in text
    assert job_step(empty) == (None, None)
    assert predicting_finding(AFTER) is None


def test_compare_reports_built_by_the_report_builder() -> None:
    """End to end over constructed jobs: a starved rank, then the same job fixed."""

    def built(specs: list[Any]) -> dict[str, Any]:
        b = JobBuilder(specs, comm=0.001).run(40)
        snap = b.snapshot()
        return build_report(
            command=["x"], exit_code=0, duration_s=10, snapshot=snap, findings=analyze(snap)
        )

    before = built(with_rank(balanced(2, num_workers=1), 1, data_wait=0.117))
    after = built(balanced(2, num_workers=4))
    result = compare_reports(before, after)
    assert ("data_starvation", [1]) in [(f["kind"], f["ranks"]) for f in result["findings"]["gone"]]
    assert result["findings"]["new"] == []
    assert result["speedup"]["measured"] > 1.5
    assert result["speedup"]["predicted"] > 1.5
    assert "gone: data_starvation (rank 1)" in render_compare(result).splitlines()[0]


def test_achieved_inside_or_outside_the_predicted_range() -> None:
    """Measured 4.59x (140 ms -> 30.5 ms): inside a 4.2-5.8x range, outside a 5.0-6.0x one."""
    for span, inside in (([4.2, 5.8], True), ([5.0, 6.0], False)):
        before = dict(BEFORE, findings=[{**BEFORE["findings"][0], "predicted_range": span}])
        result = compare_reports(before, AFTER)
        assert result["speedup"]["predicted_range"] == span
        assert result["speedup"]["inside_range"] is inside
        (first,) = result["per_finding"]
        assert first["range"] == span and first["inside_range"] is inside
        text = " ".join(render_compare(result).split())  # as read, the wrapping undone
        assert f"range {span[0]:.2f}-{span[1]:.2f}x" in text
        assert ("inside the range" if inside else "outside the range") in text
    # No range given: nothing said of one.
    result = compare_reports(BEFORE, AFTER)
    assert result["speedup"]["inside_range"] is None
    assert "range" not in render_compare(result)
