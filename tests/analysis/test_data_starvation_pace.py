"""data_starvation at a loader's pace: DataLoader workers that cannot keep up deliver their
batches in rounds (``w`` workers started together finish together), so the starved rank's steps
alternate one long wait with ``w - 1`` short steps. The load per batch and the speed-up are read
from the mean step over those rounds, not from a median that lands on the long steps.

The recorded shape (an HF Trainer job, ``dataloader_num_workers=2``): rank 1's dataset takes
200 ms to load a batch, its compute ~35 ms; steps alternated ~36 ms / ~165 ms. The duration-
weighted median step (155 ms) read the load as ``2 * 155 = 311 ms`` and asked for
``num_workers 2 -> 10`` at 3.3x, where ~7 keep up and ~2.5x is real.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import data_starvation
from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.analysis.stats import RankStats
from auditor.samples import Batch
from tests.helpers.jobs import JobBuilder, RankSpec, with_rank

LOAD_S = 0.200  # one worker's wall time per batch on rank 1 (sleep-like reads: I/O-bound)
COMM = 0.004
# 37.5 ms of own work a step on both ranks; rank 0 waits 1 ms for its (fed) data.
WORK = {"h2d": 0.002, "forward": 0.011, "backward": 0.022, "optimizer": 0.0025}
OWN_WORK = sum(WORK.values())
SPECS = [
    RankSpec(data_wait=0.001, num_workers=2, **WORK),  # type: ignore[arg-type]
    RankSpec(data_wait=0.0, num_workers=2, worker_cpu=0.03, **WORK),  # type: ignore[arg-type]
]


def _bursty_job(
    steps: int = 120,
    *,
    workers: int = 2,
    load_s: float = LOAD_S,
    stall: tuple[int, float] | None = None,
    seed: int = 1,
) -> JobBuilder:
    """Two DDP ranks; rank 1's ``workers`` DataLoader workers each load a batch in ``load_s``
    (+-5% jitter) back to back, delivered in order (batch ``i`` by worker ``i % workers``), and
    rank 1 blocks in ``__next__`` until its batch is there. ``stall``: (step, seconds) of an
    evaluation between two steps, booked to no phase, as the probe sees one.
    """
    rng = random.Random(seed)
    specs = with_rank(SPECS, 1, num_workers=workers)
    job = JobBuilder(specs, comm=COMM, jitter=0.0)
    done: list[float] = []  # when each batch was loaded (seconds since the start)
    taken: list[float] = []  # when the rank took it
    now = 0.0
    for i in range(steps):
        # A worker starts its next batch once its last is done and its prefetch slots allow
        # (prefetch_factor 2: at most 2 * workers batches loaded ahead of the rank).
        start = max(
            done[i - workers] if i >= workers else 0.0,
            taken[i - 2 * workers] if i >= 2 * workers else 0.0,
        )
        done.append(start + load_s * (1.0 + rng.uniform(-0.05, 0.05)))
        wait = max(0.0, done[i] - now)
        taken.append(now + wait)
        job.run(1, with_rank(specs, 1, data_wait=wait))
        now += wait + OWN_WORK + COMM + max(0.0, 0.001 - wait)  # the barrier: max(local) + comm
        if stall is not None and stall[0] == i:
            _stall(job, stall[1])
            now += stall[1]
    return job


def _stall(job: JobBuilder, seconds: float) -> None:
    """Lengthen the last step of every rank by ``seconds`` outside its phases."""
    store = job.store
    for q in store._steps.values():
        last = q.pop()
        q.append(replace(last, step_s=last.step_s + seconds, time=last.time + seconds))
    job.now += seconds


def _true_pace(job: JobBuilder) -> float:
    """Rank 1's wall time per step over the window: total / steps."""
    steps = job.snapshot().ranks[1].steps
    return sum(s.step_s for s in steps) / len(steps)


def _finding(snap: Snapshot) -> Finding:
    found = data_starvation.RULE(snap)
    assert [f.kind for f in found] == ["data_starvation"], [f.to_dict() for f in found]
    return found[0]


