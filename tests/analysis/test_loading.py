"""Loading cost: I/O-bound or CPU-bound, from the CPU the loading takes while it loads; and the
per-rank figures it reads (data CPU, collective waits by operation, worker memory)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis.loading import (
    CPU,
    IO,
    MAIN_THREAD_CPU,
    UNKNOWN,
    WORKERS_CPU,
    fair_share,
    loading_cost,
)
from auditor.analysis.snapshot import Snapshot
from tests.helpers.jobs import CPU_RANK, TWO_CORES_BUSY, NodeSpec, RankSpec, ddp_snapshot
from tests.helpers.snapshots import collective_ops, data_cpu, load_average, process_memory
from tests.helpers.units import GIB


def _main_loader(share: float | None, nodes: dict | None = None) -> Snapshot:
    """Rank 1 of 2 waits 160 ms a step while its main process loads, using ``share`` of that
    wait in CPU (None: not measured)."""
    specs = [CPU_RANK, RankSpec(**{**CPU_RANK.__dict__, "data_wait": 0.160, "main_cpu": 0.6})]
    snap = ddp_snapshot(specs, nodes=nodes or TWO_CORES_BUSY)
    return snap if share is None else data_cpu(snap, 1, share)


def _workers(each: float, *, busy: float, load1: float | None = None) -> Snapshot:
    """Rank 3 of 8 on a 16-core host waits for its 8 workers, each using ``each`` cores."""
    specs = [RankSpec() for _ in range(8)]
    specs[3] = RankSpec(data_wait=0.156, num_workers=8, worker_cpu=each)
    snap = ddp_snapshot(specs, nodes={"node0": NodeSpec(cores=16, busy_cores=busy)})
    return snap if load1 is None else load_average(snap, load1)


@pytest.mark.parametrize(
    ("snap", "rank", "kind", "cores"),
    [
        # The main thread slept through its data wait: 3% of a core while loading.
        pytest.param(_main_loader(0.03), 1, IO, 0.03, id="main-process-sleeps-io"),
        # The main thread decoded through it: 90% of a core.
        pytest.param(_main_loader(0.90), 1, CPU, 0.90, id="main-process-decodes-cpu"),
        # An older probe: no data CPU, so no verdict.
        pytest.param(_main_loader(None), 1, UNKNOWN, None, id="main-process-unmeasured"),
        # 8 workers at 0.9 cores each on a host with cores to spare: CPU-bound.
        pytest.param(_workers(0.9, busy=12.0), 3, CPU, 0.9, id="workers-decode-cpu"),
        # 0.02 cores each: they wait on storage.
        pytest.param(_workers(0.02, busy=12.0), 3, IO, 0.02, id="workers-wait-io"),
        # 0.09 cores each on a saturated host where the job's 30 processes compete: a CPU-bound
        # worker gets 16 / 30 = 0.53 cores, so 0.09 is 17% of it: I/O.
        pytest.param(_workers(0.09, busy=16.0), 3, IO, 0.09, id="saturated-few-competitors-io"),
        # The same 0.09 with a load average of 60 on 16 cores: a CPU-bound worker gets 0.27
        # cores; 0.09 is a third of that: CPU-bound workers sharing a crowded host.
        pytest.param(
            _workers(0.09, busy=16.0, load1=60.0), 3, CPU, 0.09, id="saturated-crowded-cpu"
        ),
    ],
)
def test_kind_of_loading(snap: Snapshot, rank: int, kind: str, cores: float | None) -> None:
    cost = loading_cost(snap, snap.stats[rank])
    assert cost.kind == kind, cost
    if cores is None:
        assert cost.cores is None and cost.cpu_s is None
        assert cost.missing == MAIN_THREAD_CPU
    else:
        assert cost.cores == pytest.approx(cores, rel=0.03)
        assert cost.missing == ""
    assert cost.evidence()["kind"] == kind


def test_load_per_batch_and_cpu_per_batch() -> None:
    # num_workers=0: the load time is the wait (160 ms) and its CPU 3% of it (4.8 ms).
    cost = loading_cost(_main_loader(0.03), _main_loader(0.03).stats[1])
    assert cost.workers == 0
    assert cost.load_s == pytest.approx(0.160, rel=0.02)
    assert cost.cpu_s == pytest.approx(0.0048, rel=0.03)
    # 8 workers that cannot keep up: each delivers one batch per 8 steps (8 x 260 ms), at
    # 0.9 cores that is 1.87 s of CPU per batch.
    snap = _workers(0.9, busy=12.0)
    cost = loading_cost(snap, snap.stats[3])
    assert cost.load_s == pytest.approx(8 * 0.260, rel=0.02)
    assert cost.cpu_s == pytest.approx(0.9 * 8 * 0.260, rel=0.02)
    assert cost.evidence()["loaders"] == 8
    # Workers whose CPU was not sampled: no verdict, and the evidence says so by code.
    snap = _workers(0.9, busy=12.0)
    unmeasured = loading_cost(snap, replace(snap.stats[3], worker_cpu=None))
    assert (unmeasured.kind, unmeasured.missing) == (UNKNOWN, WORKERS_CPU)


@pytest.mark.parametrize(
    ("busy", "load1", "expected"),
    [
        # Cores to spare: a CPU-bound process gets a whole core.
        pytest.param(12.0, None, 1.0, id="idle-cores"),
        # Saturated: 8 mains + 7 x 2 + 8 workers = 30 job processes on 16 cores (the busy
        # cores are all explained by them: 7 x 1.9 + 0.9 + 8 x 0.5 = 18.2 >= 16).
        pytest.param(16.0, None, 16 / 30, id="saturated-by-the-job"),
        # A load average above that count wins.
        pytest.param(16.0, 64.0, 16 / 64, id="load-average"),
    ],
)
def test_fair_share(busy: float, load1: float | None, expected: float) -> None:
    snap = _workers(0.5, busy=busy, load1=load1)
    assert fair_share(snap, "node0") == pytest.approx(expected, rel=0.01)
    assert fair_share(snap, "elsewhere") == 1.0  # a host never sampled


def test_stats_read_data_cpu_ops_and_worker_memory() -> None:
    snap = data_cpu(_main_loader(None), 1, 0.5)
    snap = collective_ops(snap, 0, {"all_gather": 3.0, "ddp_allreduce": 1.0})
    snap = process_memory(snap, 1, rss=2 * GIB, worker_rss=None)
    s0, s1 = snap.stats[0], snap.stats[1]
    assert s1.data_cpu_s == pytest.approx(0.080, rel=0.02)
    assert s0.data_cpu_s is None
    assert s0.collective_ops is not None
    assert s0.collective_ops["all_gather"] == pytest.approx(3 * s0.collective_ops["ddp_allreduce"])
    assert sum(s0.collective_ops.values()) == pytest.approx(s0.collective_wait_s, rel=0.02)
    assert s0.collective_ops_order() == ("all_gather", "ddp_allreduce")
    assert s1.collective_ops is None and s1.collective_ops_order() == ()
    assert s1.main_rss_bytes == 2 * GIB
    assert s1.worker_rss_bytes is None and s1.worker_rss_each is None


def test_workers_that_wait_for_a_core_are_cpu_bound_not_io() -> None:
    # 0.09 cores each on a saturated host read as I/O from their CPU alone (the case above);
    # the kernel says each also waited 0.2 s a second for a core, longer than it ran: short of
    # cores, not waiting on storage.
    snap = _workers(0.09, busy=16.0)
    starved = replace(snap.stats[3], worker_wait=8 * 0.2)
    cost = loading_cost(snap, starved)
    assert cost.kind == CPU and cost.short_of_cores
    assert cost.wait_s == pytest.approx(0.2 * cost.load_s, rel=0.02)
    assert cost.demand == pytest.approx(0.29, rel=0.02)
    assert cost.evidence()["core_wait_per_batch_ms"] == pytest.approx(cost.wait_s * 1e3, abs=0.1)
    # Workers that waited less than they ran are judged by their CPU, as before: I/O here.
    less = loading_cost(snap, replace(snap.stats[3], worker_wait=8 * 0.05))
    assert less.kind == IO and not less.short_of_cores
    # A wait never turns CPU-bound loading into I/O (workers that keep up most of the time use
    # little CPU and wait little: the fair share judges them).
    busy = _workers(0.9, busy=12.0)
    assert loading_cost(busy, replace(busy.stats[3], worker_wait=0.0)).kind == CPU
    # Not measured: the CPU alone decides, as before.
    unmeasured = loading_cost(snap, snap.stats[3])
    assert unmeasured.wait_s is None and "core_wait_per_batch_ms" not in unmeasured.evidence()
