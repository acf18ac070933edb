"""The step clock's named work outside the phases (``StepSample.outside``): exclusive with the
phases on one stack, part of the step's other time, never counted twice; an evaluation's
forwards, loader waits and batches are not the training step's; a wait inside named work is
still a wait. Fake host clock and fake device timer, exact durations."""

from __future__ import annotations

import pytest

from auditor.probe.clock import EVALUATION, StepClock

from .test_clock import make, one_batch


def close_step(sc: StepClock, c: object, t: float) -> None:
    c.at(t)  # type: ignore[attr-defined]
    sc.data_begin()


@pytest.mark.parametrize("timer", ["device", "host"])
def test_checkpoint_between_steps_is_named_and_part_of_other(timer: str) -> None:
    sc, c, dev = make(timer)
    one_batch(sc, c, 0.0)  # 10 ms data, 5 h2d, 30 fwd, 60 bwd (+5 gap), 8 opt: ends at 0.120
    c.at(0.130)
    sc.outside_begin("checkpoint")
    c.at(0.330)
    sc.outside_end()
    close_step(sc, c, 0.340)
    if dev is not None:
        dev.complete_all()
    (s,) = sc.resolve()
    assert s.outside == pytest.approx({"checkpoint": 0.200})
    assert s.step_s == pytest.approx(0.340)
    # 200 ms named within 225 ms of other time (5 ms between forward and backward, 2 ms before
    # the optimizer, 10 before the save, 10 after it).
    assert s.other_s == pytest.approx(0.227)
    assert s.optimizer_s == pytest.approx(0.008)


def test_a_save_inside_the_optimizer_step_is_checkpoint_not_optimizer() -> None:
    sc, c, dev = make("device")
    c.at(0.0)
    began = sc.data_begin()
    c.at(0.010)
    sc.data_end(began, 4)
    sc.forward_begin()
    c.at(0.040)
    sc.forward_end()
    sc.backward_begin()
    c.at(0.100)
    sc.backward_end()
    sc.optimizer_begin()
    c.at(0.110)
    sc.outside_begin("checkpoint")  # a framework's callback saves inside optimizer.step
    c.at(0.510)
    sc.outside_end()
    c.at(0.520)
    sc.optimizer_end()
    close_step(sc, c, 0.520)
    assert dev is not None
    dev.complete_all()
    (s,) = sc.resolve()
    assert s.optimizer_s == pytest.approx(0.020)  # its own work, the save carved out
    assert s.outside == pytest.approx({"checkpoint": 0.400})
    assert s.other_s == pytest.approx(0.400)


def test_evaluation_is_not_the_steps_forward_data_or_batch_but_its_waits_are_waits() -> None:
    sc, c, dev = make("device")
    one_batch(sc, c, 0.0)  # ends at 0.120, optimizer done
    c.at(0.130)
    sc.outside_begin("evaluation")  # model.eval()
    for k in range(3):  # three evaluation batches: 20 ms loading, 30 ms forward each
        t = 0.130 + 0.05 * k
        c.at(t)
        began = sc.data_begin()  # the first one closes the training step
        c.at(t + 0.020)
        sc.data_end(began, 16)
        sc.forward_begin()
        c.at(t + 0.050)
        sc.forward_end()
    sc.collective_begin("all_reduce")  # the evaluation's metric sync waits for the peers
    c.at(0.300)
    sc.collective_end()
    sc.outside_end()  # model.train()
    one_batch(sc, c, 0.310)  # the next training step: data wait from 0.310
    close_step(sc, c, 0.500)
    assert dev is not None
    dev.complete_all()
    first, second = sc.resolve()
    assert first.step_s == pytest.approx(0.130)  # closed by the evaluation loader's first ask
    assert first.outside == pytest.approx({"evaluation": 0.0})  # opened 0.130, closed at once
    assert second.outside == pytest.approx({"evaluation": 0.150})
    assert second.collective_wait_s == pytest.approx(0.020)
    assert second.collective_ops == pytest.approx({"all_reduce": 0.020})
    # The training step's own figures only: one batch of 4, its 10 ms wait, its 30 ms forward.
    assert second.data_wait_s == pytest.approx(0.010)
    assert second.forward_s == pytest.approx(0.030)
    assert second.batch_size == 4 and second.micro_batches == 1
    assert sum((second.outside or {}).values()) <= second.other_s + 1e-9


def test_nested_named_work_books_to_the_innermost_once() -> None:
    sc, c, dev = make("device")
    one_batch(sc, c, 0.0)
    c.at(0.120)
    sc.outside_begin("evaluation")
    c.at(0.150)
    sc.outside_begin("checkpoint")  # the evaluation saves its best model
    c.at(0.250)
    sc.outside_end()
    c.at(0.270)
    sc.outside_end()
    assert not sc.outside
    close_step(sc, c, 0.280)
    assert dev is not None
    dev.complete_all()
    (s,) = sc.resolve()
    assert s.outside == pytest.approx({"evaluation": 0.050, "checkpoint": 0.100})


def test_a_script_that_trains_in_eval_mode_is_not_evaluating() -> None:
    sc, c, dev = make("device")
    sc.outside_begin(EVALUATION)  # model.eval() before training: frozen batch norm
    one_batch(sc, c, 0.0)  # the first backward ends the region: this is training
    assert not sc.evaluating and sc.trains_in_eval
    one_batch(sc, c, 0.200)
    close_step(sc, c, 0.400)
    assert dev is not None
    dev.complete_all()
    first, second = sc.resolve()
    # Only the first step's batch, copy and forward (to 50 ms) went to the region that turned
    # out to be none.
    assert first.outside == pytest.approx({EVALUATION: 0.050})
    assert first.backward_s == pytest.approx(0.060) and first.optimizer_s == pytest.approx(0.008)
    assert second.outside is None
    assert second.forward_s == pytest.approx(0.030) and second.backward_s == pytest.approx(0.060)
