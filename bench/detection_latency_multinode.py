"""Detection latency across nodes: fault onset to the first job-level finding on every node.

One local Ray cluster of two nodes (``ray.cluster_utils.Cluster``: ``node-0`` the head,
``node-1``) on this machine. Two arms, side by side, the same fault (``bench/fault_job.py``: rank
1's reads turn slow ``--fault-after`` seconds in, printing ``FAULT_ONSET <epoch>``):

* single node: one ``auditor run --address`` of ``torchrun --nproc_per_node=2``;
* two nodes: one ``auditor run --address`` per node (``AUDITOR_NODE=node-i``) of ``torchrun
  --nnodes=2 --nproc_per_node=1 --node_rank=i``; rank 1 runs on node-1, so node-0 can only
  learn of it through the job view.

Each run exports its live findings (``--metrics-port 0``); the bench polls every endpoint every
0.2 s for ``auditor_finding{kind="data_starvation",rank="1"}`` and takes the first poll at or
after the onset that reads 1, on each node. Latency = that time - onset; polls that read 1
before the onset are counted as false alarms. Goal: the two-node figure within 1 s of the
single-node one.

    python bench/detection_latency_multinode.py [--repeats 1] [--fault-after 12] [--seconds 35]

Writes bench/results/detection_latency_multinode.json.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from typing import IO, Any

import _common as c

KIND = "data_starvation"
FAULT_RANK = 1
GOAL_GAP_S = 1.0
_ONSET = re.compile(r"^FAULT_ONSET ([0-9.]+) rank=(\d+)")
_METRICS = re.compile(r"metrics at (http://\S+)")


class NodeRun:
    """One ``auditor run``: its onset line, its metrics URL, the first finding time."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.onset: float | None = None
        self.url: str | None = None
        self.held: list[float] = []  # poll times that saw the finding held
        self.tail: list[str] = []
        self.proc = subprocess.Popen(
            argv, env=env, cwd=c.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        threading.Thread(target=self._poll, daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail = [*self.tail, line][-40:]
            m = _ONSET.match(line)
            if m and int(m.group(2)) == FAULT_RANK:
                self.onset = float(m.group(1))
            u = _METRICS.search(line)
            if u:
                self.url = u.group(1)

    def _poll(self) -> None:
        want = f'kind="{KIND}"'
        while self.proc.poll() is None:
            time.sleep(0.2)
            if self.url is None:
                continue
            try:
                with urllib.request.urlopen(self.url, timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                continue
            t = time.time()
            for line in text.splitlines():
                ours = line.startswith("auditor_finding{") and want in line
                if ours and 'rank="1"' in line and line.rstrip().endswith((" 1.0", " 1")):
                    self.held.append(t)
                    break

    def latency(self, onset: float) -> float | None:
        """First poll at or after the onset that saw the finding held, minus the onset."""
        after = [t for t in self.held if t >= onset]
        return after[0] - onset if after else None

    def early(self, onset: float) -> int:
        """Polls before the onset that saw the finding (false alarms)."""
        return sum(1 for t in self.held if t < onset)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(args: argparse.Namespace, *torchrun_args: str) -> list[str]:
    script = os.path.join("bench", "fault_job.py")
    tail = ["--fault-after", str(args.fault_after), "--seconds", str(args.seconds)]
    return [c.tool("torchrun"), *torchrun_args, script, *tail, "--fault-rank", str(FAULT_RANK)]


def arm(address: str, args: argparse.Namespace, nodes: int) -> dict[str, Any]:
    base = [*c.which_auditor(), "run", "--address", address, "--metrics-port", "0"]
    runs: list[NodeRun] = []
    with tempfile.TemporaryDirectory(prefix="bench-mn-") as tmp:
        if nodes == 1:
            env = c.clean_env({"RAY_AUTH_MODE": c.RAY_AUTH_MODE, "AUDITOR_NODE": "node-0"})
            argv = [*base, "--report", os.path.join(tmp, "r.json"), "--"]
            runs.append(NodeRun("node-0", argv + job(args, "--nproc_per_node=2"), env))
        else:
            port = free_port()
            for i in range(nodes):
                env = c.clean_env({"RAY_AUTH_MODE": c.RAY_AUTH_MODE, "AUDITOR_NODE": f"node-{i}"})
                tr = [
                    "--nnodes=2",
                    "--nproc_per_node=1",
                    f"--node_rank={i}",
                    "--master_addr=127.0.0.1",
                    f"--master_port={port}",
                ]
                argv = [*base, "--report", os.path.join(tmp, f"r{i}.json"), "--"]
                runs.append(NodeRun(f"node-{i}", argv + job(args, *tr), env))
        for r in runs:
            try:
                r.proc.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                c.stop_tree(r.proc)
    onset = next((r.onset for r in runs if r.onset is not None), None)
    out: dict[str, Any] = {"onset": onset, "nodes": {}}
    for r in runs:
        latency = None if onset is None else r.latency(onset)
        out["nodes"][r.name] = {
            "exit_code": r.proc.returncode,
            "latency_s": None if latency is None else round(latency, 2),
            "polls_held_before_onset": None if onset is None else r.early(onset),
            "tail": [] if latency is not None else r.tail[-10:],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--fault-after", type=float, default=12.0)
    ap.add_argument("--seconds", type=float, default=35.0)
    ap.add_argument("--timeout", type=float, default=240.0)
    args = ap.parse_args(argv)
    os.environ["RAY_AUTH_MODE"] = c.RAY_AUTH_MODE
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="bmn-")
    # Ray's Cluster writes the head's address under Ray's default temp root whatever temp_dir
    # the nodes get; on a machine where Ray never ran that folder is missing: point the root
    # here, where it exists and goes with the bench.
    os.makedirs(os.path.join(temp, "ray"), exist_ok=True)
    os.environ["RAY_TMPDIR"] = temp

    def node(name: str) -> dict[str, Any]:
        return {
            "num_cpus": 1,
            "resources": {f"auditor_node:{name}": 1},
            "temp_dir": temp,
            "include_dashboard": False,
            "object_store_memory": 80 * 2**20,
        }

    cluster = Cluster(initialize_head=True, connect=False, head_node_args=node("node-0"))
    cluster.add_node(**node("node-1"))
    cluster.wait_for_nodes()
    results: dict[str, list[dict[str, Any]]] = {"single_node": [], "two_nodes": []}
    try:
        for i in range(args.repeats):
            for name, nodes in (("single_node", 1), ("two_nodes", 2)):
                res = arm(str(cluster.address), args, nodes)
                results[name].append(res)
                lat = {n: v["latency_s"] for n, v in res["nodes"].items()}
                print(f"repeat {i + 1} {name}: latency {lat}", flush=True)
    finally:
        cluster.shutdown()

    def lats(name: str, node: str | None = None) -> list[float]:
        return [
            float(v["latency_s"])
            for r in results[name]
            for n, v in r["nodes"].items()
            if v["latency_s"] is not None and (node is None or n == node)
        ]

    single = c.summary(lats("single_node"))
    per_node = {n: c.summary(lats("two_nodes", n)) for n in ("node-0", "node-1")}
    payload = {
        "settings": vars(args),
        "single_node": single,
        "two_nodes": per_node,
        "goal": f"two-node latency within {GOAL_GAP_S} s of single-node on both nodes",
        "runs": results,
    }
    path = c.write_result("detection_latency_multinode", payload)
    print(f"single node: {single}\ntwo nodes: {per_node}\nwritten to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
