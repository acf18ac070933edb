"""A loader without ``persistent_workers`` starts its workers anew at every epoch; the step that
pays for it says how long (``StepSample.loader_start_s``: the new iterator's creation and the
wait for its first batch). A persistent loader keeps its workers: after the run's first epoch
(start-up, before any step), no step starts any."""

from __future__ import annotations

import pytest

from auditor.samples import StepSample

from . import JobResult, loop_tail, run_script

EPOCH = 8  # batches an epoch
EPOCHS = 4
WORKER_START_S = 0.2  # each worker's own start-up (its imports, opening its files)

SCRIPT = """
import sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
epoch, epochs, persistent = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
start_s = float(sys.argv[4])

def started(_):
    time.sleep(start_s)

model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(epoch * 4, 8), torch.randn(epoch * 4, 2)),
                  batch_size=4, num_workers=2, worker_init_fn=started,
                  persistent_workers=persistent)
for _ in range(epochs):
    for x, y in data:""" + loop_tail(2)


@pytest.fixture(scope="module")
def runs() -> dict[str, JobResult]:
    argv = [str(EPOCH), str(EPOCHS), "{}", str(WORKER_START_S)]
    return run_script(
        SCRIPT,
        {
            name: [a.format(persistent) for a in argv]
            for name, persistent in (("restarted", "0"), ("persistent", "1"))
        },
    )


def _starts(res: JobResult) -> dict[int, float]:
    steps: list[StepSample] = sorted(res.steps, key=lambda s: s.step)
    assert len(steps) >= EPOCH * EPOCHS - 1, f"{len(steps)} steps"
    return {s.step: s.loader_start_s for s in steps if s.loader_start_s is not None}


def test_a_loader_that_restarts_its_workers_books_each_start_on_the_step_that_pays(
    runs: dict[str, JobResult],
) -> None:
    starts = _starts(runs["restarted"])
    # The epoch's last batch asked for (StopIteration) opens the step that creates the next
    # iterator and waits for its first batch: the first step of every epoch but the run's first.
    assert sorted(starts) == [EPOCH * k for k in range(1, EPOCHS)], starts
    for seconds in starts.values():
        assert WORKER_START_S <= seconds < 10 * WORKER_START_S
    # The start is part of the step's time (its wait for the first batch is data wait).
    steps = {s.step: s for s in runs["restarted"].steps}
    for step, seconds in starts.items():
        assert steps[step].step_s >= seconds
        assert steps[step].data_wait_s >= WORKER_START_S
        # The iterator's creation is named work (in no phase), part of the start.
        created = (steps[step].outside or {}).get("loader_start")
        assert created is not None and 0 < created < seconds - WORKER_START_S + 1e-6
    assert all(s.outside is None for s in steps.values() if s.step not in starts)


def test_a_persistent_loader_starts_none_after_its_first_epoch(
    runs: dict[str, JobResult],
) -> None:
    assert _starts(runs["persistent"]) == {}
