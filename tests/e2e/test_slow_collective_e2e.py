"""slow_collective, for real: a torchrun job (gloo, 2 ranks) that all-gathers 48 MiB every step
on both ranks gets the collective named, with the bytes each step carries and a bandwidth
within 20% of what the script measured itself (bytes / the gather's own time after a
barrier); no rank is blamed."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

from .conftest import run_auditor

pytestmark = pytest.mark.e2e

JOB = Path(__file__).resolve().with_name("gather_job.py")
SEVERE = ("warning", "critical")


def test_a_large_all_gather_on_every_rank_is_the_collective_not_a_rank(tmp_path: Path) -> None:
    run = run_auditor(
        ["--no-ray", "--quiet"],
        ["torchrun", "--nproc_per_node=2", str(JOB), "--seconds", "8", "--mb", "24"],
        tmp=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    measured = re.findall(r"GATHER_BYTES=(\d+) GATHER_S=([\d.]+)", run.stdout + run.stderr)
    assert len(measured) == 2, run.stdout[-2000:]
    nbytes = int(measured[0][0])
    script_algbw = statistics.median(nbytes / float(s) for _, s in measured)
    (found,) = run.findings("slow_collective")
    assert found["ranks"] == [] and found["severity"] in SEVERE, found
    op = found["evidence"]["ops"][0]
    assert op["op"] == "all_gather" and op["bytes"] == nbytes == 48 * 2**20, op
    assert op["algbw_gbps"] * 1e9 == pytest.approx(script_algbw, rel=0.20), (op, script_algbw)
    assert op["busbw_gbps"] == pytest.approx(op["algbw_gbps"] / 2, rel=0.01)
    # gloo on one host's CPUs: no network to set, so the overlap's lever first (a GPU job's
    # starts with the network); nothing severe names a rank.
    assert [a["lever"] for a in found["actions"]] == [
        "collective_overlap",
        "fewer_collectives",
    ]
    words = json.dumps(found) + run.stderr
    assert "nvidia-smi" not in words and "NCCL_SOCKET_IFNAME" not in words
    for f in run.report["findings"]:
        if f["severity"] in SEVERE:
            assert f["ranks"] == [], f
    assert "collectives themselves take" in run.stderr
