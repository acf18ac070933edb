"""One job across two nodes: Ray's own local multi-node cluster, real torchrun ``--nnodes=2``.

Two Ray nodes on this machine (``node-0``, the head, and ``node-1``, named by their
``auditor_node:<name>`` resource), and per job two ``auditor run --address`` processes, one per
"node" (``AUDITOR_NODE`` picks the Ray node its agent runs on and labels its ranks), each running
``torchrun --nnodes=2 --nproc_per_node=1 --node_rank=i`` over gloo. Both nodes' reports must hold
the whole job, each rank labelled with its node, and the same verdict; a lost node is marked
lost, a killed rank named with its last step, and two jobs on one cluster stay apart.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import EXAMPLES, REPO, base_env
from tests.tmproot import ray_temp_dir

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.timeout(600)

NODES = ("node-0", "node-1")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    temp = ray_temp_dir("mn-")
    os.environ["RAY_AUTH_MODE"] = "disabled"

    def args(name: str) -> dict[str, Any]:
        return {
            "num_cpus": 1,
            "resources": {f"auditor_node:{name}": 1},
            "temp_dir": temp,
            "include_dashboard": False,
            "object_store_memory": 80 * 2**20,
        }

    c = Cluster(initialize_head=True, connect=False, head_node_args=args(NODES[0]))
    c.add_node(**args(NODES[1]))
    c.wait_for_nodes()
    try:
        yield str(c.address)
    finally:
        c.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NodeRun:
    """``auditor run`` of one node of a two-node torchrun job."""

    def __init__(
        self,
        address: str,
        tmp: Path,
        node_rank: int,
        port: int,
        script: str,
        *script_args: str,
        job: str | None = None,
    ) -> None:
        self.report = tmp / f"report-{node_rank}-{port}.json"
        self.html = tmp / f"report-{node_rank}-{port}.html"
        env = base_env()
        env["AUDITOR_NODE"] = NODES[node_rank]
        argv = [sys.executable, "-m", "auditor", "run", "--address", address]
        argv += ["--report", str(self.report), "--html", str(self.html)]
        if job:
            argv += ["--job", job]
        argv += [
            "--",
            "torchrun",
            "--nnodes=2",
            "--nproc_per_node=1",
            f"--node_rank={node_rank}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(EXAMPLES / script),
            *script_args,
        ]
        self.log = tmp / f"run-{node_rank}-{port}.log"
        self._out = open(self.log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=self._out, stderr=self._out)

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._out.close()

    def result(self) -> dict[str, Any]:
        assert self.report.exists(), self.log.read_text()[-3000:]
        data: dict[str, Any] = json.loads(self.report.read_text())
        return data

    def text(self) -> str:
        return self.log.read_text()


def two_nodes(address: str, tmp: Path, script: str, *args: str, **kw: Any) -> list[NodeRun]:
    port = free_port()
    return [NodeRun(address, tmp, i, port, script, *args, **kw) for i in range(2)]


def hosts_of(report: dict[str, Any]) -> dict[int, str]:
    return {int(r["rank"]): str(r["host"]) for r in report["ranks"]}


def warnings(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] in ("warning", "critical")]


def test_starved_rank_on_node_1_is_named_on_both_nodes(cluster: str, tmp_path: Path) -> None:
    runs = two_nodes(cluster, tmp_path, "starved_rank.py", "--seconds", "14", "--fault-rank", "1")
    codes = [r.wait() for r in runs]
    assert codes == [0, 0], [r.text()[-3000:] for r in runs]
    for run in runs:
        report = run.result()
        assert hosts_of(report) == {0: "node-0", 1: "node-1"}, run.text()[-2000:]
        starved = [f for f in report["findings"] if f["kind"] == "data_starvation"]
        assert starved and starved[0]["ranks"] == [1], report["findings"]
        # Rank 0 only waits for rank 1, on the other node: never blamed.
        assert all(0 not in f["ranks"] for f in warnings(report)), report["findings"]
        states = {n["node"]: n["state"] for n in report["job"]["nodes"]}
        assert states == {"node-0": "done", "node-1": "done"}
    verdict = runs[0].text()
    assert "Verdict: balanced" not in verdict


def test_compute_straggler_on_node_1_blamed_on_both(cluster: str, tmp_path: Path) -> None:
    runs = two_nodes(cluster, tmp_path, "slow_forward.py", "--seconds", "14", "--fault-rank", "1")
    assert [r.wait() for r in runs] == [0, 0], [r.text()[-3000:] for r in runs]
    for run in runs:
        report = run.result()
        assert hosts_of(report) == {0: "node-0", 1: "node-1"}
        blamed = {r for f in warnings(report) for r in f["ranks"]}
        assert blamed == {1}, report["findings"]
        assert "compute_straggler" in {f["kind"] for f in warnings(report)}


def test_balanced_two_node_job_gets_no_warning(cluster: str, tmp_path: Path) -> None:
    runs = two_nodes(cluster, tmp_path, "train_ddp.py", "--seconds", "12")
    assert [r.wait() for r in runs] == [0, 0], [r.text()[-3000:] for r in runs]
    for run in runs:
        report = run.result()
        assert hosts_of(report) == {0: "node-0", 1: "node-1"}
        assert warnings(report) == [], report["findings"]
        assert "Verdict: balanced" in run.text()


def test_lost_node_leaves_the_other_report_whole(cluster: str, tmp_path: Path) -> None:
    runs = two_nodes(cluster, tmp_path, "starved_rank.py", "--seconds", "30", "--fault-rank", "1")
    lost = runs[1]
    # Kill node 1's auditor once its status line holds both nodes' ranks (both push samples).
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and ": 2 ranks," not in lost.text():
        time.sleep(0.5)
    assert ": 2 ranks," in lost.text(), lost.text()[-3000:]
    orphans = psutil.Process(lost.proc.pid).children(recursive=True)
    lost.proc.send_signal(signal.SIGKILL)
    lost.wait()
    try:
        assert runs[0].wait() == 0, runs[0].text()[-3000:]
        report = runs[0].result()
        assert hosts_of(report) == {0: "node-0", 1: "node-1"}  # node 1's last samples kept
        states = {n["node"]: n["state"] for n in report["job"]["nodes"]}
        assert states == {"node-0": "done", "node-1": "lost"}
        assert any("node node-1 was lost" in n for n in report["notes"])
        assert not lost.report.exists()
    finally:
        for p in orphans:  # node 1's job, orphaned with its auditor: ours to end
            try:
                p.kill()
            except psutil.Error:
                pass


def test_two_jobs_on_one_cluster_stay_apart(cluster: str, tmp_path: Path) -> None:
    a = two_nodes(cluster, tmp_path, "train_ddp.py", "--seconds", "10", job="job-a")
    b = two_nodes(cluster, tmp_path, "starved_rank.py", "--seconds", "10", job="job-b")
    assert [r.wait() for r in a + b] == [0, 0, 0, 0], [r.text()[-2000:] for r in a + b]
    for run in a:
        report = run.result()
        assert report["job"]["name"] == "job-a"
        assert len(report["ranks"]) == 2  # two ranks: job-b's never merged in
        assert {n["node"] for n in report["job"]["nodes"]} == set(NODES)
        assert not [f for f in report["findings"] if f["kind"] == "data_starvation"]
    for run in b:
        report = run.result()
        assert len(report["ranks"]) == 2
        assert [f["ranks"] for f in report["findings"] if f["kind"] == "data_starvation"] == [[1]]


def test_killed_rank_is_named_on_both_nodes_with_its_last_step(
    cluster: str, tmp_path: Path
) -> None:
    runs = two_nodes(cluster, tmp_path, "train_ddp.py", "--seconds", "40")
    node1 = runs[1]
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and ": 2 ranks," not in node1.text():
        time.sleep(0.5)
    rank1 = [
        p
        for p in psutil.Process(node1.proc.pid).children(recursive=True)
        # The rank: torchrun set its RANK; its loader workers inherit it from the rank.
        if p.environ().get("RANK") == "1" and "RANK" not in p.parent().environ()
    ]
    assert len(rank1) == 1, node1.text()[-2000:]
    rank1[0].send_signal(signal.SIGKILL)
    codes = [r.wait() for r in runs]
    assert codes[1] != 0  # the job's own exit code passes through
    for run in runs:
        report = run.result()
        dead = [d for d in report["job"].get("dead_ranks", []) if d["first"]]
        assert [(d["rank"], d["node"]) for d in dead] == [(1, "node-1")], run.text()[-3000:]
        assert isinstance(dead[0]["last_step"], int) and dead[0]["last_step"] > 0
        assert "Verdict: rank 1 on node-1 died after step" in run.text()
