"""GPU monitors and the agent's GPU path without Ray: recorded GPUs, real threads, the real
Prometheus endpoint of the node agent. (With Ray: tests/cluster/test_fleet_multinode.py.)"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.cli import main
from auditor.cli.fleet import FLEET_OPTIONS
from auditor.cli.options import device_source
from auditor.cluster.agent import NodeAgentCore
from auditor.cluster.fleet import node_name
from auditor.cluster.monitor import GpuMonitorCore, discover_devices, pull_latest
from auditor.cluster.runtime import InProcessAgent
from auditor.files import write_text_atomic
from auditor.samples import DeviceSample
from auditor.telemetry.sources import RecordedDeviceSource
from tests.helpers.clocks import Clock
from tests.helpers.gpus import MODEL, gpu_uuid, write_gpus
from tests.helpers.scrape import scrape, value
from tests.helpers.waiting import wait_for
from tests.probe import short_dir

NODE = "node-a"


@pytest.fixture
def spec(tmp_path: Path) -> str:
    return write_gpus(tmp_path / "gpus.jsonl", {NODE: 2, "node-b": 1})


@pytest.fixture
def sink_dir() -> Iterator[str]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Flaky:
    """A monitor stand-in whose answers can be switched off (a dead or restarting monitor)."""

    def __init__(self, core: GpuMonitorCore) -> None:
        self.core = core
        self.down = threading.Event()

    def latest(self) -> DeviceSample | None:
        if self.down.is_set():
            raise RuntimeError("monitor unreachable")
        return self.core.latest()


# --- the monitor ---------------------------------------------------------------------------------
def test_monitor_samples_its_gpu_at_once_and_reports_itself(spec: str) -> None:
    clock = Clock(5000.0)
    path = spec.removeprefix("recorded:")
    source = RecordedDeviceSource(path, NODE, clock=clock)
    m = GpuMonitorCore(node=NODE, uuid=gpu_uuid(NODE, 1), interval_s=3600, source=source)
    try:
        wait_for(lambda: m.latest() is not None)
        first = m.latest()
        assert first is not None
        assert (first.node, first.index, first.uuid, first.model) == (
            NODE,
            1,
            gpu_uuid(NODE, 1),
            MODEL,
        )
        assert first.time == 5000.0 and first.gpu_util == pytest.approx(0.6)
        clock.t = 5002.0
        assert m.sample_once() is not None and m.latest().time == 5002.0  # type: ignore[union-attr]
        info = m.info()
        assert info["uuid"] == gpu_uuid(NODE, 1) and info["index"] == 1 and info["model"] == MODEL
        assert info["pid"] == os.getpid() and info["ray_node_id"] is None
        assert info["samples"] >= 2 and info["errors"] == 0
    finally:
        m.stop()


def test_monitor_builds_its_source_from_the_spec(spec: str) -> None:
    m = GpuMonitorCore(source_spec=spec, node=NODE, uuid=gpu_uuid(NODE, 0), interval_s=0.05)
    try:
        wait_for(lambda: (m.info()["samples"] or 0) >= 3)
        assert m.latest() is not None and m.latest().uuid == gpu_uuid(NODE, 0)  # type: ignore[union-attr]
    finally:
        m.stop()


def test_monitor_reports_its_sampling_threads_cpu(spec: str) -> None:
    m = GpuMonitorCore(source_spec=spec, node=NODE, uuid=gpu_uuid(NODE, 0), interval_s=0.01)
    try:
        wait_for(lambda: m.info()["sampling_cpu_s"] > 0)
        info = m.info()
        # The thread's own CPU: never more than one core's worth of wall time.
        assert 0 < info["sampling_cpu_per_s"] <= 1.5
    finally:
        m.stop()


def test_failed_read_keeps_the_last_sample_and_counts(spec: str) -> None:
    m = GpuMonitorCore(source_spec=spec, node=NODE, uuid="GPU-unknown", interval_s=3600)
    try:
        wait_for(lambda: m.info()["errors"] == 1)
        assert m.latest() is None
        assert "KeyError" in (m.info()["last_error"] or "")
    finally:
        m.stop()


def test_discover_devices(spec: str) -> None:
    gpus, note = discover_devices(spec, NODE)
    assert note is None
    assert [(g.index, g.uuid, g.model) for g in gpus] == [
        (0, gpu_uuid(NODE, 0), MODEL),
        (1, gpu_uuid(NODE, 1), MODEL),
    ]
    assert discover_devices(spec, "node-z")[0] == []  # the recording does not mention it
    with pytest.raises(ValueError, match="unknown device source 'bogus'"):
        discover_devices("bogus", NODE)


def test_nvml_discovery_never_raises() -> None:
    gpus, note = discover_devices("nvml", NODE)  # no driver here: no GPUs and a reason
    assert isinstance(gpus, list)
    assert gpus or note


def test_pull_latest_turns_failures_into_none(spec: str) -> None:
    m = GpuMonitorCore(source_spec=spec, node=NODE, uuid=gpu_uuid(NODE, 0), interval_s=3600)
    flaky = Flaky(m)
    try:
        wait_for(lambda: m.latest() is not None)
        flaky.down.set()
        got = pull_latest({"a": m, "b": flaky}, timeout_s=1.0)
        assert got["a"] is not None and got["b"] is None
    finally:
        m.stop()


# --- the agent's GPU path ------------------------------------------------------------------------
def test_agent_exports_drains_and_marks_a_silent_monitor_down(spec: str) -> None:
    cores = {
        gpu_uuid(NODE, i): GpuMonitorCore(
            source_spec=spec, node=NODE, uuid=gpu_uuid(NODE, i), interval_s=0.05
        )
        for i in range(2)
    }
    flaky = Flaky(cores[gpu_uuid(NODE, 1)])
    agent = NodeAgentCore(
        job="j", sink_path=None, host=NODE, metrics_port=0, sample_interval_s=0.05
    )
    agent.start()
    try:
        url = agent.address()["metrics"]
        assert agent.address()["sink"] is None
        gpus, _ = discover_devices(spec, NODE)
        agent.attach_gpus(
            gpus, {gpu_uuid(NODE, 0): cores[gpu_uuid(NODE, 0)], flaky.core.uuid: flaky}
        )
        g1 = {"node": NODE, "gpu": "1", "uuid": gpu_uuid(NODE, 1), "model": MODEL}
        wait_for(lambda: value(scrape(url), "auditor_gpu_up", **g1) == 1)
        series = scrape(url)
        assert value(series, "auditor_gpu_utilization_ratio", **g1) == pytest.approx(0.6)
        assert value(series, "auditor_gpu_sm_clock_hertz", **g1) == 1410e6
        assert value(series, "auditor_gpu_throttle_active", reason="sw_power_cap", **g1) == 1
        assert value(series, "auditor_gpu_up", gpu="0") == 1

        # every fresh sample reaches the driver exactly once
        batch = agent.drain()
        assert {d.uuid for d in batch.devices} == set(cores)
        seen = [(d.uuid, d.time) for d in batch.devices]
        assert len(seen) == len(set(seen))
        again = agent.drain()
        assert not {(d.uuid, d.time) for d in again.devices} & set(seen)

        flaky.down.set()
        wait_for(lambda: value(scrape(url), "auditor_gpu_up", **g1) == 0)
        down = scrape(url)
        ts_down = value(down, "auditor_gpu_last_sample_timestamp_seconds", **g1)
        assert ts_down is not None
        assert value(down, "auditor_gpu_utilization_ratio", **g1) is None  # not read as idle
        assert value(down, "auditor_gpu_up", gpu="0") == 1
        assert agent.gpus()[gpu_uuid(NODE, 1)]["up"] is False

        flaky.down.clear()
        wait_for(lambda: value(scrape(url), "auditor_gpu_up", **g1) == 1)
        ts_up = value(scrape(url), "auditor_gpu_last_sample_timestamp_seconds", **g1)
        assert ts_up > ts_down
    finally:
        agent.stop()
        for c in cores.values():
            c.stop()


def test_in_process_agent_starts_monitors_for_its_node(spec: str, sink_dir: str) -> None:
    agent = InProcessAgent(
        device_source=spec,
        job="j",
        sink_path=os.path.join(sink_dir, "s.sock"),
        host=NODE,
        metrics_port=0,
        sample_interval_s=0.1,
    )
    try:
        assert set(agent.monitors) == {gpu_uuid(NODE, 0), gpu_uuid(NODE, 1)}
        wait_for(lambda: {d.uuid for d in agent.drain().devices} == set(agent.monitors))
    finally:
        agent.stop()


def test_in_process_agent_without_gpus(sink_dir: str) -> None:
    agent = InProcessAgent(
        device_source="nvml", job="j", sink_path=os.path.join(sink_dir, "s.sock"), host=NODE
    )
    try:
        if agent.monitors:
            pytest.skip("this machine has NVIDIA GPUs")
        assert agent.drain().devices == ()
    finally:
        agent.stop()


def test_metrics_port_base_moves_up_when_taken() -> None:
    first = NodeAgentCore(job="", sink_path=None, metrics_port=0, sample_interval_s=60)
    first.start()
    try:
        port = int(first.address()["metrics"].rsplit(":", 1)[1].split("/")[0])
        second = NodeAgentCore(
            job="", sink_path=None, metrics_port=port, metrics_port_tries=8, sample_interval_s=60
        )
        second.start()
        try:
            assert f":{port}/" not in second.address()["metrics"]
        finally:
            second.stop()
    finally:
        first.stop()


# --- fleet pieces that need no Ray ---------------------------------------------------------------
def test_node_name_prefers_the_auditor_node_resource() -> None:
    entry = {
        "NodeID": "abcdef0123456789",
        "NodeManagerHostname": "host-1",
        "Resources": {"CPU": 1.0, "auditor_node:node-b": 1.0, "node:10.0.0.2": 1.0},
    }
    assert node_name(entry) == "node-b"
    assert node_name({**entry, "Resources": {"CPU": 1.0}}) == "host-1"


def test_sd_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "sd" / "auditor.json"
    write_text_atomic(
        str(path), json.dumps([{"targets": ["127.0.0.1:1"], "labels": {"node": "a"}}])
    )
    write_text_atomic(str(path), "[]\n")
    assert json.loads(path.read_text()) == []
    assert [p.name for p in path.parent.iterdir()] == ["auditor.json"]  # no temporary left


# --- configuration and command line -------------------------------------------------------------
def test_device_source_option(spec: str) -> None:
    assert device_source("nvml") == "nvml"
    assert device_source(spec) == spec
    for bad, message in (
        ("cuda", "expected 'nvml' or 'recorded:<path>'"),
        ("recorded:", "recorded: needs a file"),
        ("recorded:/no/such/file.jsonl", "recording not found: /no/such/file.jsonl"),
    ):
        with pytest.raises(ValueError, match=message):
            device_source(bad)


def test_fleet_options_have_environment_twins() -> None:
    envs = [o.env for o in FLEET_OPTIONS]
    assert len(set(envs)) == len(envs) and all(e.startswith("AUDITOR_") for e in envs)
    assert "AUDITOR_DEVICE_SOURCE" in envs and "AUDITOR_SD_FILE" in envs


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fleet"], "--address is required"),
        (["fleet", "--address", "x", "--device-source", "cuda"], "--device-source"),
        (["fleet", "--address", "x", "--metrics-port-base", "70000"], "--metrics-port-base"),
        (["run", "--device-source", "recorded:/nope.jsonl", "--", "true"], "--device-source"),
        (["doctor", "--bogus"], "unrecognized arguments"),
    ],
)
def test_cli_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_device_source_environment_twin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUDITOR_DEVICE_SOURCE", "cuda")
    assert main(["run", "--", "true"]) == 2
    assert "AUDITOR_DEVICE_SOURCE" in capsys.readouterr().err


def test_doctor_command_calls_doctor_main(monkeypatch: pytest.MonkeyPatch) -> None:
    import auditor.commands.doctor

    calls: list[tuple[bool, str | None]] = []

    def fake(json_output: bool, prometheus_url: str | None, *args: object, **kw: object) -> int:
        calls.append((json_output, prometheus_url))
        return 7

    monkeypatch.setattr(auditor.commands.doctor, "main", fake)
    assert main(["doctor", "--json", "--prometheus-url", "http://127.0.0.1:9"]) == 7
    monkeypatch.setenv("AUDITOR_PROMETHEUS_URL", "http://p:9090")
    assert main(["doctor"]) == 7
    assert calls == [(True, "http://127.0.0.1:9"), (False, "http://p:9090")]
