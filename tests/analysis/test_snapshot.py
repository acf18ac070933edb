"""SampleStore windows, bounded memory and run totals; Snapshot and per-rank statistics."""

from __future__ import annotations

import pytest

from auditor.analysis.snapshot import SampleStore
from auditor.samples import Batch, LoaderConfig, NodeCpu, ProcessCpu, RankInfo, StepSample
from tests.helpers.jobs import JobBuilder, RankSpec, balanced


def _step(rank: int, t: float, step_s: float = 0.1, **kw: float | int | None) -> StepSample:
    return StepSample(rank=rank, step=int(t), time=t, step_s=step_s, **kw)  # type: ignore[arg-type]


def _store(times: list[float], ranks: tuple[int, ...] = (0,), **kw: int) -> SampleStore:
    store = SampleStore(job="j", **kw)
    store.add(Batch(infos=tuple(RankInfo(rank=r, world_size=len(ranks)) for r in ranks)))
    for t in times:
        store.add(
            Batch(
                steps=tuple(_step(r, t) for r in ranks),
                processes=tuple(ProcessCpu(rank=r, time=t, pid=r, main_cpu=0.5) for r in ranks),
                nodes=(NodeCpu(host="", time=t, cores=4, busy_cores=1, load1=1),),
            )
        )
    return store


TIMES = [float(t) for t in range(1, 11)]  # samples at t = 1, 2, ..., 10


@pytest.mark.parametrize(
    ("now", "window", "expected"),
    [
        # (now - window, now]: the left edge is excluded, the right edge included.
        pytest.param(8.0, 3.0, [6.0, 7.0, 8.0], id="interior"),
        pytest.param(10.0, 2.0, [9.0, 10.0], id="latest"),
        pytest.param(10.0, 0.5, [10.0], id="only-now"),
        pytest.param(3.5, 1.0, [3.0], id="between-samples"),
        pytest.param(0.5, 5.0, [], id="before-everything"),
        pytest.param(20.0, 5.0, [], id="after-everything"),
        pytest.param(10.0, 100.0, TIMES, id="wider-than-run"),
        pytest.param(10.0, None, TIMES, id="no-window"),
        # No window still stops at now: later samples are not in it.
        pytest.param(4.0, None, [1.0, 2.0, 3.0, 4.0], id="no-window-stops-at-now"),
    ],
)
def test_window_keeps_samples_in_half_open_interval(
    now: float, window: float | None, expected: list[float]
) -> None:
    snap = _store(TIMES).snapshot(now=now, window_s=window)
    (view,) = snap.ranks
    assert [s.time for s in view.steps] == expected
    assert [c.time for c in view.cpu] == expected
    assert [n.time for n in snap.nodes] == expected
    assert snap.end == now
    if window is not None:
        assert snap.start == now - window
    else:
        assert snap.start == 1.0  # the first sample seen


def test_total_steps_count_the_whole_run_not_the_window() -> None:
    store = _store(TIMES, ranks=(0, 1))
    snap = store.snapshot(now=10.0, window_s=2.0)
    assert [len(v.steps) for v in snap.ranks] == [2, 2]
    assert snap.total_steps == {0: 10, 1: 10}
    assert snap.stats[0].steps == 2


def test_memory_is_bounded_per_rank_and_totals_survive() -> None:
    times = [float(t) for t in range(1, 101)]
    store = _store(times, ranks=(0, 1), max_steps_per_rank=10, max_cpu_per_rank=5)
    snap = store.snapshot(now=100.0, window_s=None)
    assert [view.info.rank for view in snap.ranks] == [0, 1]
    for view in snap.ranks:
        assert [s.time for s in view.steps] == [float(t) for t in range(91, 101)]
        assert [c.time for c in view.cpu] == [96.0, 97.0, 98.0, 99.0, 100.0]
    assert len(snap.nodes) <= 5
    assert snap.total_steps == {0: 100, 1: 100}
    assert store.total_steps() == {0: 100, 1: 100}
    # The oldest kept step is the first one the store still knows of.
    assert store.first_time() == 91.0
    assert snap.start == 91.0
    assert store.latest_time() == 100.0


