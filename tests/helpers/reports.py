"""Stores and reports for the report tests: a two-rank DDP job delivered as node agents deliver
it, and the report a live run ends with (snapshot at the newest sample, the whole run, every rule).
"""

from __future__ import annotations

from typing import Any

from auditor.analysis import SampleStore, Snapshot
from auditor.analysis.findings import Finding
from auditor.audit import Audit
from auditor.report.json_report import build_report
from auditor.samples import (
    Batch,
    DeviceSample,
    LoaderConfig,
    MemoryBudget,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)

from .jobs import JobBuilder, balanced, with_rank
from .units import GIB, MIB

HOST = "node-a.cluster.example"
T0 = 1_700_000_000.0
STEP_S = 0.100


def loader(num_workers: int = 2) -> LoaderConfig:
    return LoaderConfig(
        num_workers=num_workers,
        pin_memory=False,
        prefetch_factor=2 if num_workers else None,
        persistent_workers=False,
        batch_size=32,
        drop_last=False,
        sampler="DistributedSampler",
        dataset="ImageFolder",
    )


def make_store(
    *,
    starved: bool = True,
    steps: int = 20,
    with_cpu: bool = True,
    collective: bool = True,
    unmeasured: tuple[str, ...] = (),
) -> SampleStore:
    """A 2-rank DDP job on one host, delivered the way node agents deliver it (Batches).

    ``starved``: rank 1 waits 80 ms of each 100 ms step for data while rank 0 waits the same
    time at the all-reduce; otherwise both ranks compute 98 ms and wait 1 ms.
    """
    store = SampleStore("demo-job")
    infos = tuple(
        RankInfo(
            rank=r,
            world_size=2,
            local_rank=r,
            host=HOST,
            pid=4000 + r,
            device=f"cuda:{r}",
            parallel_mode="ddp",
            devices=(r,),
            loader=loader(),
            unmeasured=unmeasured,
            job="demo-job",
        )
        for r in range(2)
    )
    store.add(Batch(infos=infos))
    for i in range(steps):
        t = T0 + STEP_S * (i + 1)
        rows = []
        for r in range(2):
            if starved and r == 1:
                phases = dict(data_wait_s=0.080, forward_s=0.006, backward_s=0.0105, wait=0.0005)
            elif starved:
                phases = dict(data_wait_s=0.001, forward_s=0.006, backward_s=0.0895, wait=0.0795)
            else:
                phases = dict(data_wait_s=0.001, forward_s=0.030, backward_s=0.061, wait=0.001)
            wait = phases.pop("wait")
            if collective:  # exclusive phases: a measured wait is not inside backward
                phases["backward_s"] -= wait
            rows.append(
                StepSample(
                    rank=r,
                    step=i,
                    time=t,
                    step_s=STEP_S,
                    h2d_s=0.001,
                    optimizer_s=0.003,
                    collective_wait_s=wait if collective else None,
                    batch_size=32,
                    rss_bytes=2_000_000_000 + r,
                    mem_allocated_bytes=1_000_000_000,
                    mem_reserved_bytes=1_500_000_000,
                    mem_peak_bytes=1_200_000_000 + i,
                    **phases,
                )
            )
        procs: tuple[ProcessCpu, ...] = ()
        nodes: tuple[NodeCpu, ...] = ()
        if with_cpu and i % 5 == 4:
            procs = tuple(
                ProcessCpu(rank=r, time=t, pid=4000 + r, main_cpu=0.95, worker_cpu=(0.4, 0.4))
                for r in range(2)
            )
            nodes = (NodeCpu(host=HOST, time=t, cores=16.0, busy_cores=4.0, load1=3.5),)
        store.add(Batch(steps=tuple(rows), processes=procs, nodes=nodes))
    return store


def snapshot_of(store: SampleStore) -> Snapshot:
    now = store.latest_time()
    return store.snapshot(now if now is not None else T0, None)


