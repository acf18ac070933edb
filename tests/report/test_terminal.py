"""Terminal views: the live table and the end-of-run verdict."""

from __future__ import annotations

import re
from typing import Any

from auditor.analysis import SampleStore, analyze
from auditor.report.json_report import build_report
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.report.terminal import render_verdict, wrap
from auditor.samples import MemoryBudget
from tests.helpers.reports import (
    T0,
    budget,
    final_report,
    make_store,
    snapshot_of,
    starved_report,
    with_budgets,
)
from tests.helpers.units import MIB

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CELLS = re.compile(r"\s{2,}")  # table cells: two spaces or more between them


def _row(text: str, rank: int) -> str:
    rows = [line for line in text.splitlines() if re.match(rf"\s*{rank}\s", line)]
    assert len(rows) == 1, text
    return rows[0]


# ---------------------------------------------------------------------------------------------
# verdict


def test_verdict_names_rank_and_fix_within_80_columns() -> None:
    _, findings, report = starved_report()
    fix = phrase(findings[0]).fixes[1]
    text = render_verdict(report)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    assert text.isascii()
    assert "\x1b[" not in text
    assert lines[0] == "Verdict: rank 1 holds the job back (data_starvation, critical)"
    # the fix for rank 1 is printed whole (maybe wrapped): compare with whitespace normalised
    flat = " ".join(text.split())
    assert f"rank 1: {fix}" in flat
    assert "num_workers 2 ->" in flat
    assert re.search(r"; expect (about )?\d+\.\dx", flat)
    # the per-rank table lists both ranks
    assert "80%" in _row(text, 1)
    assert _row(text, 0)
    assert "Note: GPU telemetry unavailable" in text


def test_verdict_wraps_long_lines_with_indented_continuation() -> None:
    _, _, report = starved_report()
    report["findings"][0]["fixes"]["1"] = "word " * 40 + "; expect about 2.0x"
    report["job"]["command"] = ["python", "train.py", *[f"--opt{i}=value{i}" for i in range(20)]]
    lines = render_verdict(report).splitlines()
    assert all(len(line) <= 80 for line in lines)
    start = next(i for i, ln in enumerate(lines) if ln.startswith("  rank 1: word"))
    assert lines[start + 1].startswith("      word")
    cmd = next(i for i, ln in enumerate(lines) if ln.startswith("Command: python"))
    assert lines[cmd + 1].startswith("    --opt")


def test_verdict_balanced_headline() -> None:
    snap = snapshot_of(make_store(starved=False))
    findings = analyze(snap)
    assert not [f for f in findings if f.severity_level >= 1]
    report = build_report(
        command=["torchrun", "train.py"],
        exit_code=0,
        duration_s=5.0,
        snapshot=snap,
        findings=findings,
    )
    text = render_verdict(report)
    assert text.splitlines()[0] == "Verdict: balanced - no rank holds the job back"
    assert "exit" not in text  # exit code 0 is not mentioned
    assert all(len(line) <= 80 for line in text.splitlines())


def test_verdict_reports_exit_code_interruption_and_unmeasured() -> None:
    snap = snapshot_of(make_store(collective=False, unmeasured=("collective_wait",)))
    report = build_report(
        command=["python", "train.py"],
        exit_code=3,
        duration_s=75.0,
        snapshot=snap,
        findings=analyze(snap),
        interrupted=True,
    )
    text = render_verdict(report)
    assert "exited with code 3" in text
    assert "interrupted" in text
    assert "Not measured on ranks 0, 1: collective_wait" in text
    assert "1m15s" in text
    # the wait column shows '-' for the unmeasured collective wait, never 0
    assert _row(text, 0).split()[6] == "-"


def test_verdict_for_empty_report() -> None:
    snap = SampleStore("crashed").snapshot(T0, None)
    report = build_report(
        command=["python", "boom.py"], exit_code=1, duration_s=0.2, snapshot=snap, findings=[]
    )
    text = render_verdict(report)
    assert text.splitlines()[0].startswith("Verdict: no training steps were measured")
    assert "exited with code 1" in text
    assert "Per rank" not in text


def test_verdict_does_not_claim_balance_on_too_few_steps() -> None:
    store = make_store(steps=20)
    now = store.latest_time()
    assert now is not None
    snap = store.snapshot(now, 0.5)  # the last 5 steps only
    report = build_report(
        command=["python", "train.py"],
        exit_code=0,
        duration_s=2.0,
        snapshot=snap,
        findings=analyze(snap),
    )
    assert report["ranks"][1]["steps"] == 20 and report["ranks"][1]["window_steps"] == 5
    head = render_verdict(report).splitlines()[0]
    assert head.startswith("Verdict: too few steps to judge (5 per rank at most")


def test_verdict_prefers_cause_and_lists_several_ranks() -> None:
    _, _, report = starved_report()
    symptom = ReportFinding(
        kind="utilization_imbalance",
        severity="critical",
        ranks=(1, 2),
        summary="busy time spread",
        fixes={1: "a", 2: "b"},
        predicted_speedup=9.0,
        cause=None,
    ).to_dict()
    report["findings"].insert(0, symptom)
    report["findings"][1]["ranks"] = [1, 2]
    text = render_verdict(report)
    assert (
        text.splitlines()[0] == "Verdict: ranks 1, 2 hold the job back (data_starvation, critical)"
    )