def test_bounded_store_still_cuts_windows() -> None:
    times = [float(t) for t in range(1, 1001)]
    store = _store(times, max_steps_per_rank=50)
    snap = store.snapshot(now=1000.0, window_s=20.0)
    assert [s.time for s in snap.ranks[0].steps] == [float(t) for t in range(981, 1001)]
    assert snap.total_steps == {0: 1000}


def test_empty_store() -> None:
    store = SampleStore()
    assert store.latest_time() is None
    assert store.first_time() is None
    snap = store.snapshot(now=5.0, window_s=None)
    assert snap.ranks == ()
    assert snap.start == 5.0
    assert snap.world_size == 0
    assert snap.parallel_mode == "none"
    assert snap.stats == {}


def test_rank_without_info_gets_a_placeholder_and_infos_update() -> None:
    store = SampleStore()
    store.add(Batch(steps=(_step(2, 1.0),)))
    (view,) = store.snapshot(now=1.0, window_s=None).ranks
    assert view.info == RankInfo(rank=2, world_size=0)
    loader = LoaderConfig(
        num_workers=4,
        pin_memory=True,
        prefetch_factor=2,
        persistent_workers=True,
        batch_size=32,
        drop_last=False,
        sampler="DistributedSampler",
    )
    store.add(Batch(infos=(RankInfo(rank=2, world_size=4, loader=loader),)))
    (view,) = store.snapshot(now=1.0, window_s=None).ranks
    assert view.info.world_size == 4
    assert view.info.loader == loader


def test_ranks_with_info_only_and_ended_ranks() -> None:
    store = SampleStore()
    store.add(Batch(infos=(RankInfo(rank=0, world_size=2), RankInfo(rank=1, world_size=2))))
    store.add(Batch(steps=(_step(0, 1.0),), ended=(1,)))
    snap = store.snapshot(now=1.0, window_s=None)
    assert [v.info.rank for v in snap.ranks] == [0, 1]
    assert [len(v.steps) for v in snap.ranks] == [1, 0]
    assert [v.ended for v in snap.ranks] == [False, True]
    assert store.ended == {1}
    assert snap.world_size == 2


def test_add_all_is_add_in_order() -> None:
    batches = [Batch(steps=(_step(0, float(t)),)) for t in range(1, 6)]
    one, many = SampleStore(), SampleStore()
    for b in batches:
        one.add(b)
    many.add_all(batches)
    assert one.snapshot(5.0, None).ranks == many.snapshot(5.0, None).ranks


@pytest.mark.parametrize(
    ("modes", "expected"),
    [
        (("ddp", "ddp"), "ddp"),
        (("none", "ddp"), "ddp"),  # a rank that has not reported its mode yet
        (("dataparallel",), "dataparallel"),
        (("none", "none"), "none"),
    ],
)
def test_parallel_mode(modes: tuple[str, ...], expected: str) -> None:
    store = SampleStore()
    store.add(
        Batch(
            infos=tuple(
                RankInfo(rank=r, world_size=len(modes), parallel_mode=m)
                for r, m in enumerate(modes)
            )
        )
    )
    assert store.snapshot(now=0.0, window_s=None).parallel_mode == expected


def test_hosts_and_latest_node_cpu() -> None:
    store = SampleStore()
    store.add(
        Batch(
            infos=(
                RankInfo(rank=0, world_size=3, host="a"),
                RankInfo(rank=1, world_size=3, host="b"),
                RankInfo(rank=2, world_size=3, host="a"),
            ),
            steps=(_step(0, 3.0),),
            nodes=(
                NodeCpu(host="a", time=3.0, cores=8, busy_cores=7, load1=7),
                NodeCpu(host="a", time=1.0, cores=8, busy_cores=1, load1=1),
                NodeCpu(host="b", time=2.0, cores=4, busy_cores=2, load1=2),
            ),
        )
    )
    snap = store.snapshot(now=3.0, window_s=None)
    assert snap.hosts() == {"a": [0, 2], "b": [1]}
    node_a = snap.node_cpu("a")
    assert node_a is not None and node_a.time == 3.0 and node_a.busy_cores == 7
    node_b = snap.node_cpu("b")
    assert node_b is not None and node_b.cores == 4
    assert snap.node_cpu("c") is None