def final_report(
    store: SampleStore, *, command: list[str], duration_s: float, exit_code: int = 0, **kwargs: Any
) -> tuple[Snapshot, list[Finding], dict[str, Any]]:
    """What a run ends with (as ``commands.run.run`` builds it): the whole run's snapshot at the
    newest sample, every rule's findings, and the JSON report of them (``kwargs``: notes, job...).
    """
    audit = Audit(store.job, window_s=None)
    audit.store = store  # the run's samples, as its audit held them
    snap, findings = audit.final()
    report = build_report(
        command=command,
        exit_code=exit_code,
        duration_s=duration_s,
        snapshot=snap,
        findings=findings,
        **kwargs,
    )
    return snap, findings, report


def starved_report(**kwargs: Any) -> tuple[Snapshot, list[Finding], dict[str, Any]]:
    """:func:`final_report` of :func:`make_store` (``kwargs``), with a note."""
    return final_report(
        make_store(**kwargs),
        command=["torchrun", "--nproc_per_node=2", "train.py", "--epochs", "1"],
        duration_s=12.3456789,
        notes=["GPU telemetry unavailable: no NVML on this host"],
    )


def starved_store(steps: int = 60, *, gpus: int = 2) -> SampleStore:
    """2 ranks, rank 1 starved for data (1 worker); ``gpus`` GPUs sampled every half second."""
    specs = with_rank(balanced(2, num_workers=1), 1, data_wait=0.117)
    builder = JobBuilder(specs, comm=0.001).run(steps)
    devices = []
    t = 1_000.0
    while t <= builder.now:
        for g in range(gpus):
            devices.append(
                DeviceSample(
                    node="node0",
                    index=g,
                    uuid=f"GPU-{g:08d}",
                    time=t,
                    model="Test GPU",
                    gpu_util=0.95 if g == 0 else 0.45,
                    mem_used_bytes=(10 + g) * GIB,
                    mem_total_bytes=80 * GIB,
                )
            )
        t += 0.5
    builder.store.add(Batch(devices=tuple(devices)))
    return builder.store


def report_of(store: SampleStore, **kwargs: Any) -> dict[str, Any]:
    """The final report of a 20 s run of ``store`` (``kwargs`` go to ``build_report``)."""
    assert store.latest_time() is not None
    return final_report(
        store, command=["torchrun", "--nproc_per_node=2", "train.py"], duration_s=20.0, **kwargs
    )[2]


def budget(rank: int, **kw: Any) -> MemoryBudget:
    """A measured budget as the probe sends it: Adam over 100 MiB of float32 parameters on an
    80 GiB GPU, activations 8 MiB per sample sampled at batch 32 (``kw`` overrides). Sent at
    time 0: before any step of the stores here, so every snapshot of them holds it."""
    base: dict[str, Any] = dict(
        rank=rank,
        time=0.0,
        step=1,
        device=f"cuda:{rank}",
        param_count=10,
        param_bytes=100 * MIB,
        param_bytes_by_dtype={"float32": 100 * MIB},
        grad_bytes=100 * MIB,
        optimizer_bytes=200 * MIB,
        optimizer_bytes_by_kind={"exp_avg": 100 * MIB, "exp_avg_sq": 100 * MIB},
        optimizer="Adam",
        buffer_bytes=2 * MIB,
        activation_bytes=256 * MIB,
        activation_batch=32,
        activations_every=10,
        device_total_bytes=80 * GIB,
        host_total_bytes=256 * GIB,
        host_available_bytes=200 * GIB,
        local_ranks=2,
    )
    base.update(kw)
    return MemoryBudget(**base)


def with_budgets(store: SampleStore, *budgets: MemoryBudget) -> SampleStore:
    """``store`` after its ranks sent ``budgets`` (as the node agents deliver them)."""
    store.add(Batch(memory=tuple(budgets)))
    return store
