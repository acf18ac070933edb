"""The probe's rank before any process group exists: the launcher's environment, read by
auditor.launch_env (torchrun's RANK, or an srun task's SLURM_PROCID for a script that passes its
rank to init_process_group itself)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from auditor.probe.probe import Probe

SLURM_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*SLURM_VARS, "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_an_srun_task_is_its_slurm_rank(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
    }.items():
        clean_env.setenv(name, value)
    probe = Probe(torch, sink_path=str(tmp_path / "none.sock"), job="t")
    assert (probe.rank(), probe.world_size()) == (3, 4)
    assert probe.info().local_rank == 1
    # torchrun's variables win where both are set (torchrun inside srun).
    clean_env.setenv("RANK", "5")
    clean_env.setenv("WORLD_SIZE", "8")
    assert (probe.rank(), probe.world_size()) == (5, 8)


def test_no_launcher_is_rank_0_of_1(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    probe = Probe(torch, sink_path=str(tmp_path / "none.sock"), job="t")
    assert (probe.rank(), probe.world_size(), probe.info().local_rank) == (0, 1, 0)
