"""The fleet on Ray's own local multi-node cluster (ray.cluster_utils.Cluster), GPUs recorded.

One cluster for the module: node-a (head) and node-b with 2 recorded GPUs each, named by their
``auditor_node:<name>`` custom resource; node-c (2 GPUs) joins later and then leaves. Checks:
exactly one GpuMonitor per GPU, each on its node; a killed monitor is restarted by Ray and the gap
shows on the endpoint (``auditor_gpu_up`` 0 then 1, the last-sample timestamp holds then jumps);
a node that joins gets its agent and monitors and appears in the service-discovery file, a node
that leaves disappears from it; every endpoint parses into catalog series and passes
``promtool check metrics``; ``auditor fleet`` itself runs until SIGTERM and removes its actors.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.metrics import catalog as C
from tests.helpers.gpus import gpu_uuid, write_gpus
from tests.helpers.tools import require_tool
from tests.helpers.units import GIB
from tests.helpers.waiting import wait_for
from tests.tmproot import ray_temp_dir

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
GPUS = {"node-a": 2, "node-b": 2, "node-c": 2}
NAMESPACE = "auditor-fleet-tests"


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


def gpu_series(text: str) -> dict[tuple[str, str, str], float]:
    """(metric, uuid, reason) -> value of the auditor_gpu_* samples."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("auditor_gpu_"):
                out[(s.name, s.labels["uuid"], s.labels.get("reason", ""))] = s.value
    return out


def gpu_value(url: str, name: str, uuid: str) -> float | None:
    try:
        return gpu_series(fetch(url)).get((name, uuid, ""))
    except OSError:
        return None


def node_args(temp: str, name: str) -> dict[str, Any]:
    return {
        "num_cpus": 1,
        "resources": {f"auditor_node:{name}": 1},
        "temp_dir": temp,
        "include_dashboard": False,
        "object_store_memory": 80 * 2**20,
    }


class Env:
    def __init__(self, cluster: Cluster, temp: str, spec: str, sd: Path) -> None:
        self.cluster = cluster
        self.temp = temp
        self.spec = spec
        self.sd = sd
        self.node_c: Any = None

    def sd_nodes(self, path: Path | None = None) -> dict[str, str]:
        """Node name -> listed target. The entries carry no target labels (a default scrape
        would rename the series' own ``node``): a target's node is the one its series carry,
        as Prometheus sees it. A listed target that does not answer (yet, or any more) is
        keyed ``unanswered HOST:PORT``, so a comparison waits for the file, not the endpoint."""
        try:
            entries = json.loads((path or self.sd).read_text())
        except (OSError, ValueError):
            return {}
        out = {}
        for e in entries:
            assert e["labels"] == {}, e
            (target,) = e["targets"]
            node = served_node(target)
            out[f"unanswered {target}" if node is None else node] = target
        return out


def served_node(target: str) -> str | None:
    """The node the endpoint at ``target`` names in its GPU series; None while it does not
    answer or has none yet."""
    try:
        text = fetch(f"http://{target}/metrics")
    except OSError:
        return None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "node" in s.labels and s.name.startswith("auditor_gpu_"):
                return str(s.labels["node"])
    return None


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    temp = ray_temp_dir("fl-")
    data = tmp_path_factory.mktemp("fleet")
    spec = write_gpus(data / "gpus.jsonl", GPUS, seconds=5)
    cluster = Cluster(initialize_head=True, head_node_args=node_args(temp, "node-a"))
    try:
        cluster.add_node(**node_args(temp, "node-b"))
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        yield Env(cluster, temp, spec, data / "sd" / "targets.json")
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet(env: Env) -> Iterator[Any]:
    from auditor.cluster.fleet import Fleet

    f = Fleet(
        device_source=env.spec,
        sd_file=str(env.sd),
        sample_interval_s=0.25,
        gpu_timeout_s=0.5,
        watch_interval_s=1.0,
    )
    f.start()
    try:
        yield f
    finally:
        f.stop()


def by_name(fleet: Any) -> dict[str, Any]:
    return {d.name: d for d in fleet.deployments().values()}


