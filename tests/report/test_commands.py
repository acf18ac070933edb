"""``auditor analyze / report / compare`` over recordings and JSON reports (no job is run)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis import SampleStore
from auditor.analysis.snapshot import WARMUP_STEPS
from auditor.cli.reports import add_subcommands, dispatch
from auditor.commands.reports import load_input, sniff
from auditor.report.json_report import write_report
from auditor.report.terminal import render_verdict
from auditor.samples import Batch
from auditor.telemetry.recorded import write_recording
from tests.helpers.jobs import JobBuilder, balanced, with_rank
from tests.helpers.reports import final_report

STARVED = with_rank(balanced(2, num_workers=1), 1, data_wait=0.117)
FIXED = balanced(2, num_workers=10)


def record(path: Path, specs: list[Any], steps: int = 60) -> tuple[Path, dict[str, Any]]:
    """A recording of a constructed job, and the report the live run would end with."""
    batches: list[Batch] = []
    # As `auditor run` builds it: the same warm-up skip as the replay.
    store = SampleStore("starved_rank", on_add=batches.append, warmup_steps=WARMUP_STEPS)
    JobBuilder(specs, comm=0.001, store=store).run(steps)
    command = ["torchrun", "--nproc_per_node=2", "examples/starved_rank.py"]
    write_recording(path, batches, job="starved_rank", meta={"command": command})
    # What auditor.commands.run.run does at the end of the job.
    _, _, live = final_report(store, command=command, duration_s=10.0, job="starved_rank")
    return path, live


def cli(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The commands through an argparse parser like the CLI's; ``env`` the AUDITOR_* twins
    (none unless given, whatever this process's environment holds)."""
    parser = argparse.ArgumentParser(prog="auditor")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("run")
    add_subcommands(sub)
    ns = parser.parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    code = dispatch(ns, out=out, err=err, env=env or {})
    assert code is not None
    return code, out.getvalue(), err.getvalue()


def key(findings: list[dict[str, Any]]) -> list[tuple[str, list[int], str]]:
    return [(f["kind"], f["ranks"], f["severity"]) for f in findings]


def test_analyze_gives_the_live_verdict(tmp_path: Path) -> None:
    path, live = record(tmp_path / "run.jsonl", STARVED)
    code, out, err = cli("analyze", str(path))
    assert code == 0 and err == ""
    assert out.splitlines()[0] == render_verdict(live).splitlines()[0]
    assert out.splitlines()[0] == "Verdict: rank 1 holds the job back (data_starvation, critical)"
    # The findings block and the per-rank table are the live ones, line for line.
    live_text = render_verdict(live)
    body = live_text[live_text.index("\n\n") :]
    assert body in out

    code, out, _ = cli("analyze", str(path), "--json")
    assert code == 0
    report = json.loads(out)
    assert report["schema"] == "auditor.report/v2"
    assert report["findings"] == live["findings"]
    assert report["ranks"] == live["ranks"]
    assert report["job"]["command"] == live["job"]["command"]
    assert report["job"]["name"] == "starved_rank"


