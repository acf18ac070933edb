"""``auditor run --sd-file``: the run's metrics endpoint is listed for Prometheus' file service
discovery while the job runs, and the file is gone once the run ends, whichever way it ends (a
leftover target would raise AuditorExporterDown). A real Prometheus discovers and scrapes it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import build_parser, main
from auditor.cli.run import run_config
from tests.helpers.waiting import wait_for_service
from tests.servers import Prometheus

from .conftest import REPO, base_env, torchrun

JOB = "train_ddp"


def auditor_run(args: list[str], command: list[str], log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "auditor", "run", *args, "--", *command]
    with open(log, "wb") as out:  # a file, not a pipe nobody drains while polling
        return subprocess.Popen(argv, cwd=REPO, env=base_env(), stdout=out, stderr=out)


def listed(path: Path, proc: subprocess.Popen[bytes], log: Path) -> list[dict[str, Any]]:
    """The SD file's entries, polled while the run is alive (written atomically: all or none)."""

    def read() -> list[dict[str, Any]] | None:
        if proc.poll() is not None:
            raise AssertionError(f"auditor run ended before listing: {log.read_text()[-3000:]}")
        return json.loads(path.read_text()) if path.exists() else None

    return wait_for_service(read, timeout=150, what=f"{path} to be written", every=0.2)


def check_entry(entries: list[dict[str, Any]]) -> str:
    """One entry, the endpoint on 127.0.0.1 (the default bind), without target labels: the
    series carry ``auditor_job`` and ``node`` themselves, and a target label of either name would
    rename theirs to ``exported_*`` under a default scrape."""
    assert len(entries) == 1, entries
    entry = entries[0]
    assert entry == {"targets": entry["targets"], "labels": {}}
    (target,) = entry["targets"]
    host, _, port = target.rpartition(":")
    assert host == "127.0.0.1" and int(port) > 0, target
    return target


def scrape(target: str) -> dict[str, Any]:
    text = urllib.request.urlopen(f"http://{target}/metrics", timeout=5).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def check_scrape(target: str) -> str:
    """The listed target answers with the auditor's series, of this job on one node (the node
    series appear with the agent's first host sample, a second after it starts); returns it."""
    families = wait_for_service(
        lambda: (f := scrape(target)) and "auditor_node_cpu_cores" in f and f,
        timeout=30,
        what=f"node series at {target}",
        every=0.2,
    )
    cores = families["auditor_node_cpu_cores"].samples
    assert {s.labels["auditor_job"] for s in cores} == {JOB}
    (node,) = {s.labels["node"] for s in cores}
    assert node
    return str(node)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[Prometheus, Path]]:
    """Prometheus scraping ``targets/auditor-*.json`` every second, as deploy/ configures it."""
    targets = tmp_path / "targets"
    targets.mkdir()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: auditor-nodes\n"
        "    file_sd_configs:\n"
        f"      - files: ['{targets}/auditor-*.json']\n"
        "        refresh_interval: 1s\n"
    )
    server = Prometheus(tmp_path, config)
    server.start()
    try:
        yield server, targets
    finally:
        server.stop()


def active_targets(server: Prometheus) -> list[dict[str, Any]]:
    body = urllib.request.urlopen(f"{server.url}/api/v1/targets", timeout=5).read()
    return [
        t for t in json.loads(body)["data"]["activeTargets"] if t["scrapePool"] == "auditor-nodes"
    ]