def check_endpoint(url: str, node: str, uuids: set[str]) -> None:
    """Parsed series: catalog names, labels and units; every GPU up; promtool clean."""
    text = fetch(url)
    per_gpu: dict[str, int] = {}
    for fam in text_string_to_metric_families(text):
        spec = C.BY_NAME[fam.name + "_total" if fam.type == "counter" else fam.name]
        assert fam.type == spec.type and fam.documentation == spec.help
        for s in fam.samples:
            assert sorted(s.labels) == sorted(spec.labels), s
            assert s.labels["node"] == node
            if fam.name.startswith("auditor_gpu_"):
                per_gpu[s.labels["uuid"]] = per_gpu.get(s.labels["uuid"], 0) + 1
                assert s.labels["model"] and s.labels["gpu"] in ("0", "1")
                assert s.labels["auditor_job"] == "" and s.labels["rank"] == ""  # no rank owns them
    assert set(per_gpu) == uuids
    assert max(per_gpu.values()) <= C.GPU_SERIES_BUDGET
    series = gpu_series(text)
    for uuid in uuids:
        assert series[("auditor_gpu_up", uuid, "")] == 1
        assert 0 <= series[("auditor_gpu_utilization_ratio", uuid, "")] <= 1
        assert series[("auditor_gpu_sm_clock_hertz", uuid, "")] == 1410e6  # MHz -> Hz
        assert series[("auditor_gpu_memory_total_bytes", uuid, "")] == 80 * GIB
        assert series[("auditor_gpu_power_limit_watts", uuid, "")] == 400.0
        ts = series[("auditor_gpu_last_sample_timestamp_seconds", uuid, "")]
        assert abs(ts - time.time()) < 30  # replayed in real time, not the recording's epoch
    assert "auditor_node_cpu_cores" in text
    proc = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", proc.stdout


def test_one_monitor_per_gpu_each_on_its_node(env: Env, fleet: Any) -> None:
    nodes = by_name(fleet)
    assert set(nodes) == {"node-a", "node-b"}
    assert len({d.node_id for d in nodes.values()}) == 2
    seen: list[str] = []
    for name, d in nodes.items():
        expected = {gpu_uuid(name, i) for i in range(GPUS[name])}
        assert set(d.monitors) == expected
        for uuid, handle in d.monitors.items():
            info = ray.get(handle.info.remote(), timeout=60)
            assert info["uuid"] == uuid and info["node"] == name
            assert info["ray_node_id"] == d.node_id  # pinned to the node whose GPU it reads
            seen.append(uuid)
        agent = ray.get(d.agent.address.remote(), timeout=60)
        assert agent["ray_node_id"] == d.node_id and agent["node"] == name
    assert sorted(seen) == sorted(set(seen))  # exactly one monitor per GPU
    # Named actors: a second monitor for the same GPU cannot exist.
    for uuid in seen:
        assert ray.get_actor(f"auditor-fleet-gpu-{uuid}") is not None


def test_endpoints_serve_catalog_series_clean_under_promtool(env: Env, fleet: Any) -> None:
    for name, d in by_name(fleet).items():
        uuids = set(d.monitors)
        wait_for(
            lambda d=d, uuids=uuids: all(
                gpu_value(d.metrics_url, "auditor_gpu_up", u) == 1 for u in uuids
            ),
            timeout=60,
            every=0.1,
        )
        check_endpoint(d.metrics_url, name, uuids)
    assert env.sd_nodes() == {
        name: d.metrics_url.split("//")[1].split("/")[0] for name, d in by_name(fleet).items()
    }


