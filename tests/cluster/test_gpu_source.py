"""``--gpu-source dcgm`` on ``auditor run`` and ``auditor fleet``: no GpuMonitor is started (the
node's dcgm-exporter reads the GPUs); the ranks' GPU UUIDs are still exported, the join."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.cli import main
from auditor.cli.options import gpu_source, serve_gpu_source
from auditor.cluster.monitor import NO_DEVICES, discover_devices
from auditor.cluster.runtime import InProcessAgent
from auditor.commands.run import _device_source
from auditor.configs import RunConfig
from tests.helpers.gpus import write_gpus
from tests.probe import short_dir

NODE = "node-a"


@pytest.fixture
def spec(tmp_path: Path) -> str:
    return write_gpus(tmp_path / "gpus.jsonl", {NODE: 2})


@pytest.fixture
def sink_dir() -> Iterator[str]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_dcgm_source_means_no_monitors(spec: str, sink_dir: str) -> None:
    assert discover_devices(NO_DEVICES, NODE) == ([], None)
    assert len(discover_devices(spec, NODE)[0]) == 2
    cfg = RunConfig(command=("true",), device_source=spec, gpu_source="dcgm")
    assert _device_source(cfg) == NO_DEVICES
    assert _device_source(RunConfig(command=("true",), device_source=spec)) == spec
    agent = InProcessAgent(
        device_source=_device_source(cfg),
        job="j",
        sink_path=os.path.join(sink_dir, "s.sock"),
        host=NODE,
    )
    try:
        assert agent.monitors == {} and agent.drain().devices == ()
    finally:
        agent.stop()


def test_gpu_source_values() -> None:
    assert gpu_source(" DCGM ") == "dcgm" and gpu_source("auditor") == "auditor"
    assert serve_gpu_source("auto") == "auto"
    with pytest.raises(ValueError, match="expected 'auditor' or 'dcgm'"):
        gpu_source("auto")
    with pytest.raises(ValueError, match="expected 'auto', 'auditor' or 'dcgm'"):
        serve_gpu_source("nvml")


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--gpu-source", "nvml", "--", "true"],
        ["fleet", "--address", "x", "--gpu-source", "nvml"],
        ["serve", "--gpu-source", "nvml", "--once"],
        ["replay", "recording.jsonl", "--gpu-source", "auto"],
    ],
)
def test_a_bad_gpu_source_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu-source" in err, err
