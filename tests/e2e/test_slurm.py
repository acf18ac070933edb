"""SLURM jobs under ``auditor run``, on a real SLURM (slurmctld, two slurmd nodes and munge on
127.0.0.1, started and stopped here: :mod:`tests.slurm`).

* ``auditor run -- srun ...`` in a batch script: one auditor for the whole step, the job named
  by its SLURM job id.
* ``srun auditor run -- python ...``: one auditor per task, on two SLURM nodes; they meet in the
  job view through one Ray, and each gives the verdict of the whole job.
* srun's exit code and a signal to the auditor come through.

The training script is an ordinary DDP script written for SLURM (tests/e2e/slurm_ddp_job.py:
``SLURM_PROCID``/``SLURM_NTASKS``, no ``RANK``); rank 1 is starved of data.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, base_env
from tests.helpers.waiting import wait_for
from tests.slurm import SlurmCluster, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JOB = Path(__file__).with_name("slurm_ddp_job.py")
AUDITOR = f"{sys.executable} -m auditor run"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


def job_env(slurm: SlurmCluster) -> dict[str, str]:
    env = base_env()
    env["SLURM_CONF"] = slurm.env["SLURM_CONF"]
    # What a batch script exports for the rendezvous (the first node's address, a free port).
    env["MASTER_ADDR"] = "127.0.0.1"
    env["MASTER_PORT"] = str(free_port())
    return env


def sbatch(slurm: SlurmCluster, tmp: Path, script: str, *opts: str) -> tuple[str, int, str]:
    """Submit ``script`` as a batch job and wait for it: (job id, exit code, its output)."""
    path = tmp / "job.sh"
    path.write_text("#!/bin/bash\nset -e\ncd " + str(REPO) + "\n" + script + "\n")
    out = tmp / "slurm-%j.out"
    proc = subprocess.run(
        ["sbatch", "--parsable", "--wait", "-o", str(out), *opts, str(path)],
        env=job_env(slurm),
        capture_output=True,
        text=True,
        timeout=400,
    )
    job_id = proc.stdout.strip().split(";")[0]
    log = tmp / f"slurm-{job_id}.out"
    text = log.read_text(errors="replace") if log.exists() else proc.stderr
    return job_id, proc.returncode, text


def findings(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] == kind]


def warnings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] in ("warning", "critical")]


def test_auditor_run_srun_in_a_batch_job_names_the_slurm_job(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    report, record = tmp_path / "report.json", tmp_path / "record.jsonl"
    job_id, code, log = sbatch(
        slurm,
        tmp_path,
        f"{AUDITOR} --no-ray --report {report} --record {record} -- "
        f"srun python {JOB} --seconds 14 --fault-rank 1",
        "-N1",
        "-n2",
    )
    assert code == 0, log[-4000:] + slurm.logs()
    assert job_id.isdigit()
    data = json.loads(report.read_text())
    # The job's name (and so the auditor_job label) is SLURM's job id.
    assert data["job"]["name"] == job_id, data["job"]
    # Every rank's probe carries it too: the auditor_job label of its series.
    records = [json.loads(line) for line in record.read_text().splitlines()]
    jobs = {(r["info"]["rank"], r["info"]["job"]) for r in records if r.get("t") == "rank"}
    assert jobs == {(0, job_id), (1, job_id)}, jobs
    assert {r["rank"] for r in data["ranks"]} == {0, 1}
    starved = findings(data, "data_starvation")
    assert starved and starved[0]["ranks"] == [1], data["findings"]
    assert all(0 not in f["ranks"] for f in warnings(data)), data["findings"]


def test_one_auditor_per_srun_task_gives_one_verdict(
    slurm: SlurmCluster, ray_address: str, tmp_path: Path
) -> None:
    reports = tmp_path / "report-$SLURM_PROCID.json"
    job_id, code, log = sbatch(
        slurm,
        tmp_path,
        f"srun bash -c 'exec {AUDITOR} --address {ray_address} --report {reports} -- "
        f"python {JOB} --seconds 14 --fault-rank 1'",
        "-N2",
        "-n2",
    )
    assert code == 0, log[-4000:] + slurm.logs()
    for task in (0, 1):
        path = tmp_path / f"report-{task}.json"
        assert path.exists(), log[-4000:]
        data = json.loads(path.read_text())
        assert data["job"]["name"] == job_id, data["job"]
        # Each task's auditor holds both ranks, each labelled with its SLURM node and task.
        hosts = {r["rank"]: r["host"] for r in data["ranks"]}
        assert hosts == {0: "n1/task0", 1: "n2/task1"}, data["ranks"]
        states = {n["node"]: n["state"] for n in data["job"]["nodes"]}
        assert states == {"n1/task0": "done", "n2/task1": "done"}, data["job"]["nodes"]
        starved = findings(data, "data_starvation")
        assert starved and starved[0]["ranks"] == [1], data["findings"]
        assert all(0 not in f["ranks"] for f in warnings(data)), data["findings"]


def test_srun_exit_code_comes_through(slurm: SlurmCluster, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "auditor", "run", "--no-ray", "--quiet", "--"]
    argv += ["srun", "-n2", "bash", "-c", "exit 3"]
    proc = subprocess.run(
        argv, cwd=REPO, env=job_env(slurm), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert wait_for(lambda: not slurm.jobs(), 30, what="the job gone from squeue", every=0.3)


def test_a_signal_to_the_auditor_reaches_srun_and_its_tasks(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    argv = [sys.executable, "-m", "auditor", "run", "--no-ray", "--quiet", "--"]
    argv += ["srun", "-n2", "bash", "-c", f"touch {marker}.$SLURM_PROCID; exec sleep 300"]
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(argv, cwd=REPO, env=job_env(slurm), stdout=log, stderr=log)
    try:
        wait_for(
            lambda: all(Path(f"{marker}.{t}").exists() for t in (0, 1)),
            60,
            what="both tasks running",
            every=0.2,
        )
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = (tmp_path / "run.log").read_text()
    # srun got the signal and answered it as srun does: it kills the step ("forcing job
    # termination", SIGKILL to the tasks) and exits 128 + 9; the auditor exits with srun's code
    # and still gives its verdict.
    assert "srun: forcing job termination" in text, text[-3000:]
    assert code == 128 + signal.SIGKILL, (code, text[-3000:])
    assert "no training step was measured" in text, text[-3000:]
    assert wait_for(lambda: not slurm.jobs(), 60, what="the job gone from squeue", every=0.3)
