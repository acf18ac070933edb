"""NVML-shaped GPU samples: attached to a constructed job (:mod:`.jobs`), or written as a
recording for the cluster tests.

A :class:`GpuSpec` gives one GPU's nominal readings; :func:`attach_gpus` samples every GPU every
``every`` seconds over the time the job has run and delivers the samples to the job's store as
the node actors would, with the ranks linked to their GPUs either by the rank's own word
(``device_uuids``) or only by NVML's process list (the rank's PID on the GPU).

:func:`write_gpus` writes a recording of fixed GPUs on named nodes (no job), which the cluster
tests replay through the ``recorded:`` device source as the monitors on those nodes would read it.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from auditor.analysis.snapshot import SampleStore
from auditor.samples import Batch, DeviceSample, GpuProcess
from auditor.telemetry.recorded import write_recording

from .jobs import JobBuilder
from .units import GIB

H100_TOTAL = 85_520_809_984  # 81559 MiB, what NVML reports for an H100 80GB HBM3
H200_TOTAL = 150_754_820_096  # 143771 MiB
H100 = "NVIDIA H100 80GB HBM3"


def gpu_uuid(node: str, index: int) -> str:
    """The NVML-shaped UUID of GPU ``index`` on ``node``, the same every run (the node's name
    sets the first group, the index the last)."""
    tag = zlib.crc32(node.encode())
    return f"GPU-{tag:08x}-1111-2222-3333-{index:012x}"


@dataclass(frozen=True)
class GpuSpec:
    """Nominal readings of one GPU; jitter is added by :func:`attach_gpus`."""

    util: float | None = 0.97
    mem_used: int | None = 40 * GIB
    mem_total: int | None = H100_TOTAL
    # Growth of used memory, bytes per second (a leak or a rising batch), for ``mem_rise_s``
    # seconds (None: the whole run), then flat.
    mem_slope: float = 0.0
    mem_rise_s: float | None = None
    # Used memory as a function of the sample's time (overrides mem_used and mem_slope).
    mem_fn: Callable[[float], int] | None = None
    sm_clock: float | None = 1980.0
    sm_clock_max: float | None = 1980.0
    throttle: tuple[str, ...] | None = ()
    # Share of samples in which ``throttle`` is active (the others report none).
    throttle_share: float = 1.0
    temperature: float | None = 55.0
    power: float | None = 620.0
    power_limit: float | None = 700.0
    pcie_gen: int | None = 5
    pcie_gen_max: int | None = 5
    pcie_width: int | None = 16
    pcie_width_max: int | None = 16
    # Processes: None means "the owning rank's PID with all of mem_used"; () lists none.
    processes: tuple[GpuProcess, ...] | None = None
    lost_after: float | None = None
    model: str = H100


def attach_gpus(
    job: JobBuilder,
    gpus: Sequence[GpuSpec],
    *,
    owners: Sequence[Sequence[int]] | None = None,
    link: str = "uuid",
    node: str = "node0",
    every: float = 0.25,
    seed: int = 0,
) -> list[str]:
    """Sample ``gpus`` (GPU ``i`` at NVML index ``i``) over the job's run; returns their UUIDs.

    ``owners[i]`` are the ranks on GPU ``i`` (default: rank ``i`` on GPU ``i``). ``link`` says how
    the ranks are tied to their GPUs: ``"uuid"`` (the rank reports ``device_uuids``), ``"pid"``
    (only NVML's process list shows the rank's PID) or ``"none"`` (neither).
    """
    rng = random.Random(seed)
    owners = (
        [[i] if i < len(job.specs) else [] for i in range(len(gpus))] if owners is None else owners
    )
    uuids = [gpu_uuid(node, i) for i in range(len(gpus))]
    infos = {info.rank: info for info in job.infos()}
    pid = {r: info.pid for r, info in infos.items()}
    if link == "uuid":
        mine: dict[int, list[str]] = {}
        for i, ranks in enumerate(owners):
            for r in ranks:
                mine.setdefault(r, []).append(uuids[i])
        new = tuple(
            replace(
                info,
                device_uuids=tuple(mine.get(r, ())),
                devices=tuple(i for i, rs in enumerate(owners) if r in rs) or info.devices,
            )
            for r, info in infos.items()
        )
    else:
        new = tuple(
            replace(
                info, devices=tuple(i for i, rs in enumerate(owners) if r in rs) or info.devices
            )
            for r, info in infos.items()
        )
    job.store.add(Batch(infos=new))
    start = job.store.first_time() or job.now
    t0 = start - 0.05
    samples: list[DeviceSample] = []
    t = t0
    while t <= job.now:
        for i, g in enumerate(gpus):
            samples.append(_sample(g, i, uuids[i], node, t, t - t0, owners[i], pid, link, rng))
        t += every
    job.store.add(Batch(devices=tuple(samples)))
    return uuids


def _sample(
    g: GpuSpec,
    index: int,
    uuid: str,
    node: str,
    t: float,
    elapsed: float,
    ranks: Sequence[int],
    pid: dict[int, int],
    link: str,
    rng: random.Random,
) -> DeviceSample:
    if g.lost_after is not None and elapsed >= g.lost_after:
        return DeviceSample(node=node, index=index, uuid=uuid, time=t, model=g.model, lost=True)

    def jit(v: float | None, rel: float = 0.01) -> float | None:
        return None if v is None else v * (1.0 + rng.uniform(-rel, rel))

    rising = elapsed if g.mem_rise_s is None else min(elapsed, g.mem_rise_s)
    used = None if g.mem_used is None else int(g.mem_used + g.mem_slope * rising)
    if g.mem_fn is not None:
        used = g.mem_fn(t)
    if g.processes is not None:
        procs = g.processes
    elif link == "none" or not ranks:
        procs = ()
    else:
        share = None if used is None else used // len(ranks)
        procs = tuple(GpuProcess(pid=pid[r], used_bytes=share) for r in ranks)
    throttle = g.throttle
    if throttle and rng.random() >= g.throttle_share:
        throttle = ()
    util = jit(g.util, 0.02)
    return DeviceSample(
        node=node,
        index=index,
        uuid=uuid,
        time=t,
        model=g.model,
        gpu_util=None if util is None else min(1.0, util),
        mem_util=None if g.util is None else min(1.0, g.util * 0.6),
        mem_used_bytes=used,
        mem_total_bytes=g.mem_total,
        sm_clock_mhz=jit(g.sm_clock, 0.005),
        sm_clock_max_mhz=g.sm_clock_max,
        mem_clock_mhz=2619.0,
        mem_clock_max_mhz=2619.0,
        throttle_reasons=throttle,
        power_w=jit(g.power),
        power_limit_w=g.power_limit,
        temperature_c=g.temperature,
        pcie_gen=g.pcie_gen,
        pcie_gen_max=g.pcie_gen_max,
        pcie_width=g.pcie_width,
        pcie_width_max=g.pcie_width_max,
        processes=procs,
    )


class MemoryStore(SampleStore):
    """A store whose steps carry the probe's memory: ``fixed + per_sample * batch`` bytes (the
    micro-batch under gradient accumulation).

    Passed to :class:`JobBuilder` as its ``store``, so the builder's steps gain the memory fields
    the probe would report (``field``: ``mem_peak_bytes`` or ``mem_allocated_bytes``).
    """

    def __init__(
        self, fixed: float, per_sample: float, *, field: str = "mem_peak_bytes", noise: float = 0.0
    ) -> None:
        super().__init__(job="test")
        self.fixed = fixed
        self.per_sample = per_sample
        self.field = field
        self.noise = noise
        self._rng = random.Random(1)

    def add(self, batch: Batch) -> None:
        steps = tuple(
            # One micro-batch's activations are alive at a time (gradient accumulation).
            replace(s, **{self.field: self._bytes(s.micro_batch_size)}) if s.batch_size else s
            for s in batch.steps
        )
        super().add(replace(batch, steps=steps))

    def _bytes(self, batch: float | None) -> int:
        value = self.fixed + self.per_sample * (batch or 0)
        return int(value * (1.0 + self._rng.uniform(-self.noise, self.noise)))


def batch_at(job_steps: Sequence[tuple[float, int]]) -> Callable[[float], int]:
    """The batch in progress at time ``t`` from ``(step end time, batch)`` pairs."""

    def at(t: float) -> int:
        for end, b in job_steps:
            if t <= end:
                return b
        return job_steps[-1][1]

    return at


# --- recorded GPUs of named nodes, for the cluster tests ----------------------------------------
MODEL = "NVIDIA A100-SXM4-80GB"


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
        mem_used_bytes=(10 + index) * GIB,
        mem_total_bytes=80 * GIB,
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
        processes=(GpuProcess(pid=10_000 + index, used_bytes=GIB),),
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
