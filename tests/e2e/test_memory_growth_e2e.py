"""memory_growth, for real: a torchrun job (gloo, 2 ranks) under ``auditor run`` whose rank 0
keeps every step's outputs in a list (the classic leak: no ``.detach()``). Its host RSS climbs
about 3 MiB a step; the job logs its own RSS every step (``/proc/self/statm``), so the true rate
is measured from outside the auditor. The auditor names rank 0 (not rank 1) with a rate within
20% of the measured one and a time to full, and no finding proposes a larger batch for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_auditor

pytestmark = pytest.mark.e2e

JOB = Path(__file__).resolve().parent / "leaking_job.py"
SEVERE = ("warning", "critical")


def _measured_rate(log: Path) -> float:
    """Bytes per step the rank's RSS rose, from a quarter of its steps (past warm-up) to its
    last step, as the job itself read it."""
    rows = [tuple(int(v) for v in line.split()) for line in log.read_text().splitlines()]
    assert len(rows) > 40, f"{log.name}: only {len(rows)} steps"
    (step_a, rss_a, _), (step_b, rss_b, _) = rows[len(rows) // 4], rows[-1]
    return (rss_b - rss_a) / (step_b - step_a)


def test_a_rank_keeping_its_outputs_is_named_with_its_rate_and_time_to_full(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "memory"
    logs.mkdir()
    command = [
        "torchrun", "--standalone", "--nproc_per_node=2", str(JOB),
        "--seconds", "8", "--keep-mb", "3", "--memory-log", str(logs),
    ]  # fmt: skip
    run = run_auditor(["--no-ray", "--quiet"], command, tmp=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    measured = _measured_rate(logs / "rank0.log")
    assert measured > 2 * 2**20, f"the job's leak is too small to judge: {measured:.0f} B/step"
    # Rank 1 keeps nothing: its RSS stays put.
    assert abs(_measured_rate(logs / "rank1.log")) < 0.05 * measured

    found = run.findings("memory_growth")
    assert [f["ranks"] for f in found] == [[0]], found
    (growth,) = found
    row = growth["evidence"]["per_rank"]["0"]
    assert row["where"] == "host" and row["series"] == "rss"
    assert row["bytes_per_step"] == pytest.approx(measured, rel=0.2), (row, measured)
    assert row["bytes_per_minute"] and row["bytes_per_minute"] > row["bytes_per_step"]
    # The probe sent the host's available memory: the time to full is projected.
    assert row["capacity_bytes"] and row["full_in_s"] is not None and row["full_in_s"] > 0
    assert growth["severity"] in SEVERE
    assert [a["lever"] for a in growth["actions"]] == ["retained_tensors"]

    # No finding proposes a larger batch for rank 0; memory_headroom says why it holds back.
    for f in run.report["findings"]:
        for a in f["actions"]:
            if a["lever"] == "batch_size" and a["rank"] == 0:
                assert isinstance(a["proposed"], int) and isinstance(a["current"], int), a
                assert a["proposed"] <= a["current"], f
    for f in run.findings("memory_headroom"):
        if 0 in f["ranks"]:
            assert f["evidence"]["held_back"]["0"]["reason"] == "memory_growth", f

    # The verdict says it: the rank, the rate and the time left.
    assert "memory_growth (" in run.stderr
    assert "rank 0's host memory climbs" in run.stderr and "is full in" in run.stderr
