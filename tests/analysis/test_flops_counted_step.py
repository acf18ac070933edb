"""The step whose FLOPs the probe counted (``StepSample.flops_counted``) paid for the counting:
the sample store keeps it out of the window's steps and the history the rules read, and keeps it
in the rank's account and step total. Without the flag, two counts on one rank (the first one
and a recount on a new shape), each slowing its forward by 0.3 s while the peer waits, read as a
stalling rank; flagged, nothing is found."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.snapshot import SampleStore
from auditor.samples import Batch, FlopCount, RankInfo, StepSample
from tests.helpers.jobs import balanced
from tests.helpers.stalls import StallSpec, stall_snapshot

COUNTED = (5, 20)


class FlaggingStore(SampleStore):
    """A store fed by a probe that counted rank 1's FLOPs on steps ``COUNTED``."""

    def add(self, batch: Batch) -> None:
        steps = tuple(
            replace(s, flops_counted=True) if s.rank == 1 and s.step in COUNTED else s
            for s in batch.steps
        )
        super().add(replace(batch, steps=steps))


def counting_cost(store: SampleStore) -> list[str]:
    snap = stall_snapshot(
        balanced(2), {1: StallSpec(0.3, steps=COUNTED, where="forward")}, steps=40, store=store
    )
    return [f.kind for f in analyze(snap) if f.severity in ("warning", "critical")]


def test_without_the_flag_the_counting_cost_reads_as_a_stall() -> None:
    assert "stall" in counting_cost(SampleStore(job="test"))


def test_flagged_counted_steps_raise_nothing() -> None:
    assert counting_cost(FlaggingStore(job="test")) == []


def steps(rank: int, n: int, counted: int, step_s: float = 0.1) -> list[StepSample]:
    """``n`` steps of ``step_s``; step ``counted`` flagged and ten times as long."""
    out = []
    for i in range(n):
        s = StepSample(rank=rank, step=i, time=10.0 + i, step_s=step_s, forward_s=step_s / 2)
        if i == counted:
            s = replace(s, step_s=10 * step_s, forward_s=9 * step_s, flops_counted=True)
        out.append(s)
    return out


def test_the_store_keeps_the_counted_step_out_of_what_the_rules_read() -> None:
    store = SampleStore("j")
    info = RankInfo(rank=1, world_size=2)
    first = FlopCount(rank=1, time=13.1, step=3, flops=3.0e9, by_dtype={"fp32": 3.0e9})
    later = replace(first, time=22.1, step=12, flops=4.0e9, by_dtype={"fp32": 4.0e9})
    store.add(Batch(infos=(info,), steps=tuple(steps(1, 20, counted=3)), flops=(later, first)))
    snap = store.snapshot(now=100.0, window_s=None)
    (view,) = snap.ranks
    assert 3 not in [s.step for s in view.steps] and len(view.steps) == 19
    stats = snap.stats[1]
    assert stats.steps == 19
    assert stats.step_s == pytest.approx(0.1) and stats.forward_s == pytest.approx(0.05)
    # Not in the run's history either (the rules over time), but in its account and its total.
    assert snap.history[1].steps == 19
    assert snap.total_steps[1] == 20
    assert snap.accounts[1].steps == 20
    assert snap.accounts[1].forward_s == pytest.approx(19 * 0.05 + 0.9)
    # Each rank's latest count at or before the window's end.
    assert view.flops == later
    assert store.snapshot(now=15.0, window_s=None).ranks[0].flops == first
    assert store.snapshot(now=5.0, window_s=None).ranks[0].flops is None
