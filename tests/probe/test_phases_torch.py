"""Exclusive phases and named collectives on real two-rank jobs (torchrun, gloo, CPU).

Each job (``scripts/phases.py``) nests the phases the way a framework does: a closure inside
``optimizer.step``, activation checkpointing, an explicit all-reduce after backward, a gather
between the batch and the forward (Hugging Face Trainer), FSDP2's ``fully_shard``. For every
step of every rank the phases must not overlap (they add up to at most the step) and leave
little unbooked; the collectives must carry their names. The model's forward sleeps a known
time, so the bounds below come from those sleeps, not from how fast this machine is.
"""

from __future__ import annotations

import statistics

import pytest

from auditor.samples import StepSample

from . import SCRIPTS, Job, JobResult

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PHASES_SCRIPT = SCRIPTS / "phases.py"
FWD_S = 0.02  # the script's forward sleep per step
JOBS = {
    "closure": ["--slow-rank", "1"],
    "checkpoint": [],
    "allreduce": ["--slow-rank", "1"],
    "gather": ["--starve-rank", "1"],
    "fsdp": ["--slow-rank", "1"],
    "fsdp1": ["--slow-rank", "1"],
}


def start(shape: str) -> Job:
    argv = [
        # --standalone: the rendezvous binds a free port itself (no race between jobs).
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(PHASES_SCRIPT), "--shape", shape, *JOBS[shape],
    ]  # fmt: skip
    return Job(argv, env={"AUDITOR_EXIT_WAIT_S": "10"})


def torn_down_badly(res: JobResult) -> bool:
    """Both ranks finished training, then one aborted while the interpreter shut down: gloo's
    worker threads at finalization (pytorch/pytorch#190489, #179291), rare on a loaded host."""
    done = all(f"RANK{r}_DONE=1" in res.stdout for r in (0, 1))
    return done and "terminate called without an active exception" in res.stderr


@pytest.fixture(scope="module")
def jobs() -> dict[str, JobResult]:
    started = {shape: start(shape) for shape in JOBS}
    out = {}
    for shape, job in started.items():
        res = job.result(timeout=240, wait_rank_s=20, ranks=2)
        if res.returncode != 0 and torn_down_badly(res):
            res = start(shape).result(timeout=240, wait_rank_s=20, ranks=2)  # once more
        assert res.returncode == 0, (
            f"{shape}: rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        )
        out[shape] = res
    return out


def by_rank(res: JobResult) -> dict[int, list[StepSample]]:
    ranks: dict[int, list[StepSample]] = {}
    for s in res.steps:
        ranks.setdefault(s.rank, []).append(s)
    return ranks


def check_adds_up(res: JobResult, shape: str) -> dict[int, list[StepSample]]:
    ranks = by_rank(res)
    assert sorted(ranks) == [0, 1], f"{shape}: ranks {sorted(ranks)}"
    for r, steps in ranks.items():
        assert len(steps) >= 6, f"{shape} rank {r}: {len(steps)} steps"
        for s in steps:
            booked = s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0)
            # Exclusive: never more than the step (host marks on both sides: tiny slack only).
            assert booked <= s.step_s * 1.001 + 1e-4, f"{shape} rank {r}: overlap in {s}"
            if s.collective_ops is not None:
                assert sum(s.collective_ops.values()) == pytest.approx(s.collective_wait_s)
            # The batch's copies (Tensor.to after the batch arrived) are h2d, and only they are.
            assert s.h2d_s > 0.0, f"{shape} rank {r}: the batch's copy was not timed"
        # Little is left unbooked: the loop's own Python against sleeps of tens of ms.
        other = statistics.median(s.other_s / s.step_s for s in steps[1:])
        assert other < 0.2, f"{shape} rank {r}: {other:.0%} of the step in no phase"
    return ranks


def median(steps: list[StepSample], field: str) -> float:
    return statistics.median(float(getattr(s, field) or 0.0) for s in steps[1:])


