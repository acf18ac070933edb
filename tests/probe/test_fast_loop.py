"""What a fast real loop pays for, and what it still gets measured.

The host-to-device window: a loop that copies its batches has every copy timed; a loop that
stops making copies stops paying for the window, and one that starts making them again has them
timed within ``H2D_RECHECK_EVERY`` batches, then on every batch.

The loader's CPU time (a system call around each batch): a loader that hands out batches at
once has it read on every ``DATA_CPU_EVERY``-th step only (a starved rank's loader, which waits,
on every step: ``test_phases_torch.py``)."""

from __future__ import annotations

import pytest

from auditor.probe.clock import DATA_CPU_EVERY
from auditor.probe.probe import H2D_IDLE_WINDOWS, H2D_RECHECK_EVERY
from auditor.samples import StepSample

from . import JobResult, loop_tail, run_script

STEPS = 300
COPIES_FROM = 100  # the "late" loop copies its batches from this step on

SCRIPT = """
import sys, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
steps, copies_from = int(sys.argv[1]), int(sys.argv[2])
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(steps, 8), torch.randn(steps, 2)), batch_size=1)
for i, (x, y) in enumerate(data):
    if i >= copies_from:  # the batch's copy: a real one on CPU, through float64
        x = x.to(torch.float64).to(torch.float32)""" + loop_tail(1)


@pytest.fixture(scope="module")
def runs() -> dict[str, JobResult]:
    return run_script(
        SCRIPT,
        {name: [str(STEPS), str(first)] for name, first in (("always", 0), ("late", COPIES_FROM))},
    )


def steps_of(res: JobResult) -> list[StepSample]:
    steps = sorted(res.steps, key=lambda s: s.step)
    assert len(steps) >= STEPS - 1, f"{len(steps)} steps"
    return steps


def test_a_loop_that_copies_every_batch_has_every_copy_timed(
    runs: dict[str, JobResult],
) -> None:
    untimed = [s.step for s in steps_of(runs["always"]) if s.h2d_s <= 0.0]
    assert untimed == [], f"copies not timed on steps {untimed}"


def test_copies_that_start_late_are_timed_within_the_recheck_interval(
    runs: dict[str, JobResult],
) -> None:
    steps = steps_of(runs["late"])
    assert all(s.h2d_s == 0.0 for s in steps if s.step < COPIES_FROM)
    timed = [s.step for s in steps if s.h2d_s > 0.0]
    # Windows on batches 0..IDLE-1, then on every RECHECK-th: the first copy seen is the first
    # recheck at or after COPIES_FROM; from there on every batch has its window.
    first = H2D_IDLE_WINDOWS - 1
    while first < COPIES_FROM:
        first += H2D_RECHECK_EVERY
    assert timed == list(range(first, steps[-1].step + 1)), timed[:5]


def test_a_fast_loader_has_its_cpu_read_on_every_sixteenth_step(
    runs: dict[str, JobResult],
) -> None:
    """The step after every DATA_CPU_EVERY-th has the read; the others only where the step
    before waited a millisecond or more for its batch (a busy host's hiccup)."""
    for res in runs.values():
        steps = steps_of(res)
        read = {s.step for s in steps if s.data_cpu_s is not None}
        due = {s.step + 1 for s in steps if s.step % DATA_CPU_EVERY == 0} | {0}
        assert due & {s.step for s in steps} <= read
        waited = {s.step + 1 for s in steps if s.data_wait_s >= 0.001}
        assert read <= due | waited, sorted(read - due - waited)[:5]
        assert all(s.data_cpu_s >= 0.0 for s in steps if s.data_cpu_s is not None)
