"""A rank's run as bounded series over steps (auditor.analysis.history)."""

from __future__ import annotations

import pytest

from auditor.analysis.history import RankHistory
from auditor.analysis.snapshot import SampleStore
from auditor.samples import Batch, StepSample


def _step(i: int, *, forward: float = 0.01, wait: float | None = 0.002, rss: int = 0) -> StepSample:
    return StepSample(
        rank=0,
        step=i,
        time=100.0 + 0.02 * (i + 1),
        step_s=0.02,
        forward_s=forward,
        backward_s=0.005,
        collective_wait_s=wait,
        rss_bytes=rss,
    )


def test_short_runs_keep_every_step() -> None:
    h = RankHistory.of(0, [_step(i) for i in range(10)], max_buckets=16)
    assert h.width == 1
    assert [b.first_step for b in h.buckets] == list(range(10))
    assert h.steps == 10


def test_buckets_merge_pairwise_and_stay_bounded() -> None:
    h = RankHistory(0, max_buckets=8)
    for i in range(1_000):
        h.add(_step(i, rss=1_000 * i))
        assert len(h.buckets) <= 8
    assert h.steps == 1_000
    assert h.width == 128
    # Consecutive, covering every step once, of the width (the last one filling).
    firsts = [b.first_step for b in h.buckets]
    assert firsts == [128 * k for k in range(len(firsts))]
    assert [b.steps for b in h.buckets[:-1]] == [128] * (len(firsts) - 1)
    assert sum(b.steps for b in h.buckets) == 1_000
    # Sums read back as per-step means; memory is the level at a bucket's last step.
    b = h.buckets[1]
    assert b.mean("forward_s") == pytest.approx(0.01)
    assert b.mean("local_s") == pytest.approx(0.018)
    assert b.mean("other_s") == pytest.approx(0.003)
    assert b.rss_bytes == 1_000 * b.last_step
    assert (b.start, b.end) == pytest.approx((100.0 + 0.02 * 128, 100.0 + 0.02 * 256))


def test_unmeasured_waits_are_counted_apart() -> None:
    h = RankHistory.of(0, [_step(i, wait=None if i % 2 else 0.002) for i in range(4)])
    b = h.buckets[0]
    assert (b.steps, b.waits_measured) == (1, 1)
    assert h.buckets[1].waits_measured == 0


def test_a_week_of_steps_costs_what_a_minute_does() -> None:
    h = RankHistory(0)
    for i in range(200_000):
        h.add(_step(i))
    assert len(h.buckets) <= 512
    assert h.steps == 200_000


def test_the_store_keeps_it_and_a_snapshot_holds_a_frozen_copy() -> None:
    store = SampleStore("j", warmup_steps=5)
    store.add(Batch(steps=tuple(_step(i) for i in range(20))))
    snap = store.snapshot(now=1e9, window_s=None)
    # Warm-up steps are in the history (start-up is the history's to show), not in the window.
    assert snap.history[0].steps == 20
    assert len(snap.ranks[0].steps) == 15
    store.add(Batch(steps=(_step(20),)))
    assert snap.history[0].steps == 20


def test_max_buckets_must_halve_evenly() -> None:
    with pytest.raises(ValueError):
        RankHistory(0, max_buckets=7)


def test_a_frozen_copy_outlives_later_merges() -> None:
    h = RankHistory(0, max_buckets=4)
    for i in range(6):
        h.add(_step(i, rss=i))
    frozen = h.frozen()
    before = [(b.first_step, b.last_step, b.steps, b.rss_bytes) for b in frozen.buckets]
    for i in range(6, 40):
        h.add(_step(i, rss=i))
    assert [(b.first_step, b.last_step, b.steps, b.rss_bytes) for b in frozen.buckets] == before
    assert frozen.steps == 6 and h.steps == 40
