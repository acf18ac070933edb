"""stall, for real: a torchrun job (gloo, 2 ranks) under ``auditor run`` where rank 0 alone
saves a full checkpoint (``torch.save`` of a 96 MiB state) every 5 steps is named with its
period and share; where every rank pauses alike, no rank is blamed."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_auditor, torchrun

pytestmark = pytest.mark.e2e

SEVERE = ("warning", "critical")


def test_rank_0_saving_checkpoints_is_named_with_its_period_and_share(
    ray_address: str, tmp_path: Path
) -> None:
    run = run_auditor(
        ["--quiet", "--address", ray_address],
        torchrun("checkpoint_rank0.py", "--seconds", "7", "--every", "5", "--state-mb", "96"),
        tmp=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    (found,) = run.findings("stall")
    assert found["ranks"] == [0], found
    assert found["severity"] in SEVERE, found
    stall = found["evidence"]["per_rank"]["0"]
    assert stall["period_steps"] == 5, stall
    assert stall["occurrences"] >= 2
    assert 0.05 <= stall["share"] < 1.0
    # The probe names the save (StepSample.outside): the levers are saving less often (where
    # an interval is proposed: every 5 steps is far too often for a 96 MiB save) and saving
    # off the step.
    assert stall["work"] == "checkpoint", stall
    levers = [a["lever"] for a in found["actions"]]
    first = "checkpoint_interval" if stall["interval_steps"] else "checkpoint_async"
    assert levers[0] == first and "checkpoint_async" in levers, found["actions"]
    assert found["predicted_speedup"] > 1.05
    # Rank 1 only waits: nothing severe blames it.
    for f in run.report["findings"]:
        if f["severity"] in SEVERE:
            assert 1 not in f["ranks"], f
    # The final verdict (the whole run) says it.
    assert "stall" in run.stderr and "every 5 steps" in run.stderr


def test_every_rank_pausing_alike_blames_no_rank(ray_address: str, tmp_path: Path) -> None:
    run = run_auditor(
        ["--quiet", "--address", ray_address],
        torchrun("checkpoint_rank0.py", "--seconds", "7", "--who", "all", "--pause", "0.3"),
        tmp=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    for f in run.findings("stall"):
        assert f["ranks"] == [], f
    assert [f for f in run.report["findings"] if f["severity"] in SEVERE] == []
    assert "balanced" in run.stderr
