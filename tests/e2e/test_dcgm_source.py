"""dcgm-exporter as the GPU source, end to end, every part real and on 127.0.0.1.

* ``auditor replay --gpu-source dcgm`` for three recorded GPU jobs: each serves its ranks as
  ``auditor run --gpu-source dcgm`` would (no ``auditor_gpu_*`` series, the ranks' GPU UUIDs in
  ``auditor_gpu_owner_info``) and its GPUs as dcgm-exporter serves them (``DCGM_FI_*`` names,
  its labels ``gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION`` and
  its units: %, MiB, MHz), on a second port. throttled_gpu and input_bound_4gpu serve
  dcgm-exporter's default counters only, and throttled_gpu's ``Hostname`` is not the auditor's
  node name (a GPU a rank uses takes the rank's node); idle_allocated_gpu serves the auditor's
  counters file (throttle reasons, maximum clocks, power limit, PCIe link) and has a GPU no rank
  uses, found on its node by ``Hostname``.
* Prometheus (Debian's package) scraping both kinds of endpoint with a default scrape config and
  the shipped rules (which record DCGM's series as ``auditor_gpu_*``);
* ``auditor serve`` with its default ``--gpu-source auto``: it finds the DCGM series by asking.

The verdicts must be the recordings' own (the recorded NVML source, ``auditor analyze``): the
same finding kinds on the same ranks.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from auditor.metrics.catalog import DCGM_ONLY
from auditor.ops.alerts import referenced_metrics
from auditor.ops.dashboard_queries import queries, substitute
from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_for_service
from tests.servers import Prometheus, free_port, http_json

from .conftest import REPO, base_env

pytestmark = pytest.mark.e2e

# scenario -> (dcgm counters served, dcgm-exporter's Hostname; None: the node's own name)
REPLAYS: dict[str, tuple[str, str | None]] = {
    "throttled_gpu": ("default", "dgx-throttled"),
    "idle_allocated_gpu": ("auditor", None),
    "input_bound_4gpu": ("default", None),
}


@dataclass
class Stack:
    prometheus: Prometheus
    serve_url: str
    workdir: Path

    def job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(http_json(self.serve_url + "/api/v1/jobs/" + urllib.parse.quote(name)))
        except Exception:
            return None


def _start(argv: list[str], log: Path) -> subprocess.Popen[str]:
    out = open(log, "w")  # noqa: SIM115 (closed with the process by the OS at teardown)
    return subprocess.Popen(
        argv, cwd=REPO, env=base_env(), stdout=out, stderr=subprocess.STDOUT, text=True
    )


def _stop(proc: subprocess.Popen[str]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_tool("prometheus")
    workdir = tmp_path_factory.mktemp("dcgm")
    procs: list[subprocess.Popen[str]] = []
    node_ports, dcgm_ports = [], []
    for name, (counters, hostname) in REPLAYS.items():
        port, dcgm_port = free_port(), free_port()
        node_ports.append(port)
        dcgm_ports.append(dcgm_port)
        argv = [
            sys.executable, "-m", "auditor", "replay",
            str(REPO / "tests/data" / name / "recording.jsonl"),
            "--loop", "--as-node", f"replay-{name}", "--metrics-port", str(port),
            "--gpu-source", "dcgm", "--dcgm-port", str(dcgm_port), "--dcgm-counters", counters,
        ]  # fmt: skip
        if hostname:
            argv += ["--dcgm-hostname", hostname]
        procs.append(_start(argv, workdir / f"replay-{name}.log"))
    config = workdir / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(REPO / "deploy/prometheus/rules/auditor.rules.yml")],
                "scrape_configs": [
                    {
                        "job_name": "auditor-nodes",
                        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in node_ports]}],
                    },
                    {
                        "job_name": "dcgm-exporter",
                        "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in dcgm_ports]}],
                    },
                ],
            }
        )
    )
    prometheus = Prometheus(workdir, config)
    prometheus.start()
    serve_port = free_port()
    serve_log = workdir / "serve.log"
    # The default --gpu-source auto: serve finds the DCGM series by asking Prometheus.
    serve_argv = [sys.executable, "-m", "auditor", "serve", "--prometheus-url", prometheus.url]
    serve_argv += ["--port", str(serve_port), "--interval", "2", "--window", "30"]
    serve = _start([*serve_argv, "--max-backoff", "2"], serve_log)
    try:
        yield Stack(prometheus, f"http://127.0.0.1:{serve_port}", workdir)
    finally:
        code = _stop(serve)
        for p in procs:
            _stop(p)
        prometheus.stop()
        assert code == 0, serve_log.read_text()[-3000:]


def _kinds(job: dict[str, Any], *, at_least: str = "warning") -> dict[str, list[int]]:
    order = ["info", "warning", "critical"]
    return {
        f["kind"]: sorted(f["ranks"])
        for f in job["findings"]
        if order.index(f["severity"]) >= order.index(at_least)
    }


def test_prometheus_holds_dcgm_series_and_no_auditor_gpu_series_scraped(stack: Stack) -> None:
    wait_for_service(
        lambda: (
            stack.prometheus.query("DCGM_FI_DEV_GPU_UTIL")
            and stack.prometheus.query("auditor_gpu_owner_info")
        ),
        timeout=60,
        what="DCGM series and the ranks' GPU owner series",
    )
    util = stack.prometheus.query("DCGM_FI_DEV_GPU_UTIL")
    labels = util[0]["metric"]
    assert {"gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"} <= set(
        labels
    )
    assert labels["job"] == "dcgm-exporter"
    # The node endpoints export no GPU of their own: every auditor_gpu_* is recorded from DCGM.
    assert not stack.prometheus.query('auditor_gpu_up{job!=""}')
    assert stack.prometheus.query('auditor_gpu_owner_info{job="auditor-nodes"}')


def test_serve_finds_the_recorded_nvml_verdict_on_dcgm_series(stack: Stack) -> None:
    for name in REPLAYS:
        analyzed = subprocess.run(
            [sys.executable, "-m", "auditor", "analyze", "--json",
             str(REPO / "tests/data" / name / "recording.jsonl")],
            cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        want = _kinds(json.loads(analyzed.stdout))
        assert want, f"{name}: the recording's verdict has no warning"

        def agrees(name: str = name, want: dict[str, list[int]] = want) -> dict[str, Any] | None:
            job = stack.job(name)
            return job if job and _kinds(job) == want else None

        job = wait_for_service(
            agrees, timeout=150, what=f"{name}: serve's verdict {want} (last: {stack.job(name)})"
        )
        if name == "throttled_gpu":
            # Found from DCGM's default counters: the GPU's clock against its model's peak.
            [straggler] = [f for f in job["findings"] if f["kind"] == "hardware_straggler"]
            assert straggler["ranks"] == [2]
            [gpu] = straggler["evidence"]["gpus"]
            # The rank's node, not dcgm-exporter's Hostname.
            assert (gpu["node"], gpu["index"]) == ("replay-throttled_gpu", 2)


def test_dashboard_gpu_panels_return_dcgm_data(stack: Stack) -> None:
    wait_for_service(
        lambda: stack.prometheus.query("auditor:job_gpu_utilization:spread5m"),
        timeout=120,
        what="the recorded GPU series",
    )
    nodes = sorted({f"replay-{name}" for name in REPLAYS})
    values = [
        {"job": job, "node": node, "rank": rank, "serve_url": stack.serve_url}
        for job in [*REPLAYS, "All"]
        for node in [*nodes, "All"]
        for rank in ("All", "0", "2")
    ]
    gpu_names = ("auditor_gpu_", "auditor:job_gpu", "auditor:node_job_gpu", "auditor:gpu_")
    # DCGM's profiling fields: a recording has none, so the exposition of recorded GPUs serves
    # none (tests/metrics/test_dcgm.py; deploy/prometheus/tests/auditor_achieved.test.yml feeds
    # them to the rules).
    profiling = {s.name for s in DCGM_ONLY}
    checked, empty = 0, []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for title, expr in queries(board):
            names = referenced_metrics(expr)
            if not any(n.startswith(gpu_names) for n in names) or names <= profiling:
                continue
            checked += 1
            if not any(stack.prometheus.query(substitute(expr, v)) for v in values):
                empty.append(f"{path.name}: {title}: {expr}")
    assert checked >= 5
    assert not empty, "GPU panels with no series on the dcgm source:\n" + "\n".join(empty)


def test_serve_reads_dcgm_series_directly_without_the_rules(stack: Stack) -> None:
    """``--gpu-source dcgm``: serve's own PromQL over the DCGM_FI_* series (the test above read
    the rules' auditor_gpu_* records of them, which auto prefers), same verdicts."""
    want = {}
    for name in REPLAYS:
        analyzed = subprocess.run(
            [sys.executable, "-m", "auditor", "analyze", "--json",
             str(REPO / "tests/data" / name / "recording.jsonl")],
            cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        want[name] = _kinds(json.loads(analyzed.stdout))

    def once() -> dict[str, dict[str, list[int]]] | None:
        proc = subprocess.run(
            [sys.executable, "-m", "auditor", "serve", "--once", "--gpu-source", "dcgm",
             "--window", "30", "--prometheus-url", stack.prometheus.url],
            cwd=REPO, env=base_env(), capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        got = {j["job"]: _kinds(j) for j in json.loads(proc.stdout)["jobs"]}
        return got if got == want else None

    wait_for_service(once, timeout=120, what=f"serve --once --gpu-source dcgm: {want}", every=5)
