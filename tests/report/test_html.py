"""The HTML report: one self-contained file with the verdict, the fixes and plotly plots."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis import SampleStore, analyze
from auditor.report.figures import (
    BREAKDOWN,
    MAX_POINTS,
    breakdown_ms,
    budget_limit,
    memory_figure,
    memory_parts,
)
from auditor.report.html import fixes_by_rank, render_html, write_html, write_html_for_run
from auditor.report.json_report import build_report
from auditor.report.measured import BudgetEntry
from auditor.report.model import RankEntry, ReportFinding
from auditor.report.terminal import render_verdict
from auditor.samples import MemoryBudget
from auditor.telemetry.recorded import read_recording
from tests.helpers.jobs import JobBuilder, RankSpec, balanced
from tests.helpers.reports import budget, report_of, starved_store, with_budgets
from tests.helpers.units import GIB, MIB


class _Refs(HTMLParser):
    """Every URL-bearing attribute and every script/style element of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.scripts: list[dict[str, str | None]] = []
        self.styles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "action", "poster") and value:
                self.refs.append((tag, name, value))
            if name == "style" and value and "url(" in value:
                self.refs.append((tag, name, value))
        if tag == "script":
            self.scripts.append(dict(attrs))
        if tag == "style":
            self._in = "style"

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "style":
            self.styles.append(data)


def figures_of(page: str) -> dict[str, dict[str, Any]]:
    m = re.search(r'<script type="application/json" id="auditor-figures">(.*?)</script>', page)
    assert m, "no figure payload"
    return {f["id"]: f["figure"] for f in json.loads(m.group(1))}


def without_library(page: str) -> str:
    start = page.index('<script id="plotlyjs">')
    end = page.index("</script>", start)
    return page[:start] + page[end:]


@pytest.fixture(scope="module")
def page() -> str:
    store = starved_store()
    return render_html(report_of(store), series=store.snapshot(store.latest_time() or 0, None))


def test_page_is_self_contained(page: str) -> None:
    refs = _Refs()
    refs.feed(page)
    # Nothing is loaded from anywhere: no src/href at all (not even relative files).
    assert refs.refs == []
    assert all("src" not in s for s in refs.scripts)
    assert not any("url(" in css for css in refs.styles)
    assert not any("@import" in css or "@font-face" in css for css in refs.styles)
    # plotly.js is embedded once, inline; outside its own source text no URL appears at all.
    assert page.count('<script id="plotlyjs">') == 1
    assert "Plotly" in page[page.index('<script id="plotlyjs">') :][:2_000_000]
    rest = without_library(page)
    assert "http://" not in rest and "https://" not in rest
    assert "url(" not in rest
    assert "<link" not in rest and "<img" not in rest and "<iframe" not in rest


def test_verdict_and_fixes_are_at_the_top(page: str) -> None:
    store = starved_store()
    report = report_of(store)
    headline = render_verdict(report).splitlines()[0]
    assert headline == "Verdict: rank 1 holds the job back (data_starvation, critical)"
    body = page[page.index("<body>") :]
    assert body.index(html.escape(headline)) < body.index('class="plot"')
    fixes = [(r, fix) for f in report["findings"] for r, fix in f["fixes"].items()]
    assert fixes, report["findings"]
    fix_list = body[body.index('id="fixes"') : body.index("</ul>", body.index('id="fixes"'))]
    for rank, fix in fixes:
        assert f"<b>rank {rank}</b>: {html.escape(fix)}" in fix_list
    # The whole terminal verdict is there too, and the evidence of each finding.
    assert html.escape(render_verdict(report)) in page
    assert "job_pace_ms" in page