@pytest.mark.e2e
def test_listed_while_running_scraped_by_prometheus_and_removed_at_the_end(
    ray_address: str, prometheus: tuple[Prometheus, Path], tmp_path: Path
) -> None:
    server, targets = prometheus
    sd = targets / f"auditor-run-{JOB}.json"
    log = tmp_path / "run.log"
    report = tmp_path / "r.json"
    args = ["--address", ray_address, "--sd-file", str(sd), "--report", str(report)]
    proc = auditor_run(args, torchrun(f"{JOB}.py", "--seconds", "8"), log)
    try:
        target = check_entry(listed(sd, proc, log))
        node = check_scrape(target)
        # Prometheus finds it through the file and scrapes it (honor_labels at its default, as
        # deploy/ configures it): up, and the auditor's series with the training job in
        # auditor_job, the node in node, each once, and the scrape job in job.
        wait_for_service(
            lambda: server.query(f'up{{job="auditor-nodes",instance="{target}"}} == 1'),
            timeout=60,
            what="Prometheus to scrape the listed target",
            every=0.2,
        )
        series = wait_for_service(
            lambda: server.query(f'auditor_rank_up{{auditor_job="{JOB}"}}'),
            timeout=60,
            what="the ranks' series in Prometheus",
            every=0.2,
        )
        for s in [*series, *server.query(f'auditor_node_cpu_cores{{auditor_job="{JOB}"}}')]:
            labels = s["metric"]
            assert labels["job"] == "auditor-nodes" and labels["instance"] == target
            assert labels["auditor_job"] == JOB and labels["node"] == node
            assert not [name for name in labels if name.startswith("exported_")], labels
        assert {s["metric"]["rank"] for s in series} == {"0", "1"}
        assert not server.query('count({exported_node!=""})')
        assert not server.query('count({exported_auditor_job!=""})')
        assert proc.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"Prometheus target {target} listed in {sd}" in log.read_text()
    assert not sd.exists()
    assert list(targets.iterdir()) == []  # no temporary file left behind either
    assert json.loads(report.read_text())["job"]["exit_code"] == 0
    # Prometheus drops the target once its file is gone: nothing left to raise an alert.
    wait_for_service(
        lambda: active_targets(server) == [],
        timeout=60,
        what="Prometheus to drop the target",
        every=0.2,
    )


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_removed_when_the_run_is_interrupted(
    ray_address: str, tmp_path: Path, sig: signal.Signals
) -> None:
    sd = tmp_path / "targets" / f"auditor-run-{JOB}.json"
    log = tmp_path / "run.log"
    report = tmp_path / "r.json"
    args = ["--address", ray_address, "--sd-file", str(sd), "--report", str(report), "--quiet"]
    proc = auditor_run(args, torchrun(f"{JOB}.py", "--seconds", "120"), log)
    try:
        target = check_entry(listed(sd, proc, log))
        check_scrape(target)
        proc.send_signal(sig)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code != 0, log.read_text()[-3000:]
    assert not sd.exists()
    assert json.loads(report.read_text())["job"]["interrupted"] is True


@pytest.mark.e2e
def test_removed_when_the_job_fails(tmp_path: Path) -> None:
    """A job that exits 3 once it sees itself listed: the run exits 3 and the listing goes."""
    sd = tmp_path / f"auditor-run-{JOB}.json"
    log = tmp_path / "run.log"
    script = (
        "import os, sys, time\n"
        "deadline = time.monotonic() + 60\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "sys.exit(3 if os.path.exists(sys.argv[1]) else 4)\n"
    )
    args = ["--no-ray", "--quiet", "--job", JOB, "--sd-file", str(sd)]
    proc = auditor_run(args, [sys.executable, "-c", script, str(sd)], log)
    try:
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 3, log.read_text()[-3000:]
    assert "Prometheus target 127.0.0.1:" in log.read_text()
    assert not sd.exists()


def test_a_job_that_cannot_start_is_never_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sd = tmp_path / "auditor-run-x.json"
    argv = ["run", "--sd-file", str(sd), "--", "torchrun", "--nproc_per_node=2", "missing.py"]
    assert main(argv) == 2
    assert "script not found" in capsys.readouterr().err
    assert not sd.exists()


@pytest.mark.parametrize(
    ("argv", "env", "port"),
    [
        (["--sd-file", "t.json"], {}, 0),  # implies --metrics-port 0: any free port
        (["--sd-file", "t.json", "--metrics-port", "9411"], {}, 9411),
        ([], {"AUDITOR_SD_FILE": "t.json"}, 0),
        ([], {"AUDITOR_SD_FILE": "t.json", "AUDITOR_METRICS_PORT": "9500"}, 9500),
        ([], {}, None),  # no SD file: no endpoint unless asked for
    ],
)
def test_sd_file_implies_a_metrics_endpoint(
    argv: list[str], env: dict[str, str], port: int | None
) -> None:
    ns = build_parser().parse_args(["run", *argv])
    cfg = run_config(ns, ["true"], env)
    assert cfg.metrics_port == port
    assert cfg.sd_file == ("t.json" if port is not None else None)
