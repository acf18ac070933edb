"""Reports from real runs: the HTML page renders offline in a real headless Chromium, ``analyze``
of a recording gives the live findings, and ``compare`` of the starved example before and after
the fix its verdict gives shows the finding gone and the speed-up measured."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.tools import require_tool

from .conftest import REPO, Run, base_env, run_auditor, torchrun

pytestmark = pytest.mark.e2e

ARTIFACTS = REPO / "artifacts" / "reports_e2e"  # /artifacts/ is gitignored
SEVERE = ("warning", "critical")


@dataclass
class Recorded:
    run: Run
    recording: Path
    report: Path
    html: Path


def audited(ray_address: str, tmp: Path, workers: int) -> Recorded:
    recording, page = tmp / "run.jsonl", tmp / "run.html"
    run = run_auditor(
        ["--quiet", "--address", ray_address, "--record", str(recording), "--html", str(page)],
        torchrun("starved_rank.py", "--seconds", "9", "--workers", str(workers)),
        tmp=tmp,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None and recording.exists()
    return Recorded(run, recording, tmp / "report.json", page)


@pytest.fixture(scope="module")
def starved(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """The starved example as shipped: rank 1 reads slow storage with 1 worker."""
    return audited(ray_address, tmp_path_factory.mktemp("starved"), workers=1)


@pytest.fixture(scope="module")
def fixed(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """The same job with the fix its verdict gives (num_workers 1 -> 10)."""
    return audited(ray_address, tmp_path_factory.mktemp("fixed"), workers=10)


def auditor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "auditor", *args],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def key(findings: list[dict[str, Any]]) -> list[tuple[str, list[int], str]]:
    return [(f["kind"], f["ranks"], f["severity"]) for f in findings]


# --------------------------------------------------------------------------------------------
# analyze and compare


def test_analyze_of_the_recording_gives_the_live_findings(starved: Recorded) -> None:
    live = starved.run.report
    assert live is not None
    assert "data_starvation" in [f["kind"] for f in live["findings"]]
    proc = auditor("analyze", str(starved.recording), "--json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    again = json.loads(proc.stdout)
    assert key(again["findings"]) == key(live["findings"])
    # Same samples, same rules: the evidence and fixes are the same too.
    assert again["findings"] == live["findings"]
    assert again["ranks"] == live["ranks"]
    # The text verdict is the live one (the live run printed it on stderr).
    proc = auditor("analyze", str(starved.recording))
    assert proc.returncode == 0
    headline = proc.stdout.splitlines()[0]
    assert headline == "Verdict: rank 1 holds the job back (data_starvation, critical)"
    assert headline in starved.run.stderr


def test_compare_before_and_after_the_fix(starved: Recorded, fixed: Recorded) -> None:
    assert fixed.run.report is not None
    after_kinds = [f["kind"] for f in fixed.run.report["findings"] if f["severity"] in SEVERE]
    assert "data_starvation" not in after_kinds
    # BEFORE as a JSON report, AFTER as a recording: each is recognised by its content.
    proc = auditor("compare", str(starved.report), str(fixed.recording))
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert any(line.startswith("  gone    data_starvation rank 1 (") for line in lines), lines
    assert "gone: data_starvation (rank 1)" in " ".join(lines[:3])
    proc = auditor("compare", str(starved.recording), str(fixed.report), "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    speed = result["speedup"]
    assert speed["measured"] > 1.5, result
    assert speed["predicted_by"]["kind"] == "data_starvation"
    assert speed["predicted"] > 1.5
    assert ("data_starvation", [1]) in [(f["kind"], f["ranks"]) for f in result["findings"]["gone"]]
    changed = {r["rank"]: r["changed"] for r in result["ranks"]}
    assert "num_workers 1 -> 10" in changed[1]


# --------------------------------------------------------------------------------------------
# the HTML page in a real browser


CONTROL_URLS = [
    "https://fonts.googleapis.com/css?family=Open+Sans",
    "https://cdn.plot.ly/plotly-4.1.1.min.js",
    "http://example.com/x.png",
    "https://example.org/data.json",
]
CONTROL_PAGE = (
    '<!DOCTYPE html><html><head><link rel="stylesheet" href="{}"><script src="{}"></script>'
    '</head><body><img src="{}"><script>fetch("{}").catch(function () {{}});</script>'
    "</body></html>"
).format(*CONTROL_URLS)


def net_log_args(path: Path) -> list[str]:
    return [f"--log-net-log={path}", "--net-log-capture-mode=Everything"]


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium", "chromium-browser")


@pytest.fixture
def profile(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "profile"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def browse(
    chromium: str, profile: Path, page: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    argv = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        "--no-first-run",
        "--no-default-browser-check",
        "--metrics-recording-only",
        # Any name the page (or the browser) tried to resolve would fail, not leave the machine;
        # the net log below shows whether anything was even attempted.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@dataclass
class NetLog:
    """What a Chromium net log says about network use (``--net-log-capture-mode=Everything``)."""

    # URLs the page asked for (initiator: the file's opaque origin), file: and data: aside.
    page_requests: list[str]
    # URLs the browser itself asked for (initiator "not an origin": its updaters, sign-in).
    browser_requests: list[str]
    # Events that only exist when bytes went over a socket or a TCP connection was attempted.
    traffic: list[str]


def read_net_log(path: Path) -> NetLog:
    text = path.read_text(encoding="utf-8", errors="replace").rstrip()
    if not text.endswith("}"):  # a log cut short still lists its events
        text = text.rstrip(",\n") + "]}"
    data = json.loads(text)
    names = {v: k for k, v in data["constants"]["logEventTypes"].items()}
    page: list[str] = []
    browser: list[str] = []
    traffic: list[str] = []
    for event in data.get("events", []):
        name = names.get(event.get("type"), "")
        params = event.get("params") or {}
        if name.endswith(("_BYTES_SENT", "_BYTES_RECEIVED")) or name == "TCP_CONNECT_ATTEMPT":
            traffic.append(name)
        url = params.get("url")
        if name != "URL_REQUEST_START_JOB" or not isinstance(url, str):
            continue
        if url.startswith(("file:", "data:", "blob:", "about:")):
            continue
        by_browser = params.get("initiator") == "not an origin" and "file://" not in str(
            params.get("network_isolation_key", "")
        )
        (browser if by_browser else page).append(url)
    return NetLog(page, browser, traffic)


def test_html_report_renders_offline_in_chromium(
    starved: Recorded, chromium: str, profile: Path, tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    proc = auditor("report", str(starved.recording), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    # `auditor run --html` wrote the same kind of page from the live run.
    assert starved.html.exists()
    fix = starved.run.findings("data_starvation")[0]["fixes"]["1"]
    for source in (page, starved.html):
        text = source.read_text(encoding="utf-8")
        assert "Verdict: rank 1 holds the job back (data_starvation, critical)" in text
        assert f"<b>rank 1</b>: {html.escape(fix)}" in text

    netlog = tmp_path / "net.json"
    shown = browse(chromium, profile, page, "--dump-dom", *net_log_args(netlog))
    assert shown.returncode == 0, shown.stderr[-3000:]
    dom = shown.stdout
    status = re.search(
        r'<div id="auditor-render-status"[^>]*data-rendered="(\d+)"[^>]*>(.*?)</div>', dom, re.S
    )
    assert status, "the page's script did not run: " + dom[-2000:]
    drawn = json.loads(html.unescape(status.group(2)))
    expected = re.search(r'data-expected="(\d+)"', status.group(0))
    assert expected and int(status.group(1)) == int(expected.group(1)) == len(drawn), drawn
    # Every plot the page holds was drawn; on a CPU machine no GPU plot is among them.
    assert {"plot-breakdown", "plot-step-time", "plot-worker-cpu"} <= set(drawn), drawn
    for plot in drawn.values():
        assert plot["svg"] >= 1 and plot["drawnTraces"] >= 1, drawn
    for plot in ("plot-step-time", "plot-worker-cpu"):
        traces = {t["name"]: t["points"] for t in drawn[plot]["traces"]}
        assert set(traces) == {"rank 0", "rank 1"}, drawn[plot]
        assert all(n > (20 if plot == "plot-step-time" else 2) for n in traces.values()), drawn
    names = [t["name"] for t in drawn["plot-breakdown"]["traces"]]
    assert names[:6] == [
        "data wait",
        "h2d",
        "forward",
        "backward (own work)",
        "optimizer",
        "collective wait",
    ]
    assert dom.count("js-plotly-plot") >= 3
    assert "main-svg" in dom
    for name in ("rank 0", "rank 1"):
        assert re.search(rf'class="legendtext"[^>]*>{name}</text>', dom), name
    assert re.search(r'class="xtick"[^>]*>.*?rank 1', dom, re.S)  # the bar chart's categories
    # The page asked for nothing beyond its own file, and nothing left the machine: every name
    # lookup fails (--host-resolver-rules), no TCP connection was attempted, no byte was sent.
    # (Chromium's own updater and sign-in requests still show up, browser-initiated and dead at
    # DNS; they are no part of the page.)
    log = read_net_log(netlog)
    assert log.page_requests == [], log.page_requests
    assert log.traffic == [], log.traffic
    # The check itself catches a page that fetches: a control page with a CDN script, a web
    # font, an image and a fetch() is caught on all four.
    control = tmp_path / "control.html"
    control.write_text(CONTROL_PAGE, encoding="utf-8")
    control_log = tmp_path / "control-net.json"
    shown = browse(chromium, profile, control, "--dump-dom", *net_log_args(control_log))
    assert shown.returncode == 0, shown.stderr[-3000:]
    caught = read_net_log(control_log)
    assert sorted(caught.page_requests) == sorted(CONTROL_URLS), caught
    assert caught.traffic == []

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "starved_rank_report.png"
    shown = browse(
        chromium,
        profile,
        page,
        f"--screenshot={shot}",
        "--window-size=1280,2000",
        "--hide-scrollbars",
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert shot.exists() and shot.stat().st_size > 20_000
    shutil.copy(page, ARTIFACTS / "starved_rank_report.html")
    print(f"screenshot: {shot}")