def test_plots_carry_every_rank_and_gpu(page: str) -> None:
    figs = figures_of(page)
    assert set(figs) == {
        "plot-run-time",
        "plot-breakdown",
        "plot-step-time",
        "plot-gpu-busy",
        "plot-gpu-memory",
        "plot-worker-cpu",
    }
    run = [t for t in figs["plot-run-time"]["data"] if t["type"] == "bar"]
    assert run and all(t["y"] == ["rank 0", "rank 1"] for t in run)
    bars = [t for t in figs["plot-breakdown"]["data"] if t["type"] == "bar"]
    assert [t["name"] for t in bars][: len(BREAKDOWN)] == list(BREAKDOWN)
    assert all(t["x"] == ["rank 0", "rank 1"] for t in bars)
    assert figs["plot-breakdown"]["layout"]["barmode"] == "stack"
    data_wait = next(t for t in bars if t["name"] == "data wait")
    assert data_wait["y"][1] > 100 > data_wait["y"][0]  # rank 1 waits 117 ms for data

    steps = figs["plot-step-time"]["data"]
    assert [t["name"] for t in steps] == ["rank 0", "rank 1"]
    assert all(len(t["y"]) == 60 for t in steps)

    heat = figs["plot-gpu-busy"]["data"]
    assert [t["type"] for t in heat] == ["heatmap"]
    assert heat[0]["y"] == ["node0 GPU 0", "node0 GPU 1"]
    row0 = [v for v in heat[0]["z"][0] if v is not None]
    row1 = [v for v in heat[0]["z"][1] if v is not None]
    assert row0 and set(row0) == {95.0} and set(row1) == {45.0}

    mem = figs["plot-gpu-memory"]["data"]
    assert {t["name"] for t in mem} == {
        "node0 GPU 0 used",
        "node0 GPU 0 total",
        "node0 GPU 1 used",
        "node0 GPU 1 total",
    }
    # One chart per GPU: each GPU's traces on its own axes.
    assert {t.get("yaxis", "y") for t in mem if "GPU 0" in t["name"]} == {"y"}
    assert {t.get("yaxis") for t in mem if "GPU 1" in t["name"]} == {"y2"}

    cpu = figs["plot-worker-cpu"]["data"]
    assert [t["name"] for t in cpu] == ["rank 0", "rank 1"]
    assert cpu[0]["y"][0] == pytest.approx(0.5)  # one worker at 0.5 cores


def test_page_draws_after_load_and_reports_what_it_drew(page: str) -> None:
    assert 'id="auditor-render-status"' in page
    assert "Plotly.newPlot" in without_library(page)
    assert 'data-expected="6"' in page


def test_breakdown_adds_up_to_the_step() -> None:
    rank = {
        "step_s": 0.200,
        "data_wait_s": 0.010,
        "h2d_s": 0.005,
        "forward_s": 0.030,
        "backward_s": 0.070,  # exclusive: the 50 ms wait is not in it
        "optimizer_s": 0.005,
        "collective_wait_s": 0.050,
    }
    parts = breakdown_ms(RankEntry.from_dict(rank))
    assert parts["backward (own work)"] == pytest.approx(70.0)
    assert parts["collective wait"] == pytest.approx(50.0)
    assert sum(parts.values()) == pytest.approx(200.0)
    assert parts["other"] == pytest.approx(30.0)
    # Unmeasured (null) phases count as nothing, never as negative time.
    parts = breakdown_ms(
        RankEntry.from_dict({"step_s": 0.1, "backward_s": 0.05, "collective_wait_s": None})
    )
    assert parts["backward (own work)"] == pytest.approx(50.0)
    assert parts["other"] == pytest.approx(50.0)


def test_cpu_run_says_no_gpu_was_seen() -> None:
    store = starved_store(gpus=0)
    page = render_html(report_of(store), series=store.snapshot(store.latest_time() or 0, None))
    figs = figures_of(page)
    assert "plot-gpu-busy" not in figs and "plot-gpu-memory" not in figs
    assert "No GPU was seen" in page
    assert 'data-expected="4"' in page


def test_page_from_a_json_report_alone() -> None:
    report = report_of(starved_store())
    page = render_html(report, series=None)
    # The run's account is in the JSON: its bar is drawn without the samples.
    assert set(figures_of(page)) == {"plot-run-time", "plot-breakdown"}
    assert "without its samples" in page
    assert "Verdict: rank 1 holds the job back" in page


def test_long_runs_are_thinned() -> None:
    store = JobBuilder(balanced(2), jitter=0.2).run(MAX_POINTS * 3 + 7).store
    page = render_html(report_of(store), series=store.snapshot(store.latest_time() or 0, None))
    steps = figures_of(page)["plot-step-time"]["data"]
    assert all(0 < len(t["y"]) <= MAX_POINTS for t in steps)
    assert all(t["x"] == sorted(t["x"]) for t in steps)


