"""Where users live: ``auditor run`` on a Ray cluster's node joins that cluster, as Ray's own
tools do, and the runs of one job on one host merge.

A real head started with Ray's own ``ray start --head --block`` (its own process group, so it
and every process it starts are ended after, never with ``ray stop``, which ends every Ray on
the machine). Its temp dir comes from :func:`tests.tmproot.ray_temp_dir`, not ``tmp_path``:
Ray's Unix socket paths must stay under 107 bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import EXAMPLES, REPO, base_env, run_auditor, torchrun
from tests.e2e.test_multinode import free_port, hosts_of
from tests.tmproot import ray_temp_dir

pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(600)

AGENT_LINE = "auditor: node agent on the Ray cluster at {address} (from {source})"


def _listed(temp: str) -> list[psutil.Process]:
    """The processes whose command line names ``temp``: the head's, and what they started."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(temp in a for a in p.info["cmdline"] or ()):
            found.append(p)
    return found


def _end(head: subprocess.Popen[bytes], temp: str) -> None:
    """End the head: SIGTERM to its group (Ray's graceful stop), then SIGKILL what is left."""
    try:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    head.wait(10)
    for p in _listed(temp):  # anything that left the group (Ray workers start their own)
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A Ray head started with Ray's own CLI; its GCS address."""
    temp = ray_temp_dir("rh-")
    port = free_port()
    env = base_env()
    log = open(os.path.join(temp, "head.log"), "wb")  # noqa: SIM115
    argv = ["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=1"]
    argv += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]
    head = subprocess.Popen(
        [*argv, "--node-ip-address=127.0.0.1"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline and "--block" not in text:
            assert head.poll() is None, Path(temp, "head.log").read_text()[-3000:]
            time.sleep(0.5)
            text = Path(temp, "head.log").read_text()
        assert "--block" in text, text[-3000:]  # Ray says so once the head is up
        yield address
    finally:
        _end(head, temp)
        log.close()
        assert not _listed(temp), "processes of the head still run"
        shutil.rmtree(temp, ignore_errors=True)


def _actor_classes(address: str) -> list[str]:
    """The class names of every actor the cluster's GCS knows, dead ones too, read by a
    separate driver (this test process may hold the session's Ray)."""
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "from ray._private.state import actors\n"
        "print(json.dumps([a.get('ActorClassName') for a in actors().values()]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=base_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return names


def test_ray_address_is_the_cluster_run_joins(ray_head: str, tmp_path: Path) -> None:
    env = base_env()
    env["RAY_ADDRESS"] = ray_head
    run = run_auditor(
        ["--quiet"],
        torchrun("starved_rank.py", "--seconds", "10", "--fault-rank", "1"),
        tmp=tmp_path,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert AGENT_LINE.format(address=ray_head, source="RAY_ADDRESS") in run.stderr
    assert not [n for n in (run.report or {}).get("notes", []) if "in-process" in n]
    starved = run.findings("data_starvation")
    assert starved and starved[0]["ranks"] == [1], run.findings()
    # The agent was an actor of that cluster, not of a Ray of the run's own.
    assert "NodeAgentCore" in _actor_classes(ray_head)


def test_a_dead_ray_address_is_an_error_before_the_job_starts(tmp_path: Path) -> None:
    env = base_env()
    dead = f"127.0.0.1:{free_port()}"
    env["RAY_ADDRESS"] = dead
    started = tmp_path / "job-started"
    ray_dir = tmp_path / "ray"  # where an embedded Ray of this run would live
    argv = [sys.executable, "-m", "auditor", "run", "--ray-temp-dir", str(ray_dir), "--"]
    argv += [sys.executable, "-c", f"open({str(started)!r}, 'w').close()"]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        f"auditor: error: cannot reach the Ray cluster at {dead} (from RAY_ADDRESS)"
    )
    assert time.monotonic() - t0 < 30  # refused at once, not after Ray's minutes of retries
    assert not started.exists()  # the job never ran
    assert not ray_dir.exists() and not _listed(str(ray_dir))  # no Ray started either


def test_two_torchrun_agents_of_one_job_on_one_host_merge(ray_head: str, tmp_path: Path) -> None:
    """``torchrun --nnodes=2 --node_rank=0|1`` on 127.0.0.1, each under its own ``auditor run
    --address`` on one Ray node, no AUDITOR_NODE: one job, both reports hold every rank."""
    port = free_port()
    env = base_env()
    env.pop("AUDITOR_NODE", None)
    procs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    for node_rank in (0, 1):
        report = tmp_path / f"report-{node_rank}.json"
        log = tmp_path / f"run-{node_rank}.log"
        argv = [sys.executable, "-m", "auditor", "run", "--address", ray_head, "--quiet"]
        argv += ["--report", str(report), "--", "torchrun", "--nnodes=2", "--nproc_per_node=1"]
        argv += [f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}"]
        argv += [str(EXAMPLES / "starved_rank.py"), "--seconds", "12", "--fault-rank", "1"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=out)
        procs.append((proc, report, log))
    try:
        codes = [p.wait(240) for p, _, _ in procs]
    finally:
        for p, _, _ in procs:
            if p.poll() is None:
                p.kill()
    logs = [log.read_text() for _, _, log in procs]
    assert codes == [0, 0], [text[-3000:] for text in logs]
    for (_, report_path, _), text in zip(procs, logs, strict=True):
        report: dict[str, Any] = json.loads(report_path.read_text())
        hosts = hosts_of(report)
        assert sorted(hosts) == [0, 1], text[-3000:]
        assert hosts[0] != hosts[1] and hosts[1].endswith("/node1"), hosts
        starved = [f for f in report["findings"] if f["kind"] == "data_starvation"]
        assert starved and starved[0]["ranks"] == [1], report["findings"]
        assert "Verdict: balanced" not in text
