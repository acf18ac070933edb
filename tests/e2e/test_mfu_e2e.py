"""Work done, for real: a torchrun job (gloo, 2 ranks, CPU) under ``auditor run`` whose ranks
count their FLOPs. The report holds each rank's count and FLOP/s, no MFU (a CPU has no peak in
the table) and no ``low_mfu``; the verdict and the HTML page say the job's FLOP/s plainly."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_auditor, torchrun

pytestmark = pytest.mark.e2e


def test_a_cpu_job_gets_its_flops_per_second_and_no_mfu(tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    run = run_auditor(
        ["--no-ray", "--quiet", "--html", str(html)],
        torchrun("train_ddp.py", "--seconds", "6"),
        tmp=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    for rank in run.report["ranks"]:
        flops = rank["flops"]
        assert flops is not None, rank
        assert flops["device"] == "cpu" and flops["mfu"] is None, flops
        assert flops["flops_per_step"] > 0 and flops["flops_per_s"] > 0, flops
        assert flops["by_dtype"] == {"fp32": flops["flops_per_step"]}, flops
    work = run.report["job"]["mfu"]
    assert work["gpu"] is False and work["mfu"] is None and work["gap"] == {}, work
    assert work["flops_per_s"] > 0 and work["ranks"] == [0, 1], work
    assert run.findings("low_mfu") == []
    assert "(no MFU on a CPU)" in run.stderr, run.stderr[-3000:]
    assert "Work per rank (FLOPs counted on one step):" in run.stderr
    page = html.read_text()
    assert 'id="work-done"' in page and "no MFU on a CPU" in page