def test_closure_inside_optimizer_step(jobs: dict[str, JobResult]) -> None:
    ranks = check_adds_up(jobs["closure"], "closure")
    for steps in ranks.values():
        for s in steps:
            assert s.forward_s >= FWD_S * 0.95  # the forward inside the closure is forward
            assert s.optimizer_s < s.forward_s  # ... and the optimizer keeps only its update
            assert s.collective_ops is not None and "ddp_allreduce" in s.collective_ops
    # Rank 1's forward sleeps 40 ms more: rank 0 waits for it at the gradient all-reduce.
    assert median(ranks[0], "collective_wait_s") > median(ranks[1], "collective_wait_s") + 0.02


def test_checkpoint_recompute_is_backward(jobs: dict[str, JobResult]) -> None:
    """Backward re-runs the checkpointed block, its 10 ms sleep included: that is backward, in
    the first steps too, where the probe's global module hooks see the block called at top
    level from inside backward."""
    ranks = check_adds_up(jobs["checkpoint"], "checkpoint")
    for steps in ranks.values():
        for s in steps:
            assert s.backward_s >= FWD_S / 2 * 0.95
            assert s.forward_s >= FWD_S * 0.95
            assert s.collective_ops is not None and "all_reduce" in s.collective_ops


def test_explicit_collectives_are_named_and_carved_out(jobs: dict[str, JobResult]) -> None:
    ranks = check_adds_up(jobs["allreduce"], "allreduce")
    for steps in ranks.values():
        for s in steps:
            assert s.collective_ops is not None
            named = {"ddp_allreduce", "all_reduce", "all_gather_object", "_broadcast_coalesced"}
            assert named <= set(s.collective_ops), s.collective_ops
    assert median(ranks[0], "collective_wait_s") > median(ranks[1], "collective_wait_s") + 0.02


def test_gather_before_forward_is_collective_not_h2d(jobs: dict[str, JobResult]) -> None:
    """Hugging Face Trainer's shape with a starved rank 1: rank 0 waits for it in the token
    count gather, between its batch's copy and its forward. That wait is collective wait."""
    ranks = check_adds_up(jobs["gather"], "gather")
    fast, starved = ranks[0], ranks[1]
    assert median(starved, "data_wait_s") > 0.04  # 4 items x 15 ms
    assert median(fast, "collective_wait_s") > 0.03
    for s in fast:
        assert s.collective_ops is not None and "all_gather_into_tensor" in s.collective_ops
        assert s.h2d_s < 0.25 * (s.collective_wait_s or 0.0)  # the CPU "copy" is no wait
    assert median(fast, "h2d_s") < 0.005
    for s in starved:
        assert s.data_cpu_s is not None and s.data_cpu_s < s.data_wait_s  # slept, not worked


@pytest.mark.parametrize("shape", ["fsdp", "fsdp1"])
def test_fsdp_is_recognised_and_its_collectives_timed(
    jobs: dict[str, JobResult], shape: str
) -> None:
    """FSDP2 ``fully_shard`` and FSDP1 ``FullyShardedDataParallel``: parallel mode ``fsdp``, the
    all-gathers and reduce-scatters named in the collective wait."""
    res = jobs[shape]
    ranks = check_adds_up(res, shape)
    assert {i.parallel_mode for i in res.infos.values()} == {"fsdp"}
    for steps in ranks.values():
        for s in steps:
            assert s.collective_ops is not None
            ops = set(s.collective_ops)
            assert any(o.startswith("all_gather") for o in ops), ops
            assert any(o.startswith("reduce_scatter") for o in ops), ops
            assert s.forward_s >= FWD_S * 0.95
    # Rank 1's forward is 40 ms slower: rank 0 waits for it in FSDP's collectives, and that
    # wait is not booked as its forward or backward.
    assert median(ranks[0], "collective_wait_s") > median(ranks[1], "collective_wait_s") + 0.02
    assert median(ranks[0], "forward_s") < median(ranks[1], "forward_s")
