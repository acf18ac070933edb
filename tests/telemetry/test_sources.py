"""Recorded device source: replay timing with a fake clock, looping, node filtering, lost GPUs,
and the source spec parser."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from auditor.samples import Batch, DeviceSample, GpuProcess, NodeCpu
from auditor.telemetry.nvml import NvmlSource
from auditor.telemetry.recorded import Recording, RecordingError, write_recording
from auditor.telemetry.sources import (
    DeviceIdentity,
    DeviceSource,
    RecordedDeviceSource,
    make_source,
)
from tests.helpers.clocks import Clock

T0 = 5000.0
MODEL = "NVIDIA A100-SXM4-40GB"


def dev(node: str, index: int, uuid: str, t: float, util: float, **kw: object) -> DeviceSample:
    return DeviceSample(
        node=node,
        index=index,
        uuid=uuid,
        time=T0 + t,
        model=MODEL,
        gpu_util=util,
        mem_used_bytes=int(util * 1e9),
        mem_total_bytes=40_000_000_000,
        processes=(GpuProcess(pid=4242, used_bytes=int(util * 1e9)),),
        **kw,  # type: ignore[arg-type]
    )


def lost(node: str, index: int, uuid: str, t: float) -> DeviceSample:
    return DeviceSample(node=node, index=index, uuid=uuid, time=T0 + t, model="", lost=True)


def samples() -> list[DeviceSample]:
    """Node a: g0 (util .1 .2 .3 at +0 +1 +2) and g1 (lost at +2); node b: g2 from +1 on."""
    return [
        dev("a", 0, "g0", 0.0, 0.1),
        dev("a", 1, "g1", 0.0, 0.5),
        dev("a", 0, "g0", 1.0, 0.2),
        dev("a", 1, "g1", 1.0, 0.6),
        dev("b", 0, "g2", 1.0, 0.9),
        dev("a", 0, "g0", 2.0, 0.3),
        lost("a", 1, "g1", 2.0),
        dev("b", 0, "g2", 2.0, 0.8),
    ]


def recording() -> Recording:
    return Recording(
        header={"schema": "auditor.recording/v1"}, batch=Batch(devices=tuple(samples()))
    )


def test_devices_per_node() -> None:
    a = RecordedDeviceSource(recording(), "a", clock=Clock(100.0))
    b = RecordedDeviceSource(recording(), "b", clock=Clock(100.0))
    assert isinstance(a, DeviceSource)
    assert a.devices() == [DeviceIdentity(0, "g0", MODEL), DeviceIdentity(1, "g1", MODEL)]
    assert b.devices() == [DeviceIdentity(0, "g2", MODEL)]
    with pytest.raises(KeyError):
        a.sample("g2")  # another node's GPU
    with pytest.raises(KeyError):
        a.sample("nope")


def test_unknown_node_has_no_devices_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="auditor.telemetry.sources"):
        c = RecordedDeviceSource(recording(), "c", clock=Clock(100.0))
    assert c.devices() == []
    assert "'c'" in caplog.text and "['a', 'b']" in caplog.text


@pytest.mark.parametrize(
    ("now", "util"),
    [
        (100.0, 0.1),
        (100.99, 0.1),
        (101.0, 0.2),
        (102.5, 0.3),
        # period = span 2 s + one 1 s step: the replay starts again at 103
        (103.0, 0.1),
        (104.2, 0.2),
        (105.9, 0.3),
        (100.0 + 3 * 1000 + 1.5, 0.2),
    ],
)
def test_replay_timing_and_looping(now: float, util: float) -> None:
    clock = Clock(100.0)
    src = RecordedDeviceSource(recording(), "a", clock=clock)
    clock.t = now
    s = src.sample("g0")
    assert s == replace(dev("a", 0, "g0", 0.0, util), time=now)


def test_no_loop_holds_the_last_sample() -> None:
    clock = Clock(100.0)
    src = RecordedDeviceSource(recording(), "a", clock=clock, loop=False)
    clock.t = 150.0
    assert src.sample("g0").gpu_util == 0.3
    assert src.sample("g0").time == 150.0


def test_gpu_appearing_later_replays_its_first_sample_until_then() -> None:
    clock = Clock(100.0)
    src = RecordedDeviceSource(recording(), "b", clock=clock)
    assert src.sample("g2").gpu_util == 0.9
    clock.t = 102.0
    assert src.sample("g2").gpu_util == 0.8


def test_lost_stays_lost_across_loops() -> None:
    clock = Clock(100.0)
    src = RecordedDeviceSource(recording(), "a", clock=clock)
    clock.t = 101.5
    assert src.sample("g1").gpu_util == 0.6 and not src.sample("g1").lost
    for t in (102.0, 103.0, 104.0, 500.0):  # 103 and 104 loop back before the loss
        clock.t = t
        s = src.sample("g1")
        assert s == DeviceSample(node="a", index=1, uuid="g1", time=t, model=MODEL, lost=True)
    # The other GPU is unaffected.
    clock.t = 103.0
    assert src.sample("g0").gpu_util == 0.1


def test_lost_even_when_the_lost_sample_itself_was_never_asked_for() -> None:
    clock = Clock(100.0)
    src = RecordedDeviceSource(recording(), "a", clock=clock)
    clock.t = 110.0
    assert src.sample("g1").lost


def test_reads_a_recording_file(tmp_path: Path) -> None:
    path = tmp_path / "recording.jsonl"
    node = NodeCpu(host="a", time=T0, cores=8.0, busy_cores=2.0, load1=1.0)
    write_recording(path, [Batch(nodes=(node,)), Batch(devices=tuple(samples()))], job="j")
    clock = Clock(100.0)
    src = RecordedDeviceSource(path, "a", clock=clock)
    clock.t = 101.0
    assert src.sample("g0") == replace(dev("a", 0, "g0", 1.0, 0.2), time=101.0)
    src.close()


def test_single_sample_recording_loops_on_itself() -> None:
    rec = Recording(header={}, batch=Batch(devices=(dev("a", 0, "g0", 0.0, 0.4),)))
    clock = Clock(0.0)
    src = RecordedDeviceSource(rec, "a", clock=clock)
    for t in (0.0, 0.5, 7.25):
        clock.t = t
        assert src.sample("g0").gpu_util == 0.4


def test_make_source(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    write_recording(path, [Batch(devices=tuple(samples()))])
    src = make_source(f"recorded:{path}", "b")
    assert isinstance(src, RecordedDeviceSource)
    assert [d.uuid for d in src.devices()] == ["g2"]
    live = make_source("nvml", "a")  # lazy: no NVML call until first use
    assert isinstance(live, NvmlSource) and not live.nvml.initialized


@pytest.mark.parametrize(
    ("spec", "error", "match"),
    [
        ("cuda", ValueError, "unknown device source 'cuda'.*'nvml' or 'recorded:"),
        ("", ValueError, "unknown device source"),
        ("recorded:", ValueError, "names no file"),
        ("recorded:/no/such/recording.jsonl", RecordingError, "cannot open"),
    ],
)
def test_make_source_errors(spec: str, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make_source(spec, "a")
    assert issubclass(error, ValueError)


H100 = Path(__file__).resolve().parents[1] / "data" / "h100_live" / "nvml_recording.jsonl"


def test_h100_recording_replays_every_field_of_a_real_gpu() -> None:
    """A real NVML recording (bench/gpu_validate.py on an H100): 2 s idle, a 20 s CUDA training
    job, 2 s idle. Replayed second by second, every field NVML gave is there, with the job's
    process on the GPU while it trains and the idle clock-event reason around it."""
    clock = Clock(0.0)
    src = RecordedDeviceSource(H100, "vm", clock=clock.__call__, loop=False)
    (ident,) = src.devices()
    assert ident.model == "NVIDIA H100 80GB HBM3" and ident.uuid.startswith("GPU-")
    seen = []
    for t in range(33):
        clock.t = float(t)
        seen.append(src.sample(ident.uuid))
    first = seen[0]
    assert first.gpu_util == 0.0 and first.throttle_reasons == ("gpu_idle",)
    assert not first.processes
    assert first.mem_total_bytes == 85_520_809_984 and first.power_limit_w == 700.0
    assert (first.pcie_gen, first.pcie_gen_max, first.pcie_width) == (5, 5, 16)
    busy = [s for s in seen if s.gpu_util == 1.0]
    assert len(busy) >= 15  # the job's steady training
    for s in busy:
        (proc,) = s.processes
        assert proc.used_bytes is not None and proc.used_bytes > 2**30
        assert s.sm_clock_mhz == s.sm_clock_max_mhz == 1980.0  # boost, not throttled
        assert s.power_w is not None and s.power_w > 300.0
        assert s.throttle_reasons == ()
    assert seen[-1].gpu_util == 0.0 and not seen[-1].processes  # the job ended
