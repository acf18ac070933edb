"""The typed report: what Audit produces, what every renderer reads, and its JSON document."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from auditor import wording
from auditor.analysis.findings import SEVERITY_ORDER, severity_key
from auditor.commands.reports import analyze_recording, load_input
from auditor.report import live
from auditor.report.columns import FIGURE_COLUMNS, titles
from auditor.report.compare import compare_reports, render_compare
from auditor.report.html import render_html
from auditor.report.json_report import read_report, write_report
from auditor.report.model import (
    BudgetEntry,
    DeadRank,
    JobSummary,
    MemoryEntry,
    RankEntry,
    Report,
    ReportFinding,
)
from auditor.report.terminal import fixes_by_rank, render_verdict

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDINGS = sorted(DATA.glob("*/recording.jsonl"))


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.parent.name for p in RECORDINGS])
def test_recorded_reports_round_trip(path: Path, tmp_path: Path) -> None:
    report = analyze_recording(str(path)).report
    assert isinstance(report, Report)
    doc = report.to_dict()
    again = Report.from_dict(doc)
    assert again == report
    assert again.to_dict() == doc
    assert json.dumps(again.to_dict(), indent=2) == json.dumps(doc, indent=2)
    # Written and read back: the same object, rendered the same way.
    target = tmp_path / "report.json"
    write_report(target, report)
    assert read_report(target) == report
    assert load_input(str(target)).report == report
    assert render_verdict(read_report(target)) == render_verdict(report)
    assert render_verdict(doc) == render_verdict(report)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object"),
        ({"job": {}}, "no 'schema' key"),
        (
            {"schema": "auditor.report/v1", "job": [], "ranks": [], "findings": [], "notes": []},
            "'job' must be a dict",
        ),
        (
            {"schema": "auditor.report/v1", "job": {}, "ranks": [{}], "findings": [], "notes": []},
            "ranks[0] has no rank number",
        ),
        (
            {"schema": "auditor.report/v1", "job": {}, "ranks": [], "findings": [{}], "notes": []},
            "findings[0] lacks kind or severity",
        ),
    ],
)
def test_from_dict_keeps_the_validation_errors(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=f"^r.json: .*{re.escape(message)}"):
        Report.from_dict(data, source="r.json")


FIX = "num_workers 1 -> 3; expect about 2.0x"


def built_report() -> Report:
    """A report built field by field: rank 2 starved, two findings answered by one fix."""

    def rank(r: int, data_wait: float) -> RankEntry:
        return RankEntry(
            rank=r,
            host="node0.example.com",
            steps=120,
            window_steps=40,
            step_s=0.2,
            data_wait_s=data_wait,
            h2d_s=0.001,
            forward_s=0.03,
            backward_s=0.05,
            optimizer_s=0.004,
            collective_wait_s=0.1 - data_wait if data_wait < 0.1 else 0.001,
            compute_s=0.085,
            data_wait_ratio=data_wait / 0.2,
            batch_size=32,
            samples_per_s=160.0,
            worker_cpu=0.9,
            workers=1,
            loader={"num_workers": 1, "batch_size": 32},
            memory=MemoryEntry(
                rss_bytes=3 << 30,
                budget=BudgetEntry(param_bytes=100 << 20, device_total_bytes=80 << 30),
            ),
        )

    starvation = ReportFinding(
        kind="data_starvation",
        severity="critical",
        ranks=(2,),
        summary="rank 2 waits for data 55% of its step",
        evidence={"wait_ms": 110.0},
        fixes={2: FIX},
        predicted_speedup=2.0,
    )
    imbalance = ReportFinding(
        kind="utilization_imbalance",
        severity="warning",
        ranks=(2,),
        summary="the others wait for rank 2",
        fixes={2: FIX},
        predicted_speedup=2.0,
        cause="data_starvation",
    )
    headroom = ReportFinding(kind="memory_headroom", severity="info", ranks=(0,), fixes={0: "b"})
    return Report(
        job=JobSummary(
            name="built",
            command=("torchrun", "train.py"),
            exit_code=0,
            world_size=3,
            parallel_mode="ddp",
            duration_s=65.0,
            hosts={"node0.example.com": (0, 1, 2)},
        ),
        ranks=(rank(0, 0.002), rank(1, 0.002), rank(2, 0.11)),
        findings=(headroom, imbalance, starvation),
        notes=("built in a test",),
        generated_at="2024-05-01T12:00:00Z",
    )


def test_the_verdict_renders_a_built_report() -> None:
    report = built_report()
    text = render_verdict(report)
    lines = text.splitlines()
    assert lines[0] == "Verdict: rank 2 holds the job back (data_starvation, critical)"
    assert lines[1] == "Run: job built, 3 ranks, ddp, ran 1m05s"
    # Most severe first; the shared fix said once, naming both findings it answers.
    heads = [line for line in lines if line.split(" ")[0] in {f.kind for f in report.findings}]
    assert heads == [
        "data_starvation (critical): rank 2, predicted speed-up 2.0x",
        "utilization_imbalance (warning): rank 2, predicted speed-up 2.0x, caused by",
        "memory_headroom (info): rank 0",
    ]
    flat = " ".join(text.split())
    assert flat.count(FIX) == 1
    assert f"rank 2: {FIX} (answers data_starvation, utilization_imbalance)" in flat
    assert "rank 2: the fix given under data_starvation above" in flat
    assert "Note: built in a test" in text
    assert render_verdict(Report.from_dict(report.to_dict())) == text


def test_what_to_change_lists_each_rank_once_with_both_findings() -> None:
    report = built_report()
    # JSON: each finding carries the fix; read back, one entry per rank and fix.
    doc = report.to_dict()
    assert [f["fixes"] for f in doc["findings"]] == [{"0": "b"}, {"2": FIX}, {"2": FIX}]
    for rep in (report, Report.from_dict(doc)):
        grouped = fixes_by_rank(rep.sorted_findings)
        assert [
            (r, [(fix, [f.kind for f in fs]) for fix, fs in items]) for r, items in grouped
        ] == [
            (0, [("b", ["memory_headroom"])]),
            (2, [(FIX, ["data_starvation", "utilization_imbalance"])]),
        ]
    page = render_html(report, series=None)
    start = page.index('id="fixes"')
    fixes = page[start : page.index("</ul>", start)]
    rank2 = [li for li in fixes.split("<li")[1:] if 'data-rank="2"' in li]
    assert len(rank2) == 1
    assert html.escape(FIX) in rank2[0]
    assert "data_starvation, critical, predicted 2.0x" in rank2[0]
    assert "utilization_imbalance, warning, predicted 2.0x" in rank2[0]
    assert 'class="sev-critical"' in rank2[0]


def test_html_tables_read_the_report_entries() -> None:
    page = render_html(built_report(), series=None)
    ranks = page[page.index('id="ranks"') :]
    assert "<td>2</td><td>node0.example.com</td><td>-</td><td>120</td><td>200</td><td>55%</td>" in (
        ranks
    )
    assert "<td>1 (of 1)</td><td>0.90</td><td>3072</td>" in ranks


def test_compare_renders_two_reports() -> None:
    before = built_report()
    fixed = [
        RankEntry(
            rank=r.rank,
            host=r.host,
            step_s=0.1,
            data_wait_s=0.002,
            samples_per_s=320.0,
            batch_size=32,
            loader={"num_workers": 3, "batch_size": 32},
        )
        for r in before.ranks
    ]
    after = Report(job=before.job, ranks=tuple(fixed))
    result = compare_reports(before, after)
    assert result["speedup"]["measured"] == 2.0
    assert result["speedup"]["predicted"] == 2.0
    assert result["findings"]["gone"][0]["kind"] == "data_starvation"
    text = render_compare(result)
    assert text.splitlines()[0].startswith("Compare: 2.0x faster per step; gone: data_starvation")
    assert "rank 2: num_workers 1 -> 3" in text
    assert compare_reports(before.to_dict(), after.to_dict()) == result


def test_dead_ranks_and_nodes_round_trip() -> None:
    report = Report(
        job=JobSummary(name="j", dead_ranks=(DeadRank(1, "n1", 4, True, 137),)),
    )
    doc = report.to_dict()
    assert doc["job"]["dead_ranks"] == [
        {"rank": 1, "node": "n1", "last_step": 4, "first": True, "exit_status": 137}
    ]
    assert "nodes" not in doc["job"]
    assert Report.from_dict(doc) == report
    assert render_verdict(report).splitlines()[0] == (
        "Verdict: rank 1 on n1 died after step 4 (exit status 137)"
    )


def test_one_wording_module() -> None:
    assert wording.fmt_ms(0.1364) == "136 ms" and wording.fmt_ms(None) == "n/a"
    assert wording.fmt_ms_value(0.1364) == "136" and wording.fmt_ms_value(0.0123) == "12.3"
    assert wording.fmt_ms_value(None) == "-"
    assert wording.fmt_pct(0.123) == "12%" and wording.fmt_pct(None) == "-"
    assert wording.fmt_bytes(1536 * 2**20) == "1.5 GiB" and wording.fmt_size(None) == "-"
    assert wording.ranks_text([5, 1, 3]) == "ranks 1, 3, 5" and wording.ranks_text([2]) == "rank 2"
    assert wording.fmt_duration(65) == "1m05s" and wording.fmt_duration(7500) == "2h05m"
    assert wording.severity_change("warning", "info") == "warning -> info"
    assert wording.severity_change("info", "info") == "info"


def test_one_severity_order_and_one_set_of_columns() -> None:
    assert SEVERITY_ORDER == ("critical", "warning", "info")
    assert sorted(["info", "critical", "warning"], key=severity_key) == list(SEVERITY_ORDER)
    # The live panel's figure columns are the report's.
    assert live._TITLES[3:9] == titles(FIGURE_COLUMNS)


def test_a_gpu_no_rank_owns_gets_its_fix_in_the_verdict_and_the_page() -> None:
    # Recorded: PID 39127, outside the job, holds 18.5 GiB on an idle GPU no rank owns.
    report = analyze_recording(str(DATA / "idle_allocated_gpu/recording.jsonl")).report
    (idle,) = [f for f in report.findings if f.kind == "idle_device"]
    assert idle.ranks == () and not idle.fixes
    assert idle.unowned_fix == idle.evidence["fix"]
    assert "`kill 39127`" in idle.unowned_fix
    verdict = render_verdict(report)
    assert "  fix: free it: PID 39127 holds 18.5 GiB on idle gpu-node-07 GPU 2" in verdict
    assert "`kill 39127`" in " ".join(verdict.split())
    page = render_html(report)
    assert f"<li><b>fix</b>: {html.escape(idle.unowned_fix)}</li>" in page
    # A finding whose changes are the ranks' says them per rank only.
    owned = ReportFinding(
        kind="idle_device", severity="warning", ranks=(1,), fixes={1: "x"}, evidence={"fix": "x"}
    )
    assert owned.unowned_fix is None
