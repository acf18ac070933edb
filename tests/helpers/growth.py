"""Jobs whose memory levels follow a given course over the run (a leak, a warm-up that levels
off, noise), for the memory_growth tests: the steps go through the real :class:`SampleStore`,
which folds them into each rank's history as the node actors' deliveries would.

A :class:`Course` gives one figure's level at each step. RSS is read once per probe flush: with
``flush`` > 1 the steps of one flush share the level read after the last of them (the staircase
a real CPU rank shows); the allocator's figures are read every step.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.samples import Batch, DeviceSample, GpuProcess, MemoryBudget, RankInfo, StepSample

from .gpus import gpu_uuid
from .units import GIB, MIB

START = 1_000.0


@dataclass(frozen=True)
class Course:
    """A level in bytes at each step: ``base``, plus ``warmup`` bytes spread evenly over the
    first ``warmup_steps`` steps, plus ``per_step`` bytes a step from step ``start`` until step
    ``stop`` (None: the end), plus uniform noise of +-``noise`` bytes."""

    base: float = 512 * MIB
    per_step: float = 0.0
    start: int = 0
    stop: int | None = None
    warmup: float = 0.0
    warmup_steps: int = 0
    noise: float = 0.0

    def at(self, step: int, rng: random.Random) -> int:
        level = self.base
        if self.warmup_steps:
            level += self.warmup * min(step + 1, self.warmup_steps) / self.warmup_steps
        end = step if self.stop is None else min(step, self.stop)
        level += self.per_step * max(0, end - self.start)
        if self.noise:
            level += rng.uniform(-self.noise, self.noise)
        return round(level)


FLAT = Course()


def leak(per_step: float, **kwargs: float) -> Course:
    return Course(per_step=per_step, **kwargs)  # type: ignore[arg-type]


def growth_snapshot(
    rss: Mapping[int, Course] | None = None,
    *,
    allocated: Mapping[int, Course] | None = None,
    reserved: Mapping[int, Course] | None = None,
    steps: int = 600,
    step_s: float = 0.05,
    flush: int = 1,
    budgets: Mapping[int, MemoryBudget] | None = None,
    host: str = "node0",
    seed: int = 0,
    gpu_total: float | None = None,
    context: float = 512 * MIB,
) -> Snapshot:
    """A job of ``steps`` steps per rank whose levels follow the courses given (a rank is on a
    GPU, ``cuda:<rank>``, where it has an allocator course; its RSS then is not sent).

    ``allocated`` without ``reserved``: reserved is allocated plus 256 MiB of cache. With
    ``gpu_total``, each GPU rank's GPU (``gpu_uuid(host, rank)``, named by the rank) is sampled
    every 10 steps as NVML reads it: its total, and its reserved bytes plus ``context`` used."""
    rss = dict(rss or {})
    allocated = dict(allocated or {})
    reserved = dict(reserved or {})
    ranks = sorted(set(rss) | set(allocated) | set(reserved))
    world = len(ranks)
    rng = random.Random(seed)
    store = SampleStore(job="test")
    infos = tuple(
        RankInfo(
            rank=r,
            world_size=world,
            local_rank=r,
            host=host,
            pid=10_000 + r,
            device=f"cuda:{r}" if r in allocated or r in reserved else "cpu",
            parallel_mode="ddp",
            devices=(r,) if r in allocated or r in reserved else (),
            device_uuids=(gpu_uuid(host, r),) if r in allocated or r in reserved else (),
            job="test",
        )
        for r in ranks
    )
    store.add(Batch(infos=infos))
    for k in range(steps):
        read = min(steps - 1, (k // flush + 1) * flush - 1)  # the flush's last step
        t = START + (k + 1) * step_s
        out = []
        for r in ranks:
            on_gpu = r in allocated or r in reserved
            alloc = res = rss_bytes = None
            if on_gpu:
                a = allocated.get(r)
                alloc = a.at(k, rng) if a is not None else None
                c = reserved.get(r)
                res = c.at(k, rng) if c is not None else (alloc or 0) + 256 * MIB
            else:
                rss_bytes = rss[r].at(read, random.Random(seed * 100_003 + r * 7_919 + read))
            out.append(
                StepSample(
                    rank=r,
                    step=k,
                    time=t,
                    step_s=step_s,
                    forward_s=step_s / 3,
                    backward_s=step_s / 2,
                    collective_wait_s=0.001,
                    batch_size=32,
                    rss_bytes=rss_bytes,
                    mem_allocated_bytes=alloc,
                    mem_reserved_bytes=res,
                )
            )
        gpus = ()
        if gpu_total is not None and k % 10 == 9:
            gpus = tuple(
                DeviceSample(
                    node=host,
                    index=s.rank,
                    uuid=gpu_uuid(host, s.rank),
                    time=t,
                    gpu_util=0.9,
                    mem_used_bytes=round((s.mem_reserved_bytes or 0) + context),
                    mem_total_bytes=round(gpu_total),
                    processes=(GpuProcess(10_000 + s.rank, s.mem_reserved_bytes),),
                )
                for s in out
                if s.mem_reserved_bytes is not None
            )
        store.add(Batch(steps=tuple(out), devices=gpus))
    if budgets:
        store.add(Batch(memory=tuple(budgets.values())))
    end = START + steps * step_s
    return store.snapshot(now=end, window_s=None)


def host_budget(
    rank: int, *, available: float = 16 * GIB, total: float = 64 * GIB, at_step: int = 0
) -> MemoryBudget:
    """A CPU rank's measured budget: the host's available and total memory at ``at_step``."""
    return MemoryBudget(
        rank=rank,
        time=START + at_step * 0.05,
        step=at_step,
        host_total_bytes=round(total),
        host_available_bytes=round(available),
    )


def device_budget(
    rank: int, *, total: float = 80 * GIB, outside: float = 0.5 * GIB, at_step: int = 0
) -> MemoryBudget:
    """A GPU rank's measured budget: the device's total and what it holds outside the rank's
    allocator."""
    return MemoryBudget(
        rank=rank,
        time=START + at_step * 0.05,
        step=at_step,
        device=f"cuda:{rank}",
        device_total_bytes=round(total),
        device_outside_bytes=round(outside),
    )


def ranks_with(courses: Sequence[Course]) -> dict[int, Course]:
    return dict(enumerate(courses))