def test_malformed_and_truncated_lines_are_named_and_skipped(tmp_path: Path) -> None:
    path, live = record(tmp_path / "run.jsonl", STARVED)
    lines = path.read_text().splitlines(keepends=True)
    lines[5] = '{"t": "step", "rank": 0, oops\n'
    lines[9] = '{"t": "step", "rank": "zero"}\n'  # valid JSON, not a step
    lines[-1] = lines[-1][: len(lines[-1]) // 2]  # the writer died mid-line
    path.write_text("".join(lines))
    code, out, err = cli("analyze", str(path))
    assert code == 0
    problems = err.splitlines()
    assert len(problems) == 3, err
    assert problems[0].startswith(f"auditor: error: {path}:6: malformed line")
    assert problems[1].startswith(f"auditor: error: {path}:10: bad 'step' record")
    assert problems[2].startswith(f"auditor: error: {path}:{len(lines)}: truncated line")
    # Still analysed: the same conclusion from what was readable.
    assert out.startswith("Verdict: rank 1 holds the job back (data_starvation, critical)")
    assert "Note: 3 unreadable lines of the recording skipped" in out
    code, out, _ = cli("analyze", str(path), "--json")
    assert key(json.loads(out)["findings"]) == key(live["findings"])


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("hello world\n", ":1: not an auditor report or recording"),
        ('{"schema": "something/v9"}\n{"t": "step"}\n', "not an auditor report or recording"),
        ("", "empty file"),
        ('{"schema": "auditor.recor', "not an auditor report or recording"),
    ],
)
def test_not_a_recording_is_one_line_and_exit_2(tmp_path: Path, content: str, why: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    code, out, err = cli("analyze", str(path))
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith(f"auditor: error: {path}") and why in err


def test_missing_file_and_bad_options(tmp_path: Path) -> None:
    code, _, err = cli("analyze", str(tmp_path / "nope.jsonl"))
    assert code == 2 and "cannot open" in err and len(err.splitlines()) == 1
    path, _ = record(tmp_path / "run.jsonl", STARVED)
    for args, why in [
        (["--window", "0"], "--window: must be positive"),
        (["--window", "abc"], "--window: not a number"),
        (["--set", "nosuch.rule=1"], "unknown rule"),
        (["--set", "data_starvation.nosuch=1"], "unknown threshold"),
        (["--set", "data_starvation"], "expected rule.threshold=value"),
    ]:
        code, out, err = cli("analyze", str(path), *args)
        assert code == 2 and out == "", args
        assert len(err.splitlines()) == 1 and why in err, (args, err)


def test_analyze_thresholds_and_window(tmp_path: Path) -> None:
    path, _ = record(tmp_path / "run.jsonl", STARVED)
    code, out, _ = cli(
        "analyze", str(path), "--json", "--set", "data_starvation.min_wait_ratio=0.9"
    )
    assert code == 0
    assert "data_starvation" not in [f["kind"] for f in json.loads(out)["findings"]]
    code, out, _ = cli("analyze", str(path), "--json", "--window", "3")
    report = json.loads(out)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["steps"] == 60 for r in report["ranks"])
    assert all(r["window_steps"] < 60 for r in report["ranks"])
    assert "findings judge the last 3 s of the recording" in report["notes"]


def test_analyze_fails_on_findings_as_run_does(tmp_path: Path) -> None:
    """``--fail-on``: exit 3 when the verdict has a finding that severe, as ``auditor run``."""
    path, _ = record(tmp_path / "run.jsonl", STARVED)  # data_starvation, critical
    assert cli("analyze", str(path), "--fail-on", "critical")[0] == 3
    assert cli("analyze", str(path), env={"AUDITOR_FAIL_ON": "warning"})[0] == 3
    assert cli("analyze", str(path))[0] == 0
    # Thresholds that find nothing: nothing fails.
    relaxed = ("--set", "data_starvation.min_wait_ratio=0.99", "--fail-on", "warning")
    relaxed += ("--set", "utilization_imbalance.min_spread=0.99")
    code, out, _ = cli("analyze", str(path), "--json", *relaxed)
    assert code == 0, [(f["kind"], f["severity"]) for f in json.loads(out)["findings"]]


def test_analyze_needs_a_recording_not_a_report(tmp_path: Path) -> None:
    _, live = record(tmp_path / "run.jsonl", STARVED)
    write_report(tmp_path / "r.json", live)
    code, _, err = cli("analyze", str(tmp_path / "r.json"))
    assert code == 2 and "is a JSON report, not a recording" in err


