"""data_starvation where the wait is the loader's workers starting at every epoch.

A loader without ``persistent_workers`` starts its workers anew at each epoch: the step that
creates the new iterator and waits for its first batch pays for it (the probe's
``StepSample.loader_start_s``). Once an epoch, a step's medians miss it; over the window it is
time the rank waits for data all the same, and the fix is to keep the workers, not to add more
or to make loading cheaper. The shape is a real one (``auditor run`` on a 2-rank CPU job, 4
workers, a worker start-up of 0.3 s, 20 steps an epoch): 0.35 s at each epoch's first batch,
41% of the run; ``persistent_workers=True`` ran it 1.88x faster.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import data_starvation, stall
from auditor.analysis.rules.data_starvation import WORKERS_KEPT, Facts
from auditor.analysis.snapshot import Snapshot
from auditor.report.phrasing import phrase
from tests.helpers.jobs import JobBuilder, balanced

EPOCH = 20  # steps an epoch
START_WAIT = 0.5  # each epoch's first batch, from workers that start anew
SPAWN = 0.25  # creating the iterator (its workers' processes), in no phase


def _restarting(epochs: int = 8, *, persistent: bool = False, named: bool = True) -> Snapshot:
    """Two ranks, 4 workers each, whose first step of every epoch but the first waits
    ``START_WAIT`` for data and spends ``SPAWN`` creating the iterator; ``named``: the probe
    saw the starts (``loader_start_s``), else the same waits with nothing said of them."""
    steady = balanced(2, num_workers=4, persistent_workers=persistent)
    first = balanced(2, num_workers=4, persistent_workers=persistent, data_wait=START_WAIT)
    job = JobBuilder(steady, jitter=0.0)
    for k in range(epochs * EPOCH):
        if k and k % EPOCH == 0:
            job.run(1, first)
            _started(job, named)
        else:
            job.run(1, steady)
    return job.snapshot()


def _started(job: JobBuilder, named: bool) -> None:
    """The last step of every rank also created a new iterator (``SPAWN`` in no phase; named
    ``loader_start`` where the probe saw the start)."""
    for q in job.store._steps.values():
        last = q.pop()
        q.append(
            replace(
                last,
                step_s=last.step_s + SPAWN,
                time=last.time + SPAWN,
                loader_start_s=START_WAIT + SPAWN if named else None,
                outside={"loader_start": SPAWN} if named else None,
            )
        )
    job.now += SPAWN


def _finding(snap: Snapshot) -> Finding:
    found = data_starvation.RULE(snap)
    assert [f.kind for f in found] == ["data_starvation"], [f.to_dict() for f in found]
    return found[0]


def _share(snap: Snapshot, rank: int) -> float:
    steps = snap.ranks[rank].steps
    return sum(s.loader_start_s or 0.0 for s in steps) / sum(s.step_s for s in steps)


def test_workers_started_at_every_epoch_are_kept_not_added() -> None:
    snap = _restarting()
    # A step's medians see a fed rank: the starts are one step in 20.
    assert snap.stats[0].data_wait_ratio < 0.05
    f = _finding(snap)
    assert f.ranks == (0, 1)
    share = _share(snap, 1)
    # 7 starts of 0.75 s in 8 epochs of 20 steps of 105 ms.
    assert share == pytest.approx(7 * 0.75 / (8 * EPOCH * 0.105 + 7 * 0.75), rel=0.02)
    # Kept, the starts' time is gone from the run.
    assert f.predicted_speedup == pytest.approx(1 / (1 - share), rel=0.01)
    assert f.evidence["speedup_model"] == WORKERS_KEPT
    assert f.fixes == tuple(
        Fix("persistent_workers", r, False, True, f.predicted_speedup, ("data_starvation",))
        for r in (0, 1)
    )
    row = f.evidence["per_rank"]["1"]
    assert row["loader_start_each_ms"] == pytest.approx((START_WAIT + SPAWN) * 1e3, rel=0.01)
    assert row["speedup_basis"] == WORKERS_KEPT
    assert isinstance(f.facts, Facts)
    words = phrase(f)
    assert "start at every epoch" in words.summary and "750 ms each time" in words.summary
    assert "persistent_workers=True keeps them" in words.fixes[1]


def test_the_same_waits_unnamed_are_not_taken_for_starts() -> None:
    # Without the probe's word on them, one long wait an epoch is not starvation of a step.
    assert data_starvation.RULE(_restarting(named=False)) == []


def test_a_persistent_loader_is_not_told_to_keep_its_workers() -> None:
    # Its workers started once (a second loader's first epoch, say): nothing to keep.
    assert data_starvation.RULE(_restarting(persistent=True)) == []


def test_the_starts_are_loading_not_a_stall() -> None:
    # The iterator's creation is in no phase: unnamed, it spikes every rank's own work once an
    # epoch (every rank alike); named a start, it is loading, as the first batch's wait is.
    assert [f.kind for f in stall.RULE(_restarting(named=False))] == ["stall"]
    assert stall.RULE(_restarting()) == []
