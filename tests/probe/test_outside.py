"""Named work outside the training phases, and the ends of a rank's run, from a real training
process (``scripts/outside.py``: a loop that saves checkpoints and evaluates every 4 steps).

The probe names a ``torch.save`` (and ``torch.distributed.checkpoint.save``) ``checkpoint`` and
the time between ``model.eval()`` and ``model.train()`` ``evaluation``; both are part of the
step's other time, never of its phases: the evaluation's forwards are not the step's forward, its
loader's waits not the step's data wait, its batches not the step's. The bounds come from the
script's known sleeps, not from how fast this machine is.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from auditor.samples import StepSample

from . import SCRIPTS, Job, JobResult

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCRIPT = SCRIPTS / "outside.py"
FWD_S, TRAIN_ITEM_S, EVAL_ITEM_S, SAVE_S, BATCH, EVAL_BATCHES = 0.01, 0.002, 0.01, 0.05, 4, 2
STEPS, EVERY = 12, 4
SAVES = (STEPS - 1) // EVERY


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, JobResult]]:
    started = {
        "save": Job([str(SCRIPT), f"--steps={STEPS}", f"--every={EVERY}"]),
        "dcp": Job([str(SCRIPT), f"--steps={STEPS}", f"--every={EVERY}", "--dcp"]),
    }
    results = {name: job.result() for name, job in started.items()}
    for name, res in results.items():
        assert res.returncode == 0, f"{name}: {res.stderr[-3000:]}"
        assert len(res.steps) == STEPS, name
    yield results


def named(steps: list[StepSample], name: str) -> float:
    return sum((s.outside or {}).get(name, 0.0) for s in steps)


def test_checkpoints_and_evaluation_are_named(jobs: dict[str, JobResult]) -> None:
    steps = jobs["save"].steps
    assert int(jobs["save"].printed("SAVES")) == SAVES
    # Each save pickles an object that takes SAVE_S; each evaluation loads EVAL_BATCHES batches
    # of BATCH slow items and runs a forward on each.
    assert named(steps, "checkpoint") >= SAVES * SAVE_S * 0.95
    evaluation = SAVES * EVAL_BATCHES * (BATCH * EVAL_ITEM_S + FWD_S)
    assert named(steps, "evaluation") >= evaluation * 0.95
    assert {k for s in steps for k in s.outside or {}} == {"checkpoint", "evaluation"}


def test_named_work_is_part_of_other_time_never_of_a_phase(jobs: dict[str, JobResult]) -> None:
    for s in jobs["save"].steps:
        outside = sum((s.outside or {}).values())
        # Exclusive: the phases and the named work add up to at most the step.
        assert outside <= s.other_s + 1e-6, s
        booked = s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0) + outside
        assert booked <= s.step_s + 1e-6, s


def test_evaluation_is_not_the_training_steps_forward_data_or_batch(
    jobs: dict[str, JobResult],
) -> None:
    steps = jobs["save"].steps
    with_eval = [s for s in steps if (s.outside or {}).get("evaluation", 0) > FWD_S]
    assert with_eval
    for s in with_eval:
        # One training forward, one training batch: the evaluation's own are not the step's.
        assert s.forward_s < 2 * FWD_S, s
        assert s.data_wait_s < BATCH * EVAL_ITEM_S, s
        assert s.batch_size == BATCH and s.micro_batches == 1, s


def test_distributed_checkpoint_save_is_named(jobs: dict[str, JobResult]) -> None:
    steps = jobs["dcp"].steps
    # The first save is torch.distributed.checkpoint's (imported by the script before its loop,
    # patched on that import), the others torch.save's.
    assert named(steps, "checkpoint") >= (SAVES - 1) * SAVE_S
    first = next(s for s in steps if (s.outside or {}).get("checkpoint"))
    assert first.step == EVERY - 1
    assert first.outside is not None
    # The whole of dcp.save is named (its planning, its files), not only the torch.save calls
    # its writer makes: the step's other time is all named but a few ms of the loop's own.
    assert first.other_s - sum(first.outside.values()) < 0.1 * first.outside["checkpoint"] + 0.005


def test_the_rank_reports_its_process_start_and_end(jobs: dict[str, JobResult]) -> None:
    res = jobs["save"]
    info = res.infos[0]
    started, finished = float(res.printed("STARTED")), float(res.printed("FINISHED"))
    assert info.started_at is not None and info.ended_at is not None
    # The process started before the script's first line, and ended after its last.
    assert info.started_at <= started
    assert info.ended_at >= finished
    first = min(s.time - s.step_s for s in res.steps)
    assert info.started_at < first
    assert info.ended_at >= max(s.time for s in res.steps)
