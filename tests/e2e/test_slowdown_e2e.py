"""slowdown, for real: a torchrun job (gloo, 2 ranks) under ``auditor run`` whose rank 1 turns
slow halfway (its forward does 5x its step's work more from then on) is blamed on rank 1 with
the step it changed at; the final verdict is not balanced and names rank 1; the live verdict
names it while the job runs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from .conftest import run_auditor

pytestmark = pytest.mark.e2e

JOB = Path(__file__).resolve().with_name("slowdown_job.py")
SEVERE = ("warning", "critical")


def test_rank_1_turning_slow_halfway_is_named_with_the_step(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    run = run_auditor(
        ["--no-ray", "--live-interval", "1", "--events", str(events)],
        [
            "torchrun", "--nproc_per_node=2", str(JOB), "--seconds", "18", "--slow-after", "8",
            "--factor", "5",
        ],
        tmp=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    truth = int(re.findall(r"SLOW_FROM=(\d+)", run.stdout + run.stderr)[-1])
    steps = max(r["steps"] for r in run.report["ranks"])
    found = [f for f in run.findings("slowdown") if f["ranks"]]
    assert len(found) == 1, run.findings("slowdown")
    (slow,) = found
    assert slow["ranks"] == [1], slow
    assert slow["severity"] in SEVERE
    # The step it changed at, within 5% of the run's steps.
    assert abs(slow["evidence"]["step"] - truth) <= 0.05 * steps, (slow["evidence"], truth, steps)
    assert slow["evidence"]["per_rank"]["1"]["phase"] == "forward", slow["evidence"]
    assert slow["evidence"]["slowdown"] > 2, slow["evidence"]
    assert slow["predicted_speedup"] > 2
    # Rank 0 only waited: nothing severe blames it.
    for f in run.report["findings"]:
        if f["severity"] in SEVERE:
            assert 0 not in f["ranks"], f
    # The final verdict: not balanced, rank 1 named in its headline.
    verdict = next(line for line in run.stderr.splitlines() if line.startswith("Verdict:"))
    assert verdict.startswith("Verdict: rank 1 holds the job back"), verdict
    assert "balanced" not in verdict
    assert f"at step {slow['evidence']['step']}" in run.stderr
    # Live: the stream named it while the job ran (the seconds after the change it took, for
    # the record: tests never assert wall time).
    lines = [json.loads(x) for x in events.read_text().splitlines() if x.endswith("}")]
    live = [x for x in lines if x["event"] == "verdict" and _blames_rank_1(x["findings"])]
    assert live, "the slowdown was in the live stream before the job ended"
    late = live[0]["time"] - slow["evidence"]["time"]
    print(f"slowdown live {late:.1f} s after the change (step {truth} of {steps})")


def _blames_rank_1(findings: list[dict[str, Any]]) -> bool:
    return any(f["kind"] == "slowdown" and f["ranks"] == [1] for f in findings)