def test_text_is_escaped() -> None:
    store = JobBuilder([RankSpec(host="<b>x</b>"), RankSpec()]).run(20).store
    report = report_of(store, job="<script>alert(1)</script>")
    page = render_html(report, series=None)
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>x</b>" not in page


def test_write_html_for_run(tmp_path: Path) -> None:
    store = starved_store()
    target = tmp_path / "out" / "run.html"
    write_html_for_run(str(target), report_of(store), store)
    text = target.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert [p.name for p in target.parent.iterdir()] == ["run.html"]  # no temp file left
    # An empty store (the job ended before any step) still gives a page.
    empty = SampleStore("empty")
    write_html_for_run(str(target), report_of_empty(empty), empty)
    assert "no training steps were measured" in target.read_text(encoding="utf-8")


def report_of_empty(store: SampleStore) -> dict[str, Any]:
    return build_report(
        command=["python", "x.py"],
        exit_code=1,
        duration_s=1.0,
        snapshot=store.snapshot(0.0, None),
        findings=[],
    )


def test_write_html_is_atomic_on_error(tmp_path: Path) -> None:
    target = tmp_path / "page.html"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(TypeError):
        write_html(target, {"ranks": [{"rank": 0, "step_s": object()}]}, series=None)
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


def test_each_rank_fix_is_listed_once_with_every_finding_it_answers() -> None:
    fix = "num_workers 1 -> 3"
    findings = [
        {"kind": "data_starvation", "severity": "critical", "ranks": [2], "fixes": {"2": fix}},
        {"kind": "utilization_imbalance", "severity": "warning", "ranks": [2], "fixes": {"2": fix}},
        {"kind": "memory_headroom", "severity": "info", "ranks": [2], "fixes": {"2": "batch 64"}},
    ]
    grouped = fixes_by_rank([ReportFinding.from_dict(f) for f in findings])
    assert [(r, [(f, [x.kind for x in fs]) for f, fs in items]) for r, items in grouped] == [
        (
            2,
            [
                (fix, ["data_starvation", "utilization_imbalance"]),
                ("batch 64", ["memory_headroom"]),
            ],
        )
    ]


def test_what_to_change_gives_a_shared_fix_once_per_rank() -> None:
    # The recorded throttled GPU: hardware_straggler and utilization_imbalance both answer
    # rank 2 with one fix.
    rec = read_recording(Path(__file__).resolve().parents[1] / "data/throttled_gpu/recording.jsonl")
    store = SampleStore(job=rec.job)
    store.add(rec.batch)
    snap = store.snapshot(store.latest_time() or 0.0, None)
    report = build_report(
        command=["torchrun", "train.py"],
        exit_code=0,
        duration_s=30.0,
        snapshot=snap,
        findings=analyze(snap),
    )
    fix = report["findings"][0]["fixes"]["2"]
    assert sorted(f["kind"] for f in report["findings"] if f["fixes"].get("2") == fix) == [
        "hardware_straggler",
        "utilization_imbalance",
    ]
    page = render_html(report, series=None)
    start = page.index('id="fixes"')
    fix_list = page[start : page.index("</ul>", start)]
    assert fix_list.count("<li") == 1
    assert fix_list.count(html.escape(fix)) == 1
    assert (
        "hardware_straggler, warning" in fix_list and "utilization_imbalance, warning" in fix_list
    )
    # The evidence section gives the fix under the first finding, and points there after.
    evidence = page[page.index('id="findings"') : page.index('id="ranks"')]
    assert evidence.count(html.escape(fix)) == 1
    assert "(answers hardware_straggler, utilization_imbalance)" in evidence
    assert "the fix given under hardware_straggler, above" in evidence
    # So does the terminal verdict embedded in the page.
    verdict = render_verdict(report)
    assert " ".join(verdict.split()).count(fix) == 1


def _budget_page(*budgets: MemoryBudget) -> tuple[dict[str, Any], str]:
    report = report_of(with_budgets(starved_store(), *budgets))
    return report, render_html(report, series=None)