def test_a_recording_without_samples(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    write_recording(path, [], job="j")
    code, out, err = cli("analyze", str(path))
    assert code == 1
    assert "no training steps were measured" in out
    assert err.strip() == f"auditor: error: {path}: the recording holds no sample"


def test_report_writes_html_from_a_recording_or_a_report(tmp_path: Path) -> None:
    path, live = record(tmp_path / "run.jsonl", STARVED)
    page = tmp_path / "page.html"
    code, out, err = cli("report", str(path), "--html", str(page))
    assert code == 0
    assert out.startswith("Verdict: rank 1 holds the job back")
    assert err.strip() == f"auditor: wrote the HTML report to {page}"
    text = page.read_text()
    assert 'id="plot-step-time"' in text and 'id="plot-worker-cpu"' in text

    write_report(tmp_path / "r.json", live)
    code, out, _ = cli("report", str(tmp_path / "r.json"), "--html", str(page), "--json")
    assert code == 0 and json.loads(out) == live
    text = page.read_text()
    assert 'id="plot-breakdown"' in text and 'id="plot-step-time-missing"' in text

    code, out, err = cli("analyze", str(path), "--html", str(tmp_path / "a" / "b.html"))
    assert code == 0 and (tmp_path / "a" / "b.html").exists()


def test_options_come_from_their_environment_twins(tmp_path: Path) -> None:
    path, live = record(tmp_path / "run.jsonl", STARVED)
    page = tmp_path / "page.html"
    code, out, err = cli("report", str(path))
    assert code == 2 and out == ""
    assert err.strip() == "auditor: error: --html is required: where to write the HTML report"
    code, out, _ = cli("report", str(path), env={"AUDITOR_HTML": str(page), "AUDITOR_JSON": "1"})
    assert code == 0 and page.is_file()
    assert json.loads(out)["findings"] == live["findings"]
    code, _, err = cli("analyze", str(path), env={"AUDITOR_WINDOW": "0"})
    assert code == 2 and err.strip() == "auditor: error: AUDITOR_WINDOW: must be positive: 0"
    code, out, _ = cli("compare", str(path), str(path), env={"AUDITOR_JSON": "yes"})
    assert code == 0 and json.loads(out)["speedup"]["measured"] == pytest.approx(1.0)


def test_compare_recordings_and_reports(tmp_path: Path) -> None:
    before, _ = record(tmp_path / "before.jsonl", STARVED)
    after, live_after = record(tmp_path / "after.jsonl", FIXED)
    write_report(tmp_path / "after.json", live_after)
    for b, a in [(before, after), (before, tmp_path / "after.json")]:
        code, out, err = cli("compare", str(b), str(a))
        assert code == 0 and err == ""
        assert out.startswith("Compare: 2.")
        assert "gone    data_starvation rank 1 (critical)" in out
        assert all(len(line) <= 80 for line in out.splitlines())
    code, out, _ = cli("compare", str(before), str(after), "--json")
    result = json.loads(out)
    assert result["speedup"]["measured"] > 1.5
    assert result["speedup"]["predicted_by"]["kind"] == "data_starvation"
    assert [f["kind"] for f in result["findings"]["gone"]] == ["data_starvation"]
    assert result["before"]["source"] == str(before)

    bad = tmp_path / "bad.txt"
    bad.write_text("nothing\n")
    code, out, err = cli("compare", str(before), str(bad))
    assert code == 2 and out == "" and len(err.splitlines()) == 1


def test_inputs_are_told_apart_by_content(tmp_path: Path) -> None:
    path, live = record(tmp_path / "run.json", STARVED)  # a recording named .json
    assert sniff(str(path)) == "recording"
    report = tmp_path / "report.jsonl"  # a report named .jsonl, pretty-printed
    write_report(report, live)
    assert sniff(str(report)) == "report"
    compact = tmp_path / "compact"
    compact.write_text(json.dumps(live))
    assert sniff(str(compact)) == "report"
    assert load_input(str(compact)).report.to_dict() == live


def test_dispatch_leaves_other_commands_alone() -> None:
    assert dispatch(argparse.Namespace(cmd="run")) is None
    assert dispatch(argparse.Namespace(cmd=None)) is None
