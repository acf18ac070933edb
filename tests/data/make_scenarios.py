"""Generate the recorded device scenarios under ``tests/data/<scenario>/recording.jsonl``.

Each scenario is a real-shaped ``auditor.recording/v2`` recording of a few seconds of training on
one 4-GPU node: the ranks' identities and steps (the probe's phases, DDP barrier timing), their
process and node CPU, and NVML reads of every GPU every half second with H100/H200 figures
(totals, clocks, power, PCIe gen 5 x16, the processes on each GPU). The values are seeded, so
running this again rewrites the same records (only the header's ``created`` time changes);
``tests/analysis/test_scenarios.py`` checks that the committed files are current.

    python tests/data/make_scenarios.py            # rewrite every scenario
    python tests/data/make_scenarios.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from auditor.samples import (
    Batch,
    DeviceSample,
    GpuProcess,
    LoaderConfig,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)
from auditor.telemetry.recorded import write_recording

HERE = Path(__file__).resolve().parent
GIB = 1024**3
MIB = 1024**2
T0 = 1_795_000_000.0  # 2026-11-18, seconds since the epoch
HOST = "gpu-node-07"
H100 = ("NVIDIA H100 80GB HBM3", 85_520_809_984)  # 81559 MiB
H200 = ("NVIDIA H200", 150_754_820_096)  # 143771 MiB
SM_MAX = 1980.0
MEM_CLOCK = 2619.0
TICK = 0.5  # NVML and CPU sampling period, seconds


def uuid(rng: random.Random) -> str:
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


@dataclass
class Rank:
    """Nominal per-step phases (seconds) of one training process."""

    data_wait: float = 0.002
    h2d: float = 0.006
    forward: float = 0.055
    backward: float = 0.105
    optimizer: float = 0.008
    batch: int = 64
    # Allocator memory the probe reports: fixed + per_sample * batch (None: not reported).
    mem_fixed: float | None = None
    mem_per_sample: float | None = None


@dataclass
class Gpu:
    """Nominal NVML readings of one GPU."""

    model: tuple[str, int] = H100
    util: float = 0.98
    mem_used: float = 52 * GIB
    sm_clock: float = 1965.0
    throttle: tuple[str, ...] = ()
    throttle_share: float = 0.0
    temperature: float = 61.0
    power: float = 610.0
    power_limit: float = 700.0
    pcie_gen: int = 5
    pcie_width: int = 16
    # Processes on it: pid -> share of mem_used (None: the owning ranks' pids).
    processes: dict[int, float] | None = None
    idle: bool = False


@dataclass
class Job:
    name: str
    description: str
    ranks: list[Rank]
    gpus: list[Gpu]
    # GPU i's owners; DataParallel: one rank owning every GPU.
    owners: list[list[int]]
    mode: str = "ddp"
    steps: int = 60
    comm: float = 0.012
    jitter: float = 0.03
    seed: int = 0
    link_uuids: bool = True
    model: tuple[str, int] = H100
    # Batch size per step (overrides Rank.batch): a ramp.
    batch_schedule: Callable[[int], int] | None = None
    # NVML memory of GPU i at a time: overrides Gpu.mem_used.
    gpu_memory: Callable[[int, int], float] | None = None
    sampler: str = "DistributedSampler"
    extra_meta: dict[str, object] = field(default_factory=dict)


def build(job: Job) -> list[Batch]:
    """The batches the node actors would have delivered, one per sampling tick."""
    rng = random.Random(job.seed)
    world = len(job.ranks)
    uuids = [uuid(rng) for _ in job.gpus]
    pids = [48_211 + 17 * r for r in range(world)]
    infos = []
    for r in range(world):
        mine = tuple(i for i, o in enumerate(job.owners) if r in o)
        infos.append(
            RankInfo(
                rank=r,
                world_size=world,
                local_rank=r,
                host=HOST,
                pid=pids[r],
                device=f"cuda:{mine[0] if mine else r}",
                parallel_mode=job.mode,
                devices=mine,
                device_uuids=tuple(uuids[i] for i in mine) if job.link_uuids else (),
                loader=LoaderConfig(
                    num_workers=8,
                    pin_memory=True,
                    prefetch_factor=2,
                    persistent_workers=True,
                    batch_size=job.ranks[r].batch,
                    drop_last=True,
                    sampler=job.sampler,
                    dataset="ImageFolder",
                ),
                job=job.name,
            )
        )

    def jit(v: float, rel: float | None = None) -> float:
        rel = job.jitter if rel is None else rel
        return v * (1.0 + rng.uniform(-rel, rel))

    # Steps under the DDP barrier (DataParallel: one rank, no collective).
    steps: list[StepSample] = []
    now = T0
    batch_of_step: list[tuple[float, int]] = []
    for i in range(job.steps):
        batch_now = [job.batch_schedule(i) if job.batch_schedule else r.batch for r in job.ranks]
        scale = [b / r.batch for b, r in zip(batch_now, job.ranks, strict=True)]
        phases = [
            {
                "data_wait": jit(r.data_wait),
                "h2d": jit(r.h2d * s),
                "forward": jit(r.forward * s),
                "backward": jit(r.backward * s),
                "optimizer": jit(r.optimizer),
            }
            for r, s in zip(job.ranks, scale, strict=True)
        ]
        local = [sum(p.values()) for p in phases]
        comm = jit(job.comm) if job.mode == "ddp" else 0.0
        step_s = max(local) + comm
        now += step_s
        batch_of_step.append((now, batch_now[0]))
        for r, (rank, p) in enumerate(zip(job.ranks, phases, strict=True)):
            wait = comm + max(local) - local[r] if job.mode == "ddp" else None
            peak = alloc = None
            if rank.mem_fixed is not None and rank.mem_per_sample is not None:
                peak = int(jit(rank.mem_fixed + rank.mem_per_sample * batch_now[r], 0.01))
                alloc = int(peak * 0.62)
            steps.append(
                StepSample(
                    rank=r,
                    step=i,
                    time=round(now, 6),
                    step_s=round(step_s, 6),
                    data_wait_s=round(p["data_wait"], 6),
                    h2d_s=round(p["h2d"], 6),
                    forward_s=round(p["forward"], 6),
                    backward_s=round(p["backward"], 6),  # exclusive: the wait is not in it
                    optimizer_s=round(p["optimizer"], 6),
                    collective_wait_s=None if wait is None else round(wait, 6),
                    collective_ops=None if wait is None else {"ddp_allreduce": round(wait, 6)},
                    batch_size=batch_now[r],
                    rss_bytes=int(jit(6.2 * GIB, 0.002)),
                    mem_allocated_bytes=alloc,
                    mem_reserved_bytes=None if peak is None else int(peak * 1.04),
                    mem_peak_bytes=peak,
                )
            )
    end = now

    batches = [Batch(infos=tuple(infos))]
    t = T0 + TICK
    sent = 0
    while t <= end + 1e-9:
        chunk = []
        while sent < len(steps) and steps[sent].time <= t:
            chunk.append(steps[sent])
            sent += 1
        procs = tuple(
            ProcessCpu(
                rank=r,
                time=round(t, 6),
                pid=pids[r],
                main_cpu=round(jit(1.0, 0.1), 3),
                worker_cpu=tuple(round(jit(0.35, 0.2), 3) for _ in range(8)),
                rss_bytes=int(jit(6.2 * GIB, 0.002)),
                worker_rss_bytes=int(jit(8 * 1.1 * GIB, 0.01)),
            )
            for r in range(world)
        )
        busy = sum(p.main_cpu or 0.0 for p in procs) + sum(p.worker_cpu_total for p in procs)
        node = NodeCpu(
            host=HOST, time=round(t, 6), cores=64.0, busy_cores=round(busy + 0.6, 2), load1=busy
        )
        devices = tuple(
            _device(job, i, g, uuids[i], pids, t, batch_of_step, jit, rng)
            for i, g in enumerate(job.gpus)
        )
        batches.append(Batch(steps=tuple(chunk), processes=procs, nodes=(node,), devices=devices))
        t += TICK
    if sent < len(steps):
        batches.append(Batch(steps=tuple(steps[sent:])))
    return batches


def _device(
    job: Job,
    i: int,
    g: Gpu,
    gpu_uuid: str,
    pids: Sequence[int],
    t: float,
    batch_of_step: Sequence[tuple[float, int]],
    jit: Callable[..., float],
    rng: random.Random,
) -> DeviceSample:
    model, total = g.model
    used = g.mem_used
    if job.gpu_memory is not None and not g.idle:
        batch = next((b for end, b in batch_of_step if t <= end), batch_of_step[-1][1])
        used = job.gpu_memory(i, batch)
    if g.processes is not None:
        procs = tuple(GpuProcess(pid=p, used_bytes=int(used * s)) for p, s in g.processes.items())
    else:
        owners = job.owners[i]
        procs = tuple(GpuProcess(pid=pids[r], used_bytes=int(used / len(owners))) for r in owners)
    if g.idle:
        reasons: tuple[str, ...] = ("gpu_idle",)
        util, sm, power, gen = 0.0, 345.0, jit(72.0, 0.05), 1
    else:
        reasons = g.throttle if rng.random() < g.throttle_share else ()
        util = min(1.0, round(jit(g.util, 0.02), 2))
        sm, power, gen = jit(g.sm_clock, 0.008), jit(g.power, 0.05), g.pcie_gen
    return DeviceSample(
        node=HOST,
        index=i,
        uuid=gpu_uuid,
        time=round(t + 0.0004 * i, 6),
        model=model,
        gpu_util=util,
        mem_util=round(util * 0.55, 2),
        mem_used_bytes=int(used),
        mem_total_bytes=total,
        sm_clock_mhz=float(round(sm)),
        sm_clock_max_mhz=SM_MAX,
        mem_clock_mhz=MEM_CLOCK,
        mem_clock_max_mhz=MEM_CLOCK,
        throttle_reasons=reasons,
        power_w=round(power, 1),
        power_limit_w=g.power_limit,
        temperature_c=float(round(jit(g.temperature, 0.02))),
        pcie_gen=gen,
        pcie_gen_max=5,
        pcie_width=g.pcie_width,
        pcie_width_max=16,
        processes=procs,
    )


def balanced_4gpu() -> Job:
    return Job(
        name="balanced_4gpu",
        description="DDP, 4 ranks on 4 H100s, equal work: no warning expected",
        ranks=[Rank() for _ in range(4)],
        gpus=[Gpu() for _ in range(4)],
        owners=[[0], [1], [2], [3]],
        seed=11,
    )


def throttled_gpu() -> Job:
    # GPU 2 overheats: sw_thermal_slowdown in ~90% of reads, SM clock ~1350 of 1980 MHz, so its
    # rank computes ~1.45x slower and the other three wait for it at every all-reduce.
    ranks = [Rank() for _ in range(4)]
    slow = 1.45
    ranks[2] = replace(
        ranks[2],
        h2d=0.006 * slow,
        forward=0.055 * slow,
        backward=0.105 * slow,
        optimizer=0.008 * slow,
    )
    gpus = [Gpu() for _ in range(4)]
    gpus[2] = replace(
        gpus[2],
        sm_clock=1350.0,
        throttle=("sw_thermal_slowdown",),
        throttle_share=0.9,
        temperature=87.0,
        power=455.0,
    )
    return Job(
        name="throttled_gpu",
        description="DDP, 4 ranks; GPU 2 thermally throttled, rank 2 the one the others wait for",
        ranks=ranks,
        gpus=gpus,
        owners=[[0], [1], [2], [3]],
        seed=12,
    )


def dataparallel_gather() -> Job:
    # One nn.DataParallel process, batch 256 over 4 GPUs (chunks of 64); GPU 0 gathers the
    # outputs and computes the loss: ~1.5x the memory and far busier than the replicas.
    gpus = [Gpu(mem_used=61 * GIB, util=0.93)] + [
        Gpu(mem_used=40 * GIB, util=0.58) for _ in range(3)
    ]
    return Job(
        name="dataparallel_gather",
        description="nn.DataParallel over 4 H100s, batch 256; GPU 0 holds the gathered outputs",
        ranks=[Rank(batch=256, forward=0.140, backward=0.230, optimizer=0.020, h2d=0.018)],
        gpus=gpus,
        owners=[[0], [0], [0], [0]],
        mode="dataparallel",
        steps=28,
        seed=13,
        sampler="RandomSampler",
    )


def dp_batch_30_over_4() -> Job:
    # Batch 30 over 4 GPUs: torch.chunk gives 8, 8, 8, 6; GPU 3 has less to do. GPU 0's gather
    # is small here (a classifier head). Linked by NVML processes only (no device_uuids).
    gpus = [
        Gpu(mem_used=30 * GIB, util=0.90),
        Gpu(mem_used=27 * GIB, util=0.88),
        Gpu(mem_used=27 * GIB, util=0.88),
        Gpu(mem_used=22 * GIB, util=0.70),
    ]
    return Job(
        name="dp_batch_30_over_4",
        description="nn.DataParallel, batch 30 over 4 H100s (chunks 8, 8, 8, 6)",
        ranks=[Rank(batch=30, forward=0.048, backward=0.090, optimizer=0.010)],
        gpus=gpus,
        owners=[[0], [0], [0], [0]],
        mode="dataparallel",
        steps=60,
        seed=14,
        link_uuids=False,
        sampler="RandomSampler",
    )


def idle_allocated_gpu() -> Job:
    # DDP on GPUs 0 and 1 of a 4 x H200 node; a leftover process (a notebook kernel that was
    # never shut down) holds 18 GiB on GPU 2 and computes nothing; GPU 3 is free.
    gpus = [Gpu(model=H200, mem_used=88 * GIB), Gpu(model=H200, mem_used=88 * GIB)]
    gpus.append(Gpu(model=H200, mem_used=18 * GIB + 512 * MIB, processes={39_127: 1.0}, idle=True))
    gpus.append(Gpu(model=H200, mem_used=4 * MIB, processes={}, idle=True))
    return Job(
        name="idle_allocated_gpu",
        description="DDP on GPUs 0-1 of 4 H200s; PID 39127 holds 18.5 GiB on idle GPU 2",
        ranks=[Rank(), Rank()],
        gpus=gpus,
        owners=[[0], [1], [], []],
        seed=15,
    )


def memory_grows_with_batch() -> Job:
    # A batch-size warm-up 16 -> 32 -> 48 -> 64; the probe's per-step peak follows
    # 5.5 GiB + 0.42 GiB per sample, NVML sees the allocator's reserve (never shrinks) plus the
    # CUDA context. At 64 the GPUs are ~42% full: room for a far larger batch.
    fixed, per = 5.5 * GIB, 0.42 * GIB
    ranks = [
        Rank(batch=64, forward=0.055, backward=0.105, mem_fixed=fixed, mem_per_sample=per)
        for _ in range(4)
    ]

    def schedule(step: int) -> int:
        return 16 * (1 + min(3, step // 15))

    def memory(i: int, batch: int) -> float:
        return fixed + per * batch + 1.2 * GIB + i * 3 * MIB

    return Job(
        name="memory_grows_with_batch",
        description="DDP, 4 ranks, batch warm-up 16..64; memory = 5.5 GiB + 0.42 GiB/sample",
        ranks=ranks,
        gpus=[Gpu() for _ in range(4)],
        owners=[[0], [1], [2], [3]],
        seed=16,
        batch_schedule=schedule,
        gpu_memory=memory,
    )


def input_bound_4gpu() -> Job:
    # Every rank's input pipeline is too slow (its 8 workers cannot decode JPEGs fast enough):
    # each waits ~220 ms for data in a ~410 ms step, so all four GPUs sit at ~38% busy and draw
    # little power. Nobody is a straggler; the node is simply underused.
    return Job(
        name="input_bound_4gpu",
        description="DDP, 4 ranks on 4 H100s, every rank input-bound: GPUs ~38% busy",
        ranks=[Rank(data_wait=0.22) for _ in range(4)],
        gpus=[Gpu(util=0.38, power=290.0, temperature=48.0) for _ in range(4)],
        owners=[[0], [1], [2], [3]],
        seed=19,
    )


SCENARIOS: dict[str, Callable[[], Job]] = {
    "balanced_4gpu": balanced_4gpu,
    "throttled_gpu": throttled_gpu,
    "dataparallel_gather": dataparallel_gather,
    "dp_batch_30_over_4": dp_batch_30_over_4,
    "idle_allocated_gpu": idle_allocated_gpu,
    "memory_grows_with_batch": memory_grows_with_batch,
    "input_bound_4gpu": input_bound_4gpu,
}


def write(name: str, out: Path) -> Path:
    job = SCENARIOS[name]()
    path = out / name / "recording.jsonl"
    meta = {
        "scenario": name,
        "description": job.description,
        "generator": "tests/data/make_scenarios.py",
        **job.extra_meta,
    }
    write_recording(path, build(job), job=name, meta=meta)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder for <scenario>/")
    parser.add_argument("names", nargs="*", help="scenarios (default: all)")
    args = parser.parse_args(argv)
    for name in args.names or SCENARIOS:
        path = write(name, args.out)
        print(f"{path} ({math.ceil(path.stat().st_size / 1024)} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
