"""Recorded GPUs for the cluster tests: a recording with device samples for named nodes."""

from __future__ import annotations

from pathlib import Path

from auditor.samples import Batch, DeviceSample, GpuProcess
from auditor.telemetry.recorded import write_recording

MODEL = "NVIDIA A100-SXM4-80GB"


def gpu_uuid(node: str, index: int) -> str:
    return f"GPU-{node}-{index}"


def device_sample(node: str, index: int, t: float) -> DeviceSample:
    busy = 0.5 + 0.1 * index
    return DeviceSample(
        node=node,
        index=index,
        uuid=gpu_uuid(node, index),
        time=t,
        model=MODEL,
        gpu_util=busy,
        mem_util=busy / 2,
        mem_used_bytes=(10 + index) * 2**30,
        mem_total_bytes=80 * 2**30,
        sm_clock_mhz=1410.0,
        sm_clock_max_mhz=1410.0,
        mem_clock_mhz=1593.0,
        mem_clock_max_mhz=1593.0,
        throttle_reasons=("sw_power_cap",) if index else (),
        power_w=300.0 + index,
        power_limit_w=400.0,
        temperature_c=55.0 + index,
        pcie_gen=4,
        pcie_gen_max=4,
        pcie_width=16,
        pcie_width_max=16,
        processes=(GpuProcess(pid=10_000 + index, used_bytes=2**30),),
    )


def write_gpus(path: Path, gpus: dict[str, int], *, seconds: int = 5, t0: float = 1e9) -> str:
    """A recording with ``gpus[node]`` GPUs per node, one sample per GPU per second; returns the
    device-source spec that replays it."""
    batches = [
        Batch(
            devices=tuple(
                device_sample(node, i, t0 + s) for node, n in gpus.items() for i in range(n)
            )
        )
        for s in range(seconds)
    ]
    write_recording(path, batches, job="gpus")
    return f"recorded:{path}"
