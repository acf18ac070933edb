"""The typed fixes in the JSON report (``actions``): written as data, read back equal, and
version 1 documents (no ``actions``) still read and compared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import LEVERS, Fix
from auditor.analysis.rules import compute_straggler
from auditor.report.compare import compare_reports
from auditor.report.json_report import build_report, read_report, write_report
from auditor.report.model import SCHEMA_V1, Report
from tests.helpers.jobs import ddp_snapshot, forward_straggler


def _report(tmp_path: Path) -> tuple[list[Finding], dict[str, Any]]:
    snap = ddp_snapshot(forward_straggler())
    findings = compute_straggler.RULE(snap)
    report = build_report(
        command=["train.py"], exit_code=0, duration_s=10.0, snapshot=snap, findings=findings
    )
    return findings, report


def test_actions_are_the_findings_fixes_as_data(tmp_path: Path) -> None:
    findings, report = _report(tmp_path)
    (doc,) = report["findings"]
    assert doc["actions"] == [
        {
            "rank": 2,
            "gpu": None,
            "lever": "rank_work",
            "how": LEVERS["rank_work"],
            "current": "forward",
            "proposed": None,
            "expected_speedup": round(findings[0].predicted_speedup, 3),
            "answers": ["compute_straggler"],
        },
        {
            "rank": 2,
            "gpu": None,
            "lever": "batch_size",
            "how": "code",
            "current": 32,
            "proposed": 23,
            "expected_speedup": round(findings[0].predicted_speedup, 3),
            "answers": ["compute_straggler"],
        },
    ]
    path = tmp_path / "r.json"
    write_report(path, report)
    back = read_report(path)
    assert back.findings[0].actions == tuple(
        Fix(f.lever, f.rank, f.current, f.proposed, round(f.speedup or 0, 3), f.answers)
        for f in findings[0].fixes
    )
    assert back.to_dict()["findings"] == report["findings"]


def test_a_version_1_report_still_reads_and_compares(tmp_path: Path) -> None:
    _, report = _report(tmp_path)
    old = json.loads(json.dumps(report))
    old["schema"] = SCHEMA_V1
    for f in old["findings"]:
        del f["actions"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    back = read_report(path)
    assert back.findings[0].actions == ()
    assert back.findings[0].fixes == Report.from_dict(report).findings[0].fixes
    assert compare_reports(old, report)["schema"] == "auditor.compare/v1"


def test_an_unknown_lever_is_skipped_not_fatal() -> None:
    assert Fix.from_dict({"lever": "flux_capacitor", "rank": 1}) is None
    assert Fix.from_dict({"lever": "num_workers", "rank": 1, "current": 0, "proposed": 7}) == Fix(
        "num_workers", 1, 0, 7
    )
