"""Every example, run for real under ``auditor run`` with torchrun (gloo, 2 ranks) and Ray:
the fault is found on the right rank, and the balanced job gets no warning."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_auditor, torchrun

pytestmark = pytest.mark.e2e

# (script, kind, blamed ranks). Effect sizes are large on purpose: the verdict must hold on a
# noisy 2-core machine, run after run.
FAULTS = [
    ("starved_rank.py", "data_starvation", [1]),
    ("uneven_batch.py", "batch_split", [1]),
    ("slow_forward.py", "compute_straggler", [1]),
    ("slow_backward.py", "compute_straggler", [1]),
    ("too_many_workers.py", "cpu_oversubscription", [1]),
]
SEVERE = ("warning", "critical")


@pytest.mark.parametrize(("script", "kind", "ranks"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_is_found_on_the_right_rank(
    script: str, kind: str, ranks: list[int], ray_address: str, tmp_path: Path
) -> None:
    run = run_auditor(
        ["--quiet", "--address", ray_address], torchrun(script, "--seconds", "9"), tmp=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    found = run.findings(kind)
    assert found, f"no {kind}: {run.report['findings']}"
    assert found[0]["ranks"] == ranks
    assert found[0]["severity"] in SEVERE
    for rank in ranks:
        assert str(rank) in found[0]["fixes"], found[0]
    # Rank 0 only waits: no warning ever blames it.
    for f in run.report["findings"]:
        if f["severity"] in SEVERE:
            assert 0 not in f["ranks"], f
    # The verdict names the rank and the kind.
    assert f"rank {ranks[0]}" in run.stderr and kind in run.stderr
    assert run.report["job"]["world_size"] == 2
    assert [r["rank"] for r in run.report["ranks"]] == [0, 1]
    assert all(r["steps"] > 20 for r in run.report["ranks"])


def test_balanced_job_gets_no_warning(ray_address: str, tmp_path: Path) -> None:
    run = run_auditor(
        ["--quiet", "--address", ray_address],
        torchrun("train_ddp.py", "--seconds", "9"),
        tmp=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.report is not None
    assert [f for f in run.report["findings"] if f["severity"] in SEVERE] == []
    assert "balanced" in run.stderr
    ranks = run.report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["collective_wait_s"] is not None for r in ranks)
    assert all(r["batch_size"] == 32 for r in ranks)
    assert all(r["loader"]["num_workers"] == 1 for r in ranks)
    assert run.report["job"]["parallel_mode"] == "ddp"
