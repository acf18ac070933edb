"""The DeepSpeed engine's steps as phases (``auditor.probe.patches.deepspeed``).

``updates_now`` is table-tested on stand-in engines. The real engine (DeepSpeed on CPU, gloo, a
world of one: ``scripts/deepspeed_steps.py``) runs under the probe: a step is one optimizer
update, however many micro-batches it accumulates (``engine.step()`` after every micro-batch
updates only at the boundary), its forward is the engine's, its backward and optimizer phases
are measured, its collectives named, and the phases add up to at most the step.
"""

from __future__ import annotations

import statistics

import pytest

from auditor.probe.patches.deepspeed import PARALLEL_MODE, updates_now

from . import SCRIPTS, Job, JobResult, free_port

SCRIPT = SCRIPTS / "deepspeed_steps.py"
FWD_S = 0.02  # the script's forward sleep
UPDATES = 12


class _Engine:
    def __init__(self, boundary: bool, managed: bool | None = True, broken: bool = False):
        self._boundary, self._managed, self._broken = boundary, managed, broken
        if managed is not None:
            self.managed_gradient_accumulation = lambda: self._managed

    def is_gradient_accumulation_boundary(self) -> bool:
        if self._broken:
            raise RuntimeError("no engine state")
        return self._boundary


@pytest.mark.parametrize(
    ("engine", "updates"),
    [
        (_Engine(boundary=True), True),
        (_Engine(boundary=False), False),
        # The script owns the boundary: every step() updates.
        (_Engine(boundary=False, managed=False), True),
        # An older DeepSpeed without managed_gradient_accumulation.
        (_Engine(boundary=False, managed=None), False),
        (_Engine(boundary=True, managed=None), True),
        # An engine that cannot say: a step per call, as without accumulation.
        (_Engine(boundary=False, broken=True), True),
    ],
)
def test_updates_now(engine: _Engine, updates: bool) -> None:
    assert updates_now(engine) is updates


def _run(*args: str) -> JobResult:
    pytest.importorskip("deepspeed")
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "DS_ACCELERATOR": "cpu",
        "AUDITOR_EXIT_WAIT_S": "10",
    }
    res = Job([str(SCRIPT), "--updates", str(UPDATES), *args], env=env).result(timeout=240)
    assert res.returncode == 0, f"{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


@pytest.fixture(scope="module")
def accumulated() -> JobResult:
    """ZeRO 1, four micro-batches of 4 per optimizer step."""
    return _run("--zero", "1", "--accum", "4")


def test_a_step_is_one_update_of_the_model(accumulated: JobResult) -> None:
    res = accumulated
    assert res.printed("UPDATES") == str(UPDATES)
    assert res.printed("MICRO") == str(4 * UPDATES)
    steps = res.steps
    # One step per optimizer update (the last may close at exit), each of 4 micro-batches.
    assert UPDATES - 1 <= len(steps) <= UPDATES, len(steps)
    assert all(s.micro_batches == 4 and s.batch_size == 16 for s in steps), [
        (s.micro_batches, s.batch_size) for s in steps
    ]
    assert res.infos[0].parallel_mode == PARALLEL_MODE
    assert res.infos[0].unmeasured == ()


def test_the_engine_phases_add_up(accumulated: JobResult) -> None:
    steady = accumulated.steps[2:]
    for s in steady:
        # The engine's forward (the model's sleep, four times) is forward; its backward and its
        # update are measured, once each per step for the update.
        assert s.forward_s >= 4 * FWD_S * 0.95, s
        assert s.backward_s > 0 and s.optimizer_s > 0, s
        assert s.collective_wait_s is not None and s.collective_ops, s
        parts = s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s
        parts += s.collective_wait_s
        assert parts <= s.step_s * 1.001 + 1e-4, s
    # Little of the step is in no phase: the engine's bookkeeping is inside its calls.
    other = statistics.median(
        s.step_s
        - (s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s)
        - (s.collective_wait_s or 0.0)
        for s in steady
    )
    step = statistics.median(s.step_s for s in steady)
    assert other <= 0.25 * step, (other, step)


def test_zero_2_steps_are_updates_with_named_collectives() -> None:
    res = _run("--zero", "2")
    assert UPDATES - 1 <= len(res.steps) <= UPDATES
    ops: set[str] = set()
    for s in res.steps[2:]:
        assert s.micro_batches == 1 and s.backward_s > 0 and s.optimizer_s > 0, s
        ops.update(s.collective_ops or {})
    # ZeRO's collectives go through torch.distributed, named as they are called (a world of one
    # gathers no partitions: the two-rank jobs in tests/e2e/test_deepspeed.py do).
    assert "all_reduce" in ops, ops
