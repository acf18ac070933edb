"""Kubernetes training pods: every pod runs ``auditor run --address <ray> -- python train.py``
with the environment a Kubeflow PyTorchJob gives its pods (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, no launcher) and its labels through the downward API. Here two
"pods" are two processes on this machine with that environment and one local Ray; their
auditors meet in the job view, and each gives the verdict of the whole job under the
PyTorchJob's name.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import EXAMPLES, REPO, base_env
from tests.slurm import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def pod_env(rank: int, port: int, labels: Path) -> dict[str, str]:
    env = base_env()
    for name in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "GROUP_RANK", "NODE_RANK"):
        env.pop(name, None)
    env.update(
        # What the training operator sets (MASTER_ADDR is the master pod's service there,
        # ``<job>-master-0``; here the loopback, where the master "pod" listens).
        KUBERNETES_SERVICE_HOST="10.96.0.1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE="2",
        RANK=str(rank),
        PYTHONUNBUFFERED="1",
        # The downward API volume of deploy/kubernetes/pytorchjob.yaml.
        AUDITOR_POD_LABELS=str(labels),
    )
    return env


def test_two_pods_with_no_launcher_give_one_verdict(ray_address: str, tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    labels.write_text(
        'training.kubeflow.org/job-name="mnist-ddp"\n'
        'training.kubeflow.org/operator-name="pytorchjob-controller"\n'
    )
    port = free_port()
    runs = []
    for rank in (0, 1):
        report = tmp_path / f"report-{rank}.json"
        log = open(tmp_path / f"pod-{rank}.log", "w")  # noqa: SIM115
        argv = [sys.executable, "-m", "auditor", "run", "--address", ray_address]
        argv += ["--report", str(report), "--", "python", str(EXAMPLES / "starved_rank.py")]
        argv += ["--seconds", "14", "--fault-rank", "1"]
        proc = subprocess.Popen(
            argv, cwd=REPO, env=pod_env(rank, port, labels), stdout=log, stderr=log
        )
        runs.append((proc, report, log, tmp_path / f"pod-{rank}.log"))
    codes = []
    for proc, _, log, _ in runs:
        try:
            codes.append(proc.wait(300))
        finally:
            log.close()
    texts = [path.read_text() for *_, path in runs]
    assert codes == [0, 0], [t[-3000:] for t in texts]
    host = socket.gethostname()
    for (_, report, _, _), text in zip(runs, texts, strict=True):
        data = json.loads(report.read_text())
        assert data["job"]["name"] == "mnist-ddp", data["job"]
        # Both ranks in each pod's verdict, each under its pod's run.
        hosts = {r["rank"]: r["host"] for r in data["ranks"]}
        assert hosts == {0: f"{host}/rank0", 1: f"{host}/rank1"}, text[-3000:]
        states = {n["node"]: n["state"] for n in data["job"]["nodes"]}
        assert set(states.values()) == {"done"} and len(states) == 2, data["job"]["nodes"]
        starved = [f for f in data["findings"] if f["kind"] == "data_starvation"]
        assert starved and starved[0]["ranks"] == [1], data["findings"]
        assert "joins the job view" in text