def test_verdict_color_only_when_asked() -> None:
    _, _, report = starved_report()
    plain = render_verdict(report)
    colored = render_verdict(report, color=True)
    assert "\x1b[" in colored
    assert ANSI.sub("", colored) == plain


def _fixes_report(fix: str) -> dict[str, Any]:
    _, _, report = starved_report()
    report["findings"] = [
        {"kind": "hardware_straggler", "severity": "warning", "ranks": [1], "fixes": {"1": fix}},
        {
            "kind": "utilization_imbalance",
            "severity": "warning",
            "ranks": [1],
            "cause": "hardware_straggler",
            "fixes": {"1": fix},
        },
        {"kind": "memory_headroom", "severity": "info", "ranks": [1], "fixes": {"1": "batch 64"}},
    ]
    return report


def test_verdict_gives_each_rank_fix_once_with_the_findings_it_answers() -> None:
    fix = "check the cooling of GPU 1; expect about 1.4x"
    text = render_verdict(_fixes_report(fix))
    flat = " ".join(text.split())
    assert flat.count(fix) == 1
    assert f"rank 1: {fix} (answers hardware_straggler, utilization_imbalance)" in flat
    # The second finding points at the first one's fix instead of repeating it.
    second = text[text.index("utilization_imbalance (warning)") :]
    assert "rank 1: the fix given under hardware_straggler above" in " ".join(second.split())
    # A fix that answers one finding only is printed as it is.
    assert "rank 1: batch 64" in flat and "batch 64 (answers" not in flat
    assert all(len(line) <= 80 for line in text.splitlines())


def _budget_report(*budgets: MemoryBudget, starved: bool = False) -> dict[str, Any]:
    store = with_budgets(make_store(starved=starved), *budgets)
    return final_report(store, command=["torchrun", "train.py"], duration_s=5.0)[2]


def _memory_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("Memory per rank (measured):")
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start + 1 : end]


def test_verdict_shows_the_measured_memory_budget_per_rank() -> None:
    report = _budget_report(
        budget(0),
        budget(1, other_module_bytes=100 * MIB, activation_bytes=None, activation_batch=None),
    )
    text = render_verdict(report)
    assert all(len(line) <= 80 for line in text.splitlines())
    block = _memory_block(text)
    cells = [CELLS.split(line.strip()) for line in block[:3]]
    assert cells[0] == ["rank", "params", "grads", "optimizer", "buffers", "act/sample", "act/step"]
    assert cells[1] == [
        "0",
        "100.0 MiB",
        "100.0 MiB",
        "200.0 MiB",
        "2.0 MiB",
        "8.0 MiB",
        "256.0 MiB",
    ]
    # Rank 1 has not sampled a forward yet: its activations are not measured ('-', never 0).
    assert cells[2][-2:] == ["-", "-"]
    notes = " ".join(" ".join(block[3:]).split())
    assert "act/step: what one sampled forward saved for backward (rank 0: batch 32)." in notes
    assert "Modules outside the model (EMA or eval copies): rank 1: 100.0 MiB." in notes
    assert "Limit per rank: device total 80.0 GiB." in notes
    # It comes after the timing table.
    assert text.index("Per rank (medians per step):") < text.index("Memory per rank")


def test_verdict_memory_limit_on_a_cpu_job_is_the_host_share() -> None:
    cpu = {"device": "cpu", "device_total_bytes": None}
    report = _budget_report(
        budget(0, **cpu), budget(1, **cpu, host_available_bytes=None), starved=False
    )
    notes = " ".join(" ".join(_memory_block(render_verdict(report))).split())
    assert "act/step: what one sampled forward saved for backward at batch 32." in notes
    assert (
        "Limit per rank: rank 0: host memory available 100.0 GiB (200.0 GiB shared by 2 "
        "ranks); rank 1: not measured." in notes
    )


def test_verdict_memory_table_fits_80_columns_at_its_widest() -> None:
    wide = 1023.9 * MIB  # the widest figure fmt_bytes writes: "1023.9 MiB"
    fields = ("param_bytes", "grad_bytes", "optimizer_bytes", "buffer_bytes")
    report = _budget_report(
        *(
            budget(r, **dict.fromkeys(fields, int(wide)), activation_bytes=int(wide) * 32)
            for r in (0, 1)
        )
    )
    block = _memory_block(render_verdict(report))
    assert max(len(line) for line in block) <= 80
    assert block[1].count("1023.9 MiB") == 5 and "..." not in block[1]


def test_verdict_without_budgets_has_no_memory_block() -> None:
    _, _, report = starved_report()
    assert "Memory per rank" not in render_verdict(report)
    # A rank that sent no budget beside one that did prints '-' throughout.
    text = render_verdict(_budget_report(budget(1)))
    assert _memory_block(text)[1].split() == ["0", *["-"] * 6]


def test_wrap_keeps_width_for_unbreakable_words() -> None:
    lines = wrap("x" * 200, indent="  ", cont="    ")
    assert all(len(line) <= 80 for line in lines)
    assert "".join(line.strip() for line in lines) == "x" * 200