def test_step_compute_excludes_data_and_collective_wait() -> None:
    s = StepSample(
        rank=0,
        step=0,
        time=0.0,
        step_s=0.2,
        data_wait_s=0.05,
        h2d_s=0.01,
        forward_s=0.03,
        backward_s=0.05,
        optimizer_s=0.01,
        collective_wait_s=0.04,
    )
    # Exclusive phases: backward_s holds no collective wait; the rest of the step is other.
    assert s.compute_s == pytest.approx(0.01 + 0.03 + 0.05 + 0.01)
    assert s.other_s == pytest.approx(0.2 - 0.05 - 0.10 - 0.04)
    assert StepSample.from_row(s.to_row()) == s
    unmeasured = StepSample(rank=0, step=0, time=0.0, step_s=0.2, backward_s=0.09)
    assert unmeasured.compute_s == pytest.approx(0.09)


def test_stats_use_medians_so_one_stalled_step_does_not_count() -> None:
    store = SampleStore()
    store.add(Batch(infos=(RankInfo(rank=0, world_size=1),)))
    for t in range(1, 12):
        step_s = 10.0 if t == 5 else 0.1 + 0.001 * (t % 3)
        store.add(Batch(steps=(_step(0, float(t), step_s=step_s, data_wait_s=0.01),)))
    stats = store.snapshot(now=11.0, window_s=None).stats[0]
    assert stats.steps == 11
    # Duration-weighted, with the 10 s stall's weight capped at 5x the plain median step.
    assert stats.step_s == pytest.approx(0.101, abs=0.0015)
    assert stats.data_wait_ratio == pytest.approx(0.01 / stats.step_s)


def test_stats_weigh_steps_by_duration_so_a_fault_midway_is_not_outvoted() -> None:
    # 250 fast steps (28 ms, 7 s in all) then 200 starved ones (140 ms, 28 s in all): more of
    # the steps are fast, but most of the time is starved, and the verdict must say so.
    store = SampleStore()
    store.add(Batch(infos=(RankInfo(rank=0, world_size=1),)))
    t = 0.0
    for i in range(450):
        slow = i >= 250
        step_s, wait = (0.140, 0.115) if slow else (0.028, 0.002)
        t += step_s
        store.add(Batch(steps=(_step(0, t, step_s=step_s, data_wait_s=wait),)))
    stats = store.snapshot(now=t, window_s=None).stats[0]
    assert stats.step_s == pytest.approx(0.140)
    assert stats.data_wait_s == pytest.approx(0.115)


def test_warmup_steps_are_left_out_of_the_snapshot() -> None:
    store = SampleStore(warmup_steps=5)
    store.add(Batch(infos=(RankInfo(rank=0, world_size=1),)))
    for i in range(12):
        store.add(Batch(steps=(StepSample(rank=0, step=i, time=float(i + 1), step_s=0.1),)))
    snap = store.snapshot(now=12.0, window_s=None)
    assert [s.step for s in snap.ranks[0].steps] == list(range(5, 12))
    assert snap.total_steps[0] == 12  # the run's count still includes them


def test_rank_stats_from_constructed_job() -> None:
    # One rank of a 2-rank job, no jitter: exact figures.
    specs = [RankSpec(num_workers=3, worker_cpu=0.4, main_cpu=0.8), RankSpec(backward=0.1)]
    snap = JobBuilder(specs, jitter=0.0).run(10).snapshot()
    s0, s1 = snap.stats[0], snap.stats[1]
    assert s0.steps == 10
    assert s0.step_s == pytest.approx(0.141 + 0.004)  # slowest local (rank 1) + comm
    assert s0.collective_wait_s == pytest.approx(0.004 + 0.040)
    assert s1.collective_wait_s == pytest.approx(0.004)
    assert s0.local_s == pytest.approx(0.101)
    assert s1.local_s == pytest.approx(0.141)
    assert s0.compute_s == pytest.approx(0.100)
    assert s1.compute_s == pytest.approx(0.140)
    assert s0.busy_ratio == pytest.approx(0.100 / 0.145)
    assert s0.wait_ratio == pytest.approx(0.044 / 0.145)
    assert s0.batch_size == 32
    assert s0.samples_per_s == pytest.approx(32 / 0.145)
    assert s0.compute_per_sample_s == pytest.approx(0.100 / 32)
    assert s0.main_cpu == pytest.approx(0.8)
    assert s0.workers == 3
    assert s0.worker_cpu == pytest.approx(1.2)
    assert s0.worker_cpu_each == pytest.approx(0.4)
    assert s0.loader is not None and s0.loader.num_workers == 3
    assert s0.device == "cuda:0" and s1.device == "cuda:1"