def test_the_fixture_has_the_recorded_shape() -> None:
    job = _bursty_job()
    steps = job.snapshot().ranks[1].steps[10:]
    short = [s.step_s for s in steps if s.step_s < 0.08]
    long = [s.step_s for s in steps if s.step_s >= 0.08]
    assert len(short) == pytest.approx(len(long), abs=2)  # they alternate
    assert max(short) < 0.05 and min(long) > 0.14
    assert _true_pace(job) == pytest.approx(LOAD_S / 2, rel=0.05)
    s = job.snapshot().stats[1]
    # The medians land on the long steps; the mean is the pace.
    assert s.step_s > 0.14
    assert s.mean_step_s == pytest.approx(_true_pace(job), rel=0.03)
    assert s.mean_data_wait_s == pytest.approx(LOAD_S / 2 - OWN_WORK - COMM, rel=0.1)


def test_workers_and_speedup_follow_the_true_load() -> None:
    job = _bursty_job()
    snap = job.snapshot()
    f = _finding(snap)
    assert f.ranks == (1,)
    row = f.evidence["per_rank"]["1"]
    # L = 2 workers * the mean step (~100 ms) ~= 200 ms, the dataset's own load time.
    assert row["load_per_batch_ms"] == pytest.approx(LOAD_S * 1e3, rel=0.05)
    assert row["step_ms"] == pytest.approx(_true_pace(job) * 1e3, rel=0.03)
    # b = ceil(1.25 * 200 / 37.5) = ceil(6.7) = 7 (I/O-bound: not capped by cores).
    assert row["recommended_workers"] == 7
    assert f.fixes[0] == Fix("num_workers", 1, 2, 7, f.predicted_speedup, ("data_starvation",))
    # With 7 workers a batch arrives every ~29 ms < 37.5 ms of work: rank 1 waits what rank 0
    # waits (1 ms). After: 37.5 + 1 + 4 ms of communication = 42.5 ms a step; before: the
    # true pace, ~100 ms. The speed-up is the real one, ~2.35x.
    true_after = OWN_WORK + 0.001 + COMM
    assert f.predicted_speedup == pytest.approx(_true_pace(job) / true_after, rel=0.05)


