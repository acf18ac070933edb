"""The real hooks inside real training processes (one process each: the probe patches torch once
per process), delivering to a real intake over the real socket.

DDP runs are single-process gloo worlds (``world_size=1``): the all-reduce, the reducer and the
communication hooks are the real ones, without torchrun. The jobs of this module start together
(a module fixture) so their torch imports overlap; every test then reads one job's result.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from auditor.probe.batches import batch_size_of
from auditor.samples import StepSample

from . import TRAIN, Job, JobResult, free_port

BATCHES = 6
BATCH = 4
DDP = ["--ddp", f"--batches={BATCHES}", f"--batch={BATCH}"]
PLAIN = ["--loader", "--accum=2", f"--batches={BATCHES}", f"--batch={BATCH}", "--exit-code=3"]

SCENARIOS: dict[str, dict[str, object]] = {
    "ddp_loader": {"args": [*DDP, "--loader", "--item-sleep=0.005"]},
    "ddp_workers": {"args": [*DDP, "--loader", "--workers=2", "--item-sleep=0.005"]},
    # Training on a loader without workers, evaluating every 2 batches (the last time after the
    # last step) on one with 2 workers.
    "eval_loader": {"args": [*DDP, "--loader", "--eval-every=2", "--eval-workers=2"]},
    "hook_before": {"args": [*DDP, "--hook=before"]},
    "hook_after": {"args": [*DDP, "--hook=after"]},
    "builtin": {"args": [*DDP, "--hook=builtin"]},
    "builtin_after": {"args": [*DDP, "--hook=builtin-after", "--builtin=fp16"]},
    "plain": {"args": PLAIN},
    "no_agent": {"args": PLAIN, "with_intake": False},
    "no_probe": {"args": PLAIN, "probe": False},
    # A rank whose environment says another rank than its process group (as under mp.spawn,
    # which sets no RANK at all): the group's rank holds, also after destroy_process_group.
    "stale_rank_env": {"args": DDP, "env": {"RANK": "7", "WORLD_SIZE": "8"}},
}


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, JobResult]]:
    started: dict[str, Job] = {}
    for name, spec in SCENARIOS.items():
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        env.update(spec.get("env", {}))  # type: ignore[call-overload]
        started[name] = Job(
            [str(TRAIN), *spec["args"]],  # type: ignore[list-item]
            env=env,
            with_intake=bool(spec.get("with_intake", True)),
            probe=bool(spec.get("probe", True)),
        )
    results = {
        name: job.result(wait_rank_s=10.0 if SCENARIOS[name].get("probe", True) else 0.5)
        for name, job in started.items()
    }
    yield results


def ok(res: JobResult, code: int = 0) -> JobResult:
    assert res.returncode == code, f"rc={res.returncode}\n{res.stdout}\n{res.stderr}"
    assert res.printed("MATCH") == "True", "training diverged from the reference"
    assert "Traceback" not in res.stderr, res.stderr
    return res


def phases_fit(s: StepSample) -> None:
    """Every phase measured, and the phases (disjoint intervals of the step) fit in the step."""
    assert s.forward_s > 0 and s.backward_s > 0 and s.optimizer_s > 0, s
    assert s.data_wait_s >= 0 and s.h2d_s >= 0, s
    local = s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s
    assert local <= s.step_s + 1e-4, s


# --- DDP with a DataLoader ------------------------------------------------------------------------
def test_ddp_steps_arrive_with_every_phase(jobs: dict[str, JobResult]) -> None:
    res = ok(jobs["ddp_loader"])
    assert [s.step for s in res.steps] == list(range(BATCHES))
    for s in res.steps:
        assert s.rank == 0
        phases_fit(s)
        assert s.batch_size == BATCH
        assert s.micro_batches == 1  # no accumulation: one loader batch per step
        # 4 items at >= 5 ms each are loaded in the loop's own process
        assert s.data_wait_s >= 0.015, s
        assert s.collective_wait_s is not None and s.collective_wait_s >= 0, s
        assert s.rss_bytes is not None and s.rss_bytes > 0
    info = res.infos[0]
    assert info.parallel_mode == "ddp"
    assert info.world_size == 1 and info.pid == res.pid
    assert info.unmeasured == ()
    assert info.loader is not None
    assert info.loader.num_workers == 0 and info.loader.batch_size == BATCH
    assert info.loader.dataset == "Items" and info.loader.sampler == "SequentialSampler"
    assert res.ended == {0}
    assert res.bad_lines == 0
    # The script's own forward hook on the wrapped module still runs on every step.
    assert res.printed("FWD_CALLS") == str(BATCHES)


def test_rank_comes_from_the_process_group_until_the_last_step(
    jobs: dict[str, JobResult],
) -> None:
    res = ok(jobs["stale_rank_env"])
    # The last steps are flushed after the script's destroy_process_group(): still rank 0's.
    assert [(s.rank, s.step) for s in res.steps] == [(0, n) for n in range(BATCHES)]
    assert set(res.infos) == {0} and res.infos[0].world_size == 1
    assert res.ended == {0}


def test_ddp_loader_workers_are_declared_and_never_report(jobs: dict[str, JobResult]) -> None:
    res = ok(jobs["ddp_workers"])
    assert [s.step for s in res.steps] == list(range(BATCHES))
    for s in res.steps:
        phases_fit(s)
        assert s.batch_size == BATCH
        assert s.collective_wait_s is not None
    assert sum(s.data_wait_s for s in res.steps) > 0
    assert res.infos[0].loader is not None and res.infos[0].loader.num_workers == 2
    children = {int(p) for p in res.printed("CHILDREN").split(",")}
    assert len(children) == 2
    declared = [set(w) for r, pid, w in res.workers if r == 0 and pid == res.pid and w]
    assert children in declared, (children, res.workers)
    # Forked workers inherit the probe but stay silent: one connection, from the rank itself.
    assert res.connections == 1
    assert res.infos[0].pid == res.pid


def test_the_training_loader_is_reported_not_the_evaluation_loader(
    jobs: dict[str, JobResult],
) -> None:
    res = ok(jobs["eval_loader"])
    # The evaluation's batches fold into the steps: one step per optimizer step all the same.
    assert [s.step for s in res.steps] == list(range(BATCHES))
    # The evaluation loader was iterated last, with 2 workers: the rank still reports the loader
    # its steps trained on, and its workers (none), not the evaluation's.
    info = res.infos[0]
    assert info.loader is not None and info.loader.num_workers == 0, info.loader
    assert info.loader.sampler == "SequentialSampler" and info.loader.dataset == "Items"
    declared = [w for r, pid, w in res.workers if r == 0 and pid == res.pid]
    assert not any(declared), res.workers


# --- the script's own communication hooks -----------------------------------------------------
def test_own_comm_hook_registered_before_first_forward(jobs: dict[str, JobResult]) -> None:
    res = ok(jobs["hook_before"])
    assert res.printed("COMM_CALLS") == str(BATCHES)  # one bucket per backward
    assert len(res.steps) == BATCHES
    assert all(s.collective_wait_s is not None for s in res.steps)
    assert "collective_wait" not in res.infos[0].unmeasured
    # No DataLoader: a step closes at each optimizer step.
    for s in res.steps:
        phases_fit(s)
        assert s.batch_size is None and s.data_wait_s == 0.0


def test_own_comm_hook_registered_after_first_forward(jobs: dict[str, JobResult]) -> None:
    res = ok(jobs["hook_after"])
    # Registered after step 0: the script's hook runs for every later all-reduce.
    assert res.printed("COMM_CALLS") == str(BATCHES - 1)
    assert len(res.steps) == BATCHES
    assert all(s.collective_wait_s is not None for s in res.steps)
    assert "collective_wait" not in res.infos[0].unmeasured


def test_builtin_comm_hook_is_left_alone_and_reported_unmeasured(
    jobs: dict[str, JobResult],
) -> None:
    res = ok(jobs["builtin"])
    assert "collective_wait" in res.infos[0].unmeasured
    assert len(res.steps) == BATCHES
    assert all(s.collective_wait_s is None for s in res.steps)
    for s in res.steps:
        phases_fit(s)


def test_builtin_comm_hook_registered_after_first_forward(jobs: dict[str, JobResult]) -> None:
    # The probe's timing hook is in from the first forward; the script's FP16_COMPRESS builtin,
    # asked for after step 0, runs inside it as its Python twin.
    res = ok(jobs["builtin_after"])  # MATCH: gradients rounded to float16 from step 1 on
    assert len(res.steps) == BATCHES
    # The wait at the all-reduce is measured in every step, before and after the swap.
    assert "collective_wait" not in res.infos[0].unmeasured
    assert all(s.collective_wait_s is not None and s.collective_wait_s >= 0 for s in res.steps)
    for s in res.steps:
        phases_fit(s)


# --- no DDP, no launcher --------------------------------------------------------------------------
def test_plain_loop_with_gradient_accumulation(jobs: dict[str, JobResult]) -> None:
    res = ok(jobs["plain"], code=3)
    info = res.infos[0]
    assert info.parallel_mode == "none" and info.rank == 0 and info.world_size == 1
    assert info.unmeasured == ()
    # Two batches per optimizer step: three steps of 8 samples, two micro-batches of 4 each.
    assert [s.step for s in res.steps] == [0, 1, 2]
    for s in res.steps:
        phases_fit(s)
        assert s.batch_size == 2 * BATCH
        assert s.micro_batches == 2 and s.micro_batch_size == BATCH
        assert s.collective_wait_s is None
    assert res.printed("FWD_CALLS") == str(BATCHES)


def test_job_unchanged_without_agent(jobs: dict[str, JobResult]) -> None:
    def output(res: JobResult) -> list[str]:
        return [ln for ln in res.stdout.splitlines() if not ln.startswith("PID=")]

    bare, lonely, audited = jobs["no_probe"], jobs["no_agent"], jobs["plain"]
    ok(bare, code=3)
    ok(lonely, code=3)
    assert output(lonely) == output(bare)
    assert output(audited) == output(bare)
    assert lonely.stderr == bare.stderr == ""


# --- pure helpers ---------------------------------------------------------------------------------
def test_batch_size_of_common_batch_shapes() -> None:
    class T:
        def __init__(self, *shape: int) -> None:
            self.shape = shape

    assert batch_size_of(T(5, 3)) == 5
    assert batch_size_of((T(7, 2), T(7))) == 7
    assert batch_size_of([["text"], T(3, 1)]) == 3
    assert batch_size_of({"ids": T(9, 4), "mask": T(9, 4)}) == 9
    assert batch_size_of(T()) is None  # a scalar has no batch dimension
    assert batch_size_of("abc") is None
    assert batch_size_of([[[[[T(2)]]]]]) is None  # nesting deeper than the probe looks
