"""Where every second went, on a real job: ``auditor run`` over a two-rank torchrun job (gloo,
CPU) whose rank 0 saves checkpoints with ``torch.save`` while rank 1 waits at the next
all-reduce. Each rank's account in the report must add up to its process's wall time as seen
from outside the process (a shell wrapper writes the start and end of each rank's Python), and
rank 0's saves must be named ``checkpoint`` with the time the script itself measured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import base_env, run_auditor

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
SHARE = 0.02  # the parts add up to the wall time within 2%


def test_each_ranks_account_adds_up_to_its_wall_time(ray_address: str, tmp_path: Path) -> None:
    env = base_env()
    env["TIMED_DIR"] = str(tmp_path)
    command = [
        "torchrun", "--nproc_per_node=2", "--no-python", str(HERE / "timed_rank.sh"),
        str(HERE / "checkpointing_job.py"), "--steps", "60", "--save-every", "10",
    ]  # fmt: skip
    run = run_auditor(["--address", ray_address], command, tmp=tmp_path, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    ranks = {r["rank"]: r for r in run.report["ranks"]}
    assert set(ranks) == {0, 1}
    for rank, entry in ranks.items():
        time = entry["time"]
        assert time is not None and time["started"] and time["ended"], entry
        outside_wall = float((tmp_path / f"rank{rank}.end").read_text()) - float(
            (tmp_path / f"rank{rank}.start").read_text()
        )
        assert abs(time["wall_s"] - outside_wall) <= SHARE * outside_wall, (rank, time)
        booked = sum(v for k, v in time.items() if k.endswith("_s") and k != "wall_s")
        booked += sum(time["outside"].values())
        assert abs(booked - time["wall_s"]) <= SHARE * time["wall_s"], (rank, time)
        assert time["steps"] == entry["steps"] == 60
        assert min(time[k] for k in time if k.endswith("_s")) >= 0
    save_s = float(re.findall(r"SAVE_S=([0-9.e-]+)", run.stdout + run.stderr)[-1])
    named = ranks[0]["time"]["outside"].get("checkpoint", 0.0)
    # The probe's region is the script's timed loop of saves less the loop's own Python.
    assert 0.8 * save_s <= named <= save_s + 0.01, (named, save_s)
    assert "checkpoint" not in ranks[1]["time"]["outside"]
    assert ranks[1]["time"]["collective_wait_s"] > 0