def test_the_median_step_would_have_asked_for_10_or_more() -> None:
    # What the rule read before: the duration-weighted median step, on the long steps.
    s: RankStats = _bursty_job().snapshot().stats[1]
    old_load = 2 * s.step_s
    assert old_load > 0.28  # ~315 ms, not 200
    assert -(-1.25 * old_load // OWN_WORK) >= 10


def test_the_same_rounds_are_the_mean_whatever_the_workers() -> None:
    # 4 workers, 400 ms a batch: one long step (~290 ms) and three short ones (~42 ms) a round.
    # Most steps are short: the plain median says ~42 ms, the weighted one ~290 ms; the pace
    # is 100 ms a step, a load of 400 ms: b = ceil(1.25 * 400 / 37.5) = ceil(13.3) = 14.
    job = _bursty_job(160, workers=4, load_s=0.400)
    s = job.snapshot().stats[1]
    assert s.mean_step_s == pytest.approx(_true_pace(job), rel=0.03)
    f = _finding(job.snapshot())
    row = f.evidence["per_rank"]["1"]
    assert row["load_per_batch_ms"] == pytest.approx(400, rel=0.05)
    assert row["recommended_workers"] == 14


def test_an_evaluation_stall_does_not_move_the_pace() -> None:
    # A 6 s evaluation between two steps (most of the window's time): a plain mean would read
    # the pace as ~150 ms and ask for 10 workers; it moves one round only.
    job = _bursty_job(stall=(60, 6.0))
    s = job.snapshot().stats[1]
    plain_mean = sum(x.step_s for x in job.snapshot().ranks[1].steps) / s.steps
    assert plain_mean > 0.14
    assert s.mean_step_s == pytest.approx(LOAD_S / 2, rel=0.06)
    f = _finding(job.snapshot())
    assert f.evidence["per_rank"]["1"]["recommended_workers"] == 7


def test_serve_windows_are_means_already() -> None:
    # ``auditor serve`` reduces each rank's window to one sample of total / steps: the same
    # pace, the same fix.
    job = _bursty_job()
    snap = job.snapshot()
    store = SampleStore(job="test")
    steps = []
    for view in snap.ranks:
        xs = view.steps
        n = len(xs)

        def mean(name: str, xs: tuple = xs, n: int = n) -> float:
            return sum(getattr(x, name) for x in xs) / n

        steps.append(
            replace(
                xs[-1],
                step_s=mean("step_s"),
                data_wait_s=mean("data_wait_s"),
                h2d_s=mean("h2d_s"),
                forward_s=mean("forward_s"),
                backward_s=mean("backward_s"),
                optimizer_s=mean("optimizer_s"),
                collective_wait_s=mean("collective_wait_s"),
                count=n,
            )
        )
    store.add(
        Batch(
            infos=tuple(v.info for v in snap.ranks),
            steps=tuple(steps),
            processes=tuple(p for v in snap.ranks for p in v.cpu[-1:]),
            nodes=(),
        )
    )
    one = store.snapshot(now=job.now, window_s=None)
    s1, s = one.stats[1], snap.stats[1]
    assert s1.step_s == s1.mean_step_s == pytest.approx(s.mean_step_s, rel=0.03)
    f = _finding(one)
    assert f.evidence["per_rank"]["1"]["recommended_workers"] == 7


def test_without_workers_the_pace_is_the_median() -> None:
    # No rounds with 0 or 1 worker: the mean figures are the medians (robust to outliers).
    for workers in (0, 1):
        snap = JobBuilder(with_rank(SPECS, 1, num_workers=workers, data_wait=0.1)).run(24)
        s = snap.snapshot().stats[1]
        assert s.mean_step_s == s.step_s
        assert s.mean_data_wait_s == s.data_wait_s
        assert s.mean_collective_wait_s == s.collective_wait_s


def test_peers_wait_by_operation_at_the_same_pace() -> None:
    # Rank 0 waits for rank 1 in the all-reduce on the long steps only: its wait by operation
    # is taken over the same rounds as its total, so the operations never add up to more.
    job = _bursty_job()
    store = job.store
    for q in store._steps.values():
        for i, s in enumerate(q):
            if s.collective_wait_s is not None:
                q[i] = replace(s, collective_ops={"ddp_allreduce": s.collective_wait_s})
    s = job.snapshot().stats[0]
    assert s.collective_ops is not None and s.mean_collective_ops is not None
    assert s.collective_ops["ddp_allreduce"] > 0.1  # the median: a long step's wait
    paced = s.paced()
    assert paced.collective_ops == {"ddp_allreduce": pytest.approx(paced.collective_wait_s)}
    assert paced.collective_wait_s == pytest.approx(LOAD_S / 2 - OWN_WORK - COMM, rel=0.15)


def test_the_rank_table_shows_the_pace_the_finding_reads() -> None:
    """The report's row of the bursty rank (JSON, terminal, HTML and the live panel all read it)
    gives the step and data wait at its pace, the figures the finding speaks in: not a median
    step of 155 ms beside a finding's 100 ms. Its phases still add up to its step."""
    from auditor.report.json_report import make_report

    job = _bursty_job()
    snap = job.snapshot()
    f = _finding(snap)
    report = make_report(
        command=["train.py"], exit_code=0, duration_s=30.0, snapshot=snap, findings=[f]
    )
    row = next(r for r in report.ranks if r.rank == 1)
    assert row.step_s is not None and row.data_wait_s is not None and row.compute_s is not None
    assert row.step_s * 1e3 == pytest.approx(f.evidence["per_rank"]["1"]["step_ms"], abs=0.1)
    assert row.step_s == pytest.approx(_true_pace(job), rel=0.03)
    assert snap.stats[1].step_s > 0.14  # the median, no longer shown
    parts = row.data_wait_s + row.compute_s + (row.collective_wait_s or 0.0)
    assert parts == pytest.approx(row.step_s, rel=0.1)
    # Rank 0 waits for rank 1 at every all-reduce, so its steps alternate alike: the same pace.
    fed = next(r for r in report.ranks if r.rank == 0)
    assert fed.step_s == pytest.approx(row.step_s, rel=0.05)
