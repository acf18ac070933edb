"""The HTML report: one self-contained file with the verdict, the fixes and plotly plots."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis import SampleStore
from auditor.report.html import (
    BREAKDOWN,
    MAX_POINTS,
    breakdown_ms,
    fixes_by_rank,
    render_html,
    write_html,
    write_html_for_run,
)
from auditor.report.json_report import build_report
from auditor.report.terminal import render_verdict
from tests.helpers.jobs import JobBuilder, RankSpec, balanced
from tests.helpers.reports import report_of, starved_store


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
        "plot-breakdown",
        "plot-step-time",
        "plot-gpu-busy",
        "plot-gpu-memory",
        "plot-worker-cpu",
    }
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
    assert 'data-expected="5"' in page


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
    parts = breakdown_ms(rank)
    assert parts["backward (own work)"] == pytest.approx(70.0)
    assert parts["collective wait"] == pytest.approx(50.0)
    assert sum(parts.values()) == pytest.approx(200.0)
    assert parts["other"] == pytest.approx(30.0)
    # Unmeasured (null) phases count as nothing, never as negative time.
    parts = breakdown_ms({"step_s": 0.1, "backward_s": 0.05, "collective_wait_s": None})
    assert parts["backward (own work)"] == pytest.approx(50.0)
    assert parts["other"] == pytest.approx(50.0)


def test_cpu_run_says_no_gpu_was_seen() -> None:
    store = starved_store(gpus=0)
    page = render_html(report_of(store), series=store.snapshot(store.latest_time() or 0, None))
    figs = figures_of(page)
    assert "plot-gpu-busy" not in figs and "plot-gpu-memory" not in figs
    assert "No GPU was seen" in page
    assert 'data-expected="3"' in page


def test_page_from_a_json_report_alone() -> None:
    report = report_of(starved_store())
    page = render_html(report, series=None)
    assert set(figures_of(page)) == {"plot-breakdown"}
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
    grouped = fixes_by_rank(findings)
    assert [(r, [(f, [x["kind"] for x in fs]) for f, fs in items]) for r, items in grouped] == [
        (
            2,
            [
                (fix, ["data_starvation", "utilization_imbalance"]),
                ("batch 64", ["memory_headroom"]),
            ],
        )
    ]