def test_killed_monitor_is_restarted_and_the_gap_shows(env: Env, fleet: Any) -> None:
    d = by_name(fleet)["node-b"]
    victim, other = gpu_uuid("node-b", 1), gpu_uuid("node-b", 0)
    url = d.metrics_url
    handle = d.monitors[victim]
    before = ray.get(handle.info.remote(), timeout=60)
    wait_for(lambda: gpu_value(url, "auditor_gpu_up", victim) == 1, timeout=60, every=0.1)
    ts_before = gpu_value(url, "auditor_gpu_last_sample_timestamp_seconds", victim)
    assert ts_before is not None

    ray.kill(handle, no_restart=False)

    def down() -> dict[tuple[str, str, str], float] | None:
        series = gpu_series(fetch(url))
        return series if series.get(("auditor_gpu_up", victim, "")) == 0 else None

    down_seen = wait_for(down, timeout=30, every=0.05)
    ts_down = down_seen[("auditor_gpu_last_sample_timestamp_seconds", victim, "")]
    assert ts_down >= ts_before  # kept, not dropped, while the monitor is gone
    assert ("auditor_gpu_utilization_ratio", victim, "") not in down_seen  # not read as idle
    assert down_seen[("auditor_gpu_up", other, "")] == 1  # its neighbour is unaffected

    wait_for(lambda: gpu_value(url, "auditor_gpu_up", victim) == 1, timeout=60, every=0.1)
    ts_after = gpu_value(url, "auditor_gpu_last_sample_timestamp_seconds", victim)
    assert ts_after is not None and ts_after > ts_down
    after = ray.get(handle.info.remote(), timeout=60)  # the same handle: Ray restarted it
    assert after["pid"] != before["pid"] and after["ray_node_id"] == d.node_id
    assert after["started"] > before["started"]


def test_node_that_joins_gets_agent_monitors_and_sd_entry(env: Env, fleet: Any) -> None:
    env.node_c = env.cluster.add_node(**node_args(env.temp, "node-c"))
    wait_for(lambda: "node-c" in env.sd_nodes(), timeout=90, every=0.25)
    d = by_name(fleet)["node-c"]
    assert d.node_id == env.node_c.node_id
    assert set(d.monitors) == {gpu_uuid("node-c", 0), gpu_uuid("node-c", 1)}
    for handle in d.monitors.values():
        assert ray.get(handle.info.remote(), timeout=60)["ray_node_id"] == d.node_id
    assert env.sd_nodes()["node-c"] == d.metrics_url.split("//")[1].split("/")[0]
    wait_for(
        lambda: all(gpu_value(d.metrics_url, "auditor_gpu_up", u) == 1 for u in d.monitors),
        timeout=60,
        every=0.1,
    )
    check_endpoint(d.metrics_url, "node-c", set(d.monitors))


def test_node_that_leaves_is_dropped(env: Env, fleet: Any) -> None:
    assert env.node_c is not None, "runs after the node-c test"
    env.cluster.remove_node(env.node_c)
    wait_for(lambda: set(env.sd_nodes()) == {"node-a", "node-b"}, timeout=90, every=0.25)
    assert set(by_name(fleet)) == {"node-a", "node-b"}


def test_fleet_command_runs_until_sigterm_and_removes_its_actors(env: Env, fleet: Any) -> None:
    fleet.stop()  # the in-process fleet goes first: one monitor per GPU at any time
    assert env.sd_nodes() == {} and json.loads(env.sd.read_text()) == []
    gone = f"auditor-fleet-gpu-{gpu_uuid('node-a', 0)}"
    wait_for(lambda: _actor_gone(gone, NAMESPACE), timeout=30, every=0.1)

    sd = env.sd.parent / "cli.json"
    cmd = [
        sys.executable, "-m", "auditor", "fleet", "--address", env.cluster.address,
        "--device-source", env.spec, "--sd-file", str(sd), "--sample-interval", "0.5",
        "--watch-interval", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        targets = wait_for(
            lambda: env.sd_nodes(sd) if set(env.sd_nodes(sd)) == {"node-a", "node-b"} else None,
            timeout=120,
            every=0.25,
        )
        uuid = gpu_uuid("node-a", 1)
        url = f"http://{targets['node-a']}/metrics"
        wait_for(lambda: gpu_value(url, "auditor_gpu_up", uuid) == 1, timeout=60, every=0.1)
        assert ray.get_actor(f"auditor-fleet-gpu-{uuid}", namespace="auditor") is not None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "fleet stopped" in out
    assert json.loads(sd.read_text()) == []
    with pytest.raises(OSError):
        fetch(url)
    wait_for(lambda: _actor_gone(f"auditor-fleet-gpu-{uuid}", "auditor"), timeout=30, every=0.1)


def _actor_gone(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return True
    return False
