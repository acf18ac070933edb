"""Snapshots for the analysis tests, built once here and shared.

* Jobs with GPUs the plain constructed DDP jobs (:mod:`.jobs`) do not cover:
  :func:`dp_snapshot` (one ``nn.DataParallel`` process driving several GPUs) and
  :func:`batch_ramp` (a DDP job whose batch grows, memory following ``a + b * batch``).
* Measurements :mod:`.jobs` does not model, set on a snapshot afterwards: the main thread's CPU
  during the data wait, collective waits by operation, process and worker memory, the host's
  load average and available memory. Each of these returns a new :class:`Snapshot` (its
  statistics are computed on first use, so they see the change). Values are real-shaped: what
  the probe and the node agent send.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from auditor.analysis.snapshot import RankView, SampleStore, Snapshot
from auditor.samples import Batch, MemoryBudget, StepSample

from .gpus import GpuSpec, MemoryStore, attach_gpus, batch_at, gpu_uuid
from .jobs import JobBuilder, RankSpec, balanced
from .units import GIB


def dp_snapshot(
    mem_gib: list[float | None],
    util: list[float] | None = None,
    *,
    batch: int = 32,
    link: str = "uuid",
    steps: int = 24,
    order: list[int] | None = None,
) -> Snapshot:
    """One DataParallel process (rank 0) driving ``len(mem_gib)`` GPUs on node0."""
    n = len(mem_gib)
    util = util or [0.95] + [0.60] * (n - 1)
    job = JobBuilder([RankSpec(batch_size=batch)], parallel_mode="dataparallel").run(steps)
    gpus = [
        GpuSpec(util=u, mem_used=None if m is None else int(m * GIB))
        for m, u in zip(mem_gib, util, strict=True)
    ]
    attach_gpus(job, gpus, owners=[[0]] * n, link=link)
    if order is not None:  # device_ids in another order than NVML's
        info = job.store.infos[0]
        job.store.add(
            Batch(infos=(replace(info, device_uuids=tuple(gpu_uuid("node0", i) for i in order)),))
        )
    return job.snapshot()


def batch_ramp(
    batches: list[int],
    *,
    fixed_gib: float,
    per_sample_gib: float,
    overhead_gib: float = 1.0,
    world: int = 2,
    steps_each: int = 8,
    probe: str | None = "mem_peak_bytes",
    noise: float = 0.0,
    gpus: bool = True,
    micro_batches: int = 1,
) -> Snapshot:
    """A DDP job whose batch ramps through ``batches``; memory follows ``a + b * batch``.
    With ``micro_batches`` > 1 (gradient accumulation), ``batches`` are the micro-batches and
    each step accumulates that many (its batch is ``micro_batches`` times larger).

    The probe reports ``probe`` (None: no memory from the probe); NVML sees the same plus
    ``overhead_gib`` (CUDA context and allocator cache).
    """
    store: SampleStore = (
        MemoryStore(fixed_gib * GIB, per_sample_gib * GIB, field=probe, noise=noise)
        if probe
        else SampleStore(job="test")
    )
    job = JobBuilder(balanced(world), store=store)
    for b in batches:
        spec = RankSpec(micro_batches=micro_batches).scaled(b / 32, batch_size=b * micro_batches)
        job.run(steps_each, [spec] * world)
    if gpus:
        view = job.snapshot().ranks[0]
        at = batch_at([(s.time, round(s.micro_batch_size or 0)) for s in view.steps])

        def used(t: float) -> int:
            return int((fixed_gib + overhead_gib + per_sample_gib * at(t)) * GIB)

        attach_gpus(job, [GpuSpec(mem_fn=used)] * world)
    return job.snapshot()


def _views(snap: Snapshot, rank: int, change: Callable[[RankView], RankView]) -> Snapshot:
    views = tuple(change(v) if v.info.rank == rank else v for v in snap.ranks)
    return replace(snap, ranks=views)


def steps_of(snap: Snapshot, rank: int, change: Callable[[StepSample], StepSample]) -> Snapshot:
    """Every step sample of ``rank`` passed through ``change``."""
    return _views(snap, rank, lambda v: replace(v, steps=tuple(change(s) for s in v.steps)))


def data_cpu(snap: Snapshot, rank: int, share: float) -> Snapshot:
    """The main thread's CPU during the data wait as ``share`` of that wait (thread_time)."""
    return steps_of(snap, rank, lambda s: replace(s, data_cpu_s=s.data_wait_s * share))


def collective_ops(snap: Snapshot, rank: int, ops: Mapping[str, float]) -> Snapshot:
    """Split ``rank``'s measured collective wait over operations in these proportions."""
    total = sum(ops.values())

    def split(s: StepSample) -> StepSample:
        wait = s.collective_wait_s or 0.0
        return replace(s, collective_ops={op: wait * w / total for op, w in ops.items()})

    return steps_of(snap, rank, split)


def process_memory(
    snap: Snapshot, rank: int, *, rss: int | None, worker_rss: int | None = None
) -> Snapshot:
    """The node agent's RSS of ``rank``'s main process and of its workers together."""
    return _views(
        snap,
        rank,
        lambda v: replace(
            v, cpu=tuple(replace(c, rss_bytes=rss, worker_rss_bytes=worker_rss) for c in v.cpu)
        ),
    )


def host_available(snap: Snapshot, rank: int, available: int, total: int = 64 * GIB) -> Snapshot:
    """A memory budget from ``rank`` reporting the host's available memory."""
    budget = MemoryBudget(
        rank=rank, time=snap.end, step=0, host_total_bytes=total, host_available_bytes=available
    )
    return _views(snap, rank, lambda v: replace(v, memory=budget))


def load_average(snap: Snapshot, load1: float) -> Snapshot:
    """Every node sample with this 1-minute load average."""
    return replace(snap, nodes=tuple(replace(n, load1=load1) for n in snap.nodes))