def test_rank_stats_when_nothing_optional_was_measured() -> None:
    specs = balanced(2, batch_size=None, main_cpu=None, worker_cpu=None, measure_wait=False)
    s = JobBuilder(specs).run(10).snapshot().stats[0]
    assert s.collective_wait_s is None
    assert s.wait_ratio == 0.0
    assert s.local_s == s.step_s
    assert s.batch_size is None
    assert s.samples_per_s is None
    assert s.compute_per_sample_s is None
    assert s.main_cpu is None
    assert s.worker_cpu is None
    assert s.workers == 0
    assert s.worker_cpu_each is None


def test_builder_models_the_ddp_barrier() -> None:
    # Every rank sees the same step time; the slowest rank waits only the communication cost.
    snap = JobBuilder([RankSpec(), RankSpec(forward=0.08), RankSpec()]).run(20).snapshot()
    for i in range(20):
        steps = [v.steps[i] for v in snap.ranks]
        assert len({s.step_s for s in steps}) == 1
        assert len({s.time for s in steps}) == 1
        waits = [s.collective_wait_s or 0.0 for s in steps]
        assert min(waits) == waits[1]
        for s in steps:
            own = s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s
            assert own + (s.collective_wait_s or 0.0) == pytest.approx(s.step_s)
            assert s.other_s == pytest.approx(0.0, abs=1e-9)


def test_one_sample_fast_path_matches_the_general_statistics() -> None:
    """A rank with one aggregated sample (the operator path) gets the figures the general path
    computes for the same steps split over two samples."""
    from dataclasses import replace

    from auditor.analysis.snapshot import RankView
    from auditor.analysis.stats import rank_stats
    from auditor.samples import ProcessCpu, RankInfo, StepSample

    step = StepSample(
        rank=1, step=3, time=1.0, step_s=0.2, data_wait_s=0.1, h2d_s=0.004, forward_s=0.03,
        backward_s=0.05, optimizer_s=0.006, collective_wait_s=0.01, batch_size=32,
        rss_bytes=10, mem_allocated_bytes=15, mem_peak_bytes=20, count=7,
    )  # fmt: skip
    info = RankInfo(rank=1, world_size=2, host="h", device="cuda:1")
    cpu = (ProcessCpu(rank=1, time=1.0, pid=0, main_cpu=0.9, worker_cpu=(0.3, 0.3)),)
    one = rank_stats(RankView(info=info, steps=(step,), cpu=cpu))
    split = (replace(step, count=3), replace(step, count=4, time=2.0))
    two = rank_stats(RankView(info=info, steps=split, cpu=cpu))
    assert one == two
    assert one.steps == 7 and one.compute_s == step.compute_s


def test_each_ranks_statistics_count_its_views_steps() -> None:
    """``most_steps`` reads the statistics' step counts: each equals its view's (several samples,
    one sample standing for several steps, no step at all)."""
    store = _store(TIMES, ranks=(0, 1, 2))
    store.add(Batch(steps=(StepSample(rank=1, step=99, time=10.5, step_s=0.1, count=7),)))
    store.add(Batch(infos=(RankInfo(rank=3, world_size=4),)))
    snap = store.snapshot(now=11.0, window_s=20.0)
    counts = {v.info.rank: v.step_count for v in snap.ranks}
    assert counts == {0: 10, 1: 17, 2: 10, 3: 0}
    assert {r: s.steps for r, s in snap.stats.items()} == counts
    assert snap.most_steps == 17