def test_memory_bar_beside_the_breakdown_when_budgets_exist() -> None:
    report, page = _budget_page(budget(0), budget(1, other_module_bytes=100 * MIB))
    figs = figures_of(page)
    assert set(figs) == {"plot-run-time", "plot-breakdown", "plot-memory-budget"}
    assert 'data-expected="3"' in page
    # One row: the step breakdown, then the memory bar, in one side-by-side block.
    pair = page[page.index('<div class="pair">') :]
    pair = pair[: pair.index("</div></section></div>")]
    assert pair.index('id="section-breakdown"') < pair.index('id="section-memory-budget"')
    bars = {t["name"]: t for t in figs["plot-memory-budget"]["data"] if t["type"] == "bar"}
    assert list(bars) == [
        "parameters",
        "gradients",
        "optimizer state",
        "buffers",
        "other modules",
        "activations",
    ]
    assert all(t["x"] == ["rank 0", "rank 1"] for t in bars.values())
    gib = float(GIB)
    assert bars["parameters"]["y"] == [pytest.approx(100 * MIB / gib, abs=1e-4)] * 2
    assert bars["optimizer state"]["y"] == [pytest.approx(200 * MIB / gib, abs=1e-4)] * 2
    assert bars["other modules"]["y"] == [0.0, pytest.approx(100 * MIB / gib, abs=1e-4)]
    # Activations at the rank's batch: 8 MiB a sample x 32.
    assert [r["batch_size"] for r in report["ranks"]] == [32, 32]
    assert bars["activations"]["y"] == [pytest.approx(256 * MIB / gib, abs=1e-4)] * 2
    assert figs["plot-memory-budget"]["layout"]["barmode"] == "stack"
    # The limit: listed, hidden while the bars are slivers of it; each bar's total names it.
    traces = {t["name"]: t for t in figs["plot-memory-budget"]["data"]}
    limit = traces["limit per rank (device total)"]
    assert limit["y"] == [80.0, 80.0] and limit["visible"] == "legendonly"
    assert traces["total"]["text"] == [
        "658.0 MiB of 80.0 GiB (1%)",
        "758.0 MiB of 80.0 GiB (1%)",
    ]


def test_memory_limit_drawn_when_near_and_host_share_on_cpu() -> None:
    full = budget(0, device_total_bytes=900 * MIB)  # 658 MiB of 900 MiB: the limit is drawn
    fig = memory_figure(
        [
            RankEntry.from_dict(
                {"rank": 0, "batch_size": 32, "memory": {"budget": _report_budget(full)}}
            )
        ]
    )
    assert fig is not None
    limit = next(t for t in fig.data if t.name.startswith("limit"))
    assert limit.visible is True
    # Under a GiB everywhere: the axis reads in MiB.
    assert fig.layout.yaxis.title.text == "MiB" and limit.y == (900.0,)
    total = next(t for t in fig.data if t.name == "total")
    assert total.text == ("658.0 MiB of 900.0 MiB (73%)",)
    cpu = BudgetEntry.from_dict(
        _report_budget(budget(0, device_total_bytes=None, host_available_bytes=8 * GIB))
    )
    assert budget_limit(cpu) == (4 * GIB, "the host's available memory / its ranks")
    assert budget_limit(BudgetEntry.from_dict({"host_available_bytes": None})) == (
        None,
        "not measured",
    )
    # Activations without a batch from the report: the sampled forward's own.
    no_batch = RankEntry.from_dict({"batch_size": None})
    assert memory_parts(no_batch, cpu)["activations"] == 256 * MIB


def test_no_memory_chart_without_budgets(page: str) -> None:
    assert "plot-memory-budget" not in page and '<div class="pair">' not in page
    ranks = [{"rank": 0, "memory": {"budget": None}}, {"rank": 1}]
    assert memory_figure([RankEntry.from_dict(r) for r in ranks]) is None


def _report_budget(b: MemoryBudget) -> dict[str, Any]:
    """``b`` as the JSON report carries it (``memory.budget``)."""
    store = with_budgets(starved_store(steps=10), b)
    ranks = report_of(store)["ranks"]
    entry = next(r for r in ranks if r["rank"] == b.rank)["memory"]["budget"]
    assert isinstance(entry, dict)
    return entry
