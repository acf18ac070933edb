"""Work done in the reports: each rank's counted FLOPs and MFU (``ranks[].flops``), the job's MFU
and its gap (``job.mfu``) in the JSON (read back equal), the terminal verdict, the HTML page and
the live panel's MFU column (FLOP/s on a CPU)."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from rich.console import Console

from auditor.analysis import analyze
from auditor.analysis.snapshot import Snapshot
from auditor.liveview import panel_text
from auditor.report.html import render_html
from auditor.report.json_report import make_report
from auditor.report.live import LiveState
from auditor.report.model import JOB_KEYS, RANK_KEYS, Report
from auditor.report.terminal import render_verdict
from auditor.report.work import gap_text, mfu_cell, work_line
from tests.helpers.flops import RankSpec, flops_snapshot

FP32 = RankSpec(by_dtype={"fp32": 3e12})


def _report(snap: Snapshot) -> Report:
    return make_report(
        command=["torchrun", "train.py"],
        exit_code=0,
        duration_s=12.0,
        snapshot=snap,
        findings=analyze(snap),
    )


def test_the_json_holds_each_ranks_count_and_the_jobs_mfu_and_reads_back_equal() -> None:
    rep = _report(flops_snapshot([FP32, FP32]))
    doc = json.loads(json.dumps(rep.to_dict(), allow_nan=False))
    assert Report.from_dict(doc) == rep
    rank = doc["ranks"][0]
    assert set(rank) == set(RANK_KEYS)
    flops = rank["flops"]
    assert flops["flops_per_step"] == 3e12 and flops["by_dtype"] == {"fp32": 3e12}
    assert flops["mfu"] == pytest.approx(3e12 / 67e12 / FP32.step_s, abs=1e-4)
    assert flops["peak_flops_per_s"] == 67e12
    assert flops["device_name"] == "NVIDIA H100 80GB HBM3" and flops["device"] == "cuda"
    assert (flops["counted_step"], flops["count_cost_s"]) == (10, 0.05)
    job = doc["job"]
    assert set(JOB_KEYS) <= set(job)
    mfu = job["mfu"]
    assert mfu["basis"] == "run" and mfu["gpu"] is True and mfu["ranks"] == [0, 1]
    assert mfu["mfu"] == pytest.approx(flops["mfu"], abs=1e-4)
    assert sum(mfu["gap"].values()) == pytest.approx(1 - mfu["mfu"], abs=1e-3)
    assert mfu["precision"] > 0.8 and mfu["tf32"] > 0
    assert rep.ranks[0].mfu == flops["mfu"]
    kinds = {f["kind"] for f in doc["findings"]}
    assert "low_mfu" in kinds


def test_a_report_without_counts_stays_as_it_was() -> None:
    rep = _report(flops_snapshot([FP32, FP32], counted=False))
    doc = rep.to_dict()
    assert "mfu" not in doc["job"]
    assert all(r["flops"] is None for r in doc["ranks"])
    assert Report.from_dict(doc) == rep
    # An older report (no "flops" key) reads as no count.
    del doc["ranks"][0]["flops"]
    assert Report.from_dict(doc).ranks[0].flops is None
    assert "Work" not in render_verdict(rep)


def test_a_cpu_job_reports_flops_per_second_and_no_mfu() -> None:
    cpu = RankSpec(by_dtype={"fp32": 2e9})
    rep = _report(flops_snapshot([cpu, cpu], device="cpu"))
    doc = rep.to_dict()
    assert doc["job"]["mfu"]["mfu"] is None and doc["job"]["mfu"]["gpu"] is False
    assert doc["job"]["mfu"]["gap"] == {} and doc["job"]["mfu"]["precision"] is None
    assert doc["ranks"][0]["flops"]["mfu"] is None
    assert Report.from_dict(doc) == rep
    text = render_verdict(rep)
    assert "Work: 39 GFLOP/s (no MFU on a CPU) in fp32 over the whole run" in text
    assert "FLOP/s only on a CPU: MFU is judged against a GPU's peak." in text
    assert "low_mfu" not in text


def test_the_verdict_says_the_jobs_mfu_its_gap_and_each_ranks_work() -> None:
    text = render_verdict(_report(flops_snapshot([FP32, RankSpec(by_dtype={"fp32": 3e12})])))
    lines = text.splitlines()
    work = " ".join(
        line.strip() for line in lines[lines.index(next(x for x in lines if "Work:" in x)) :][:3]
    )
    assert work.startswith(
        "Work: 44% MFU (59 TFLOP/s on NVIDIA H100 80GB HBM3) in fp32 over the whole run; "
        "the gap: kernels below peak 49%"
    )
    assert "bf16 would give back 87% of the time" in work
    at = lines.index("Work per rank (FLOPs counted on one step):")
    assert lines[at + 1].split() == [
        "rank",
        "FLOPs/step",
        "FLOP/s",
        "MFU",
        "dtype",
        "counted",
        "cost",
    ]
    assert lines[at + 2].split() == ["0", "3.0T", "29T", "44%", "fp32", "step", "10", "50", "ms"]
    assert all(len(line) <= 80 for line in lines)


def test_the_html_page_shows_the_work_done() -> None:
    page = render_html(_report(flops_snapshot([FP32, FP32])))
    assert 'id="work"' in page and "44% MFU (59 TFLOP/s on NVIDIA H100 80GB HBM3)" in page
    assert 'id="work-done"' in page and 'id="mfu-gap"' in page and 'id="work-ranks"' in page
    assert "<th>MFU</th>" in page and "<td>44%</td>" in page


def _panel(snap: Snapshot, width: int = 120) -> list[str]:
    state = LiveState(elapsed_s=20, job="j", snapshot=snap, findings=tuple(analyze(snap)))
    console = Console(file=io.StringIO(), width=width, height=30, record=True, color_system=None)
    console.print(panel_text(state, width=width, height=30))
    return console.export_text().rstrip("\n").split("\n")


def test_the_live_panel_has_an_mfu_column_and_flops_per_second_on_a_cpu() -> None:
    gpu = _panel(flops_snapshot([FP32, FP32]))
    header = next(line for line in gpu if line.lstrip().startswith("rank"))
    assert header.split()[-1] == "MFU"
    row = next(line for line in gpu if line.lstrip().startswith("0 "))
    assert row.split()[-1] == "44%"
    cpu = RankSpec(by_dtype={"fp32": 2e9})
    row = next(
        line
        for line in _panel(flops_snapshot([cpu, cpu], device="cpu"))
        if line.lstrip().startswith("0 ")
    )
    assert row.split()[-1] == "20G/s"
    # No count: no column.
    plain = _panel(flops_snapshot([FP32, FP32], counted=False))
    header = next(line for line in plain if line.lstrip().startswith("rank"))
    assert "MFU" not in header


def test_cells_and_lines() -> None:
    assert mfu_cell(0.412, 4e14) == "41%" and mfu_cell(None, 3.2e9) == "3.2G/s"
    assert mfu_cell(None, None) == "-"
    assert gap_text({"device": 0.3, "data_wait": 0.5, "h2d": 0.001}) == (
        "data wait 50%, kernels below peak 30%"
    )
    assert work_line(Report().job) == ""


def test_a_gpu_job_no_sample_named_says_why_it_has_no_mfu() -> None:
    snap = replace(flops_snapshot([FP32, FP32]), devices=())
    rep = _report(snap)
    assert rep.job.mfu is not None and rep.job.mfu.gpu and rep.job.mfu.mfu is None
    text = render_verdict(rep)
    assert "(no MFU: no GPU sample named the card)" in text
    assert "No MFU on ranks 0, 1: no GPU sample named the card (FLOP/s only)." in text
    unknown = render_verdict(_report(flops_snapshot([FP32, FP32], model="NVIDIA B200")))
    assert "(no MFU: no peak figure for NVIDIA B200)" in unknown


def test_at_80_columns_the_blamed_rank_keeps_its_mfu() -> None:
    snap = flops_snapshot([FP32, RankSpec(by_dtype={"fp32": 3e12}, data_wait_s=0.05)])
    lines = _panel(snap, width=80)
    row = next(line for line in lines if line.lstrip().startswith("!1 "))
    assert "30%" in row.split() and len(row) < 80, row
