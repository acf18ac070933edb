"""Exclusive phases: the step clock on recorded event sequences, one per nesting shape.

Each test replays the hook events a real loop or framework produces (at fixed fake times) and
checks the exact time booked to each phase, and that the phases never overlap: with
``other`` (time in no phase) they add up to the step. Every sequence runs with both kinds of
timer: host marks (the CPU path) and device marks that complete only when the test says so (the
CUDA-event path, where a nested phase splits the enclosing one into pieces).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from auditor.probe.clock import DATA_CPU_EVERY, StepClock
from auditor.probe.timers import CpuTimer
from auditor.samples import StepSample
from auditor.telemetry.recorded import SCHEMA, read_recording, write_recording
from tests.helpers.clocks import Clock, DeviceTimer

MS = 1e-3


class Replay:
    """Drives a :class:`StepClock` through events at given milliseconds."""

    def __init__(self, timer: str) -> None:
        self.c = Clock()
        self.dev = DeviceTimer(self.c) if timer == "device" else None
        self.host = HostTimer(self.c)
        self.sc = StepClock(
            rank=lambda: 0,
            timer=self.dev if self.dev is not None else self.host,
            wall=lambda: self.c.t,
            now=self.c,
        )
        self._began = 0.0

    def at(self, ms: float, event: str, *args: object) -> Replay:
        self.c.at(ms * MS)
        if event == "data_begin":
            self._began = self.sc.data_begin()
        elif event == "data_end":
            self.sc.data_end(self._began, *args)  # type: ignore[arg-type]
        else:
            getattr(self.sc, event)(*args)
        return self

    def steps(self) -> list[StepSample]:
        if self.dev is not None:
            self.dev.complete_all()
        return self.sc.resolve()


class HostTimer(CpuTimer):
    """The real CPU timer's arithmetic on the test's fake host clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def mark(self) -> float:
        return self.clock.t


TIMERS = pytest.mark.parametrize("timer", ["host", "device"])


def phases_ms(s: StepSample) -> dict[str, float]:
    return {
        "data_wait": round(s.data_wait_s / MS, 6),
        "h2d": round(s.h2d_s / MS, 6),
        "forward": round(s.forward_s / MS, 6),
        "backward": round(s.backward_s / MS, 6),
        "optimizer": round(s.optimizer_s / MS, 6),
        "collective_wait": round((s.collective_wait_s or 0.0) / MS, 6),
        "other": round(s.other_s / MS, 6),
    }


def assert_adds_up(s: StepSample) -> None:
    booked = s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0)
    assert booked <= s.step_s + 1e-12, "phases overlap: they add up to more than the step"
    assert booked + s.other_s == pytest.approx(s.step_s)
    if s.collective_ops is not None:
        assert sum(s.collective_ops.values()) == pytest.approx(s.collective_wait_s)


def ops_ms(s: StepSample) -> dict[str, float]:
    assert s.collective_ops is not None
    return {k: round(v / MS, 6) for k, v in s.collective_ops.items()}


def next_step(r: Replay, ms: float) -> None:
    """The loop asks for the next batch: the step closes."""
    r.at(ms, "data_begin")


def tail_ms(timer: str, done: int, backward_end: int) -> int:
    """On a device's timeline the DDP wait runs to backward's end, where the stream waits for
    the all-reduce; on the host's, to the last all-reduce's completion."""
    return backward_end - done if timer == "device" else 0


@TIMERS
def test_closure_inside_optimizer_step(timer: str) -> None:
    """Lightning: forward and backward run in ``optimizer.step(closure)``; the DDP bucket wait
    is inside backward. The optimizer keeps only its own update."""
    r = Replay(timer)
    r.at(0, "data_begin").at(10, "data_end", 8)
    r.at(12, "optimizer_begin")  # 2 ms of loop bookkeeping before it: other
    r.at(13, "forward_begin").at(43, "forward_end")
    r.at(44, "backward_begin")  # 1 ms of closure Python between: optimizer (it is open)
    r.at(80, "bucket_launched").at(100, "bucket_done")
    r.at(104, "backward_end")
    r.at(112, "optimizer_end")
    next_step(r, 115)
    (s,) = r.steps()
    wait = 20 + tail_ms(timer, 100, 104)
    assert phases_ms(s) == {
        "data_wait": 10,
        "h2d": 0,
        "forward": 30,
        "backward": 60 - wait,
        "optimizer": 1 + 1 + 8,  # around the forward, between forward and backward, the update
        "collective_wait": wait,
        "other": 2 + 3,
    }
    assert ops_ms(s) == {"ddp_allreduce": wait}
    assert s.step_s == pytest.approx(115 * MS)
    assert_adds_up(s)


@TIMERS
def test_no_sync_accumulation(timer: str) -> None:
    """Two micro-batches under ``no_sync()`` then one synced: one step, the wait once."""
    r = Replay(timer)
    for k, t0 in enumerate((0, 100, 200)):
        r.at(t0, "data_begin").at(t0 + 5, "data_end", 4)
        r.at(t0 + 6, "h2d_begin").at(t0 + 8, "h2d_end")
        r.at(t0 + 10, "forward_begin").at(t0 + 40, "forward_end")
        r.at(t0 + 41, "backward_begin")
        if k == 2:
            r.at(t0 + 90, "bucket_launched").at(t0 + 95, "bucket_done")
        r.at(t0 + 95, "backward_end")
    r.at(296, "optimizer_begin").at(299, "optimizer_end")
    next_step(r, 300)
    (s,) = r.steps()
    assert s.batch_size == 12
    assert s.micro_batches == 3  # the step's DataLoader batches
    assert phases_ms(s) == {
        "data_wait": 15,
        "h2d": 6,
        "forward": 90,
        "backward": 3 * 54 - 5,
        "optimizer": 3,
        "collective_wait": 5,
        "other": 3 * (1 + 2 + 1) + 2 * 5 + 1 + 1,  # gaps; 5 ms after each early backward
    }
    assert_adds_up(s)


@TIMERS
def test_several_forwards_per_step(timer: str) -> None:
    """A loop that calls the model twice (two views of the batch) before one backward."""
    r = Replay(timer)
    r.at(0, "data_begin").at(4, "data_end", 4)
    r.at(5, "forward_begin").at(25, "forward_end")
    r.at(26, "forward_begin").at(46, "forward_end")
    r.at(50, "backward_begin").at(90, "backward_end")
    r.at(90, "optimizer_begin").at(95, "optimizer_end")
    next_step(r, 96)
    (s,) = r.steps()
    assert phases_ms(s) == {
        "data_wait": 4,
        "h2d": 0,
        "forward": 40,
        "backward": 40,
        "optimizer": 5,
        "collective_wait": 0,
        "other": 1 + 1 + 4 + 1,
    }
    assert s.collective_wait_s is None  # no collective seen: not measured, not zero
    assert_adds_up(s)


@TIMERS
def test_checkpoint_recompute_stays_backward(timer: str) -> None:
    """``torch.utils.checkpoint``: backward re-runs a forward; that is backward's cost."""
    r = Replay(timer)
    r.at(0, "data_begin").at(2, "data_end", 4)
    r.at(3, "forward_begin").at(23, "forward_end")
    r.at(24, "backward_begin")
    r.at(30, "forward_begin").at(45, "forward_end")  # recompute of a checkpointed segment
    r.at(50, "forward_begin").at(60, "forward_end")
    r.at(80, "backward_end")
    r.at(81, "optimizer_begin").at(84, "optimizer_end")
    next_step(r, 85)
    (s,) = r.steps()
    assert phases_ms(s) == {
        "data_wait": 2,
        "h2d": 0,
        "forward": 20,
        "backward": 56,
        "optimizer": 3,
        "collective_wait": 0,
        "other": 1 + 1 + 1 + 1,
    }
    assert_adds_up(s)


@TIMERS
def test_collective_before_the_forward_is_not_h2d(timer: str) -> None:
    """Hugging Face Trainer: the batch is copied, then a token count is gathered across ranks
    (the fast rank waits there for a starved peer), then the forward runs."""
    r = Replay(timer)
    r.at(0, "data_begin").at(3, "data_end", 8)
    r.at(4, "h2d_begin").at(4.5, "h2d_end")
    r.at(5, "collective_begin", "all_gather_into_tensor").at(105, "collective_end")
    r.at(107, "forward_begin").at(137, "forward_end")
    r.at(138, "backward_begin").at(198, "backward_end")
    r.at(200, "optimizer_begin").at(205, "optimizer_end")
    next_step(r, 206)
    (s,) = r.steps()
    assert phases_ms(s) == {
        "data_wait": 3,
        "h2d": 0.5,
        "forward": 30,
        "backward": 60,
        "optimizer": 5,
        "collective_wait": 100,
        "other": 1 + 0.5 + 2 + 1 + 2 + 1,
    }
    assert ops_ms(s) == {"all_gather_into_tensor": 100}
    assert_adds_up(s)


@TIMERS
def test_collective_inside_forward_and_backward(timer: str) -> None:
    """FSDP-like: an all-gather waited on inside forward (an async launch is not timed, its
    ``Work.wait`` is), a synchronous reduce-scatter inside backward."""
    r = Replay(timer)
    r.at(0, "data_begin").at(2, "data_end", 4)
    r.at(2, "forward_begin")
    r.at(5, "collective_begin", "all_gather_single").at(12, "collective_end")
    r.at(20, "collective_begin", "all_gather_single").at(21, "collective_end")
    r.at(40, "forward_end")
    r.at(40, "backward_begin")
    r.at(70, "collective_begin", "reduce_scatter_single").at(85, "collective_end")
    r.at(95, "backward_end")
    r.at(95, "optimizer_begin").at(99, "optimizer_end")
    next_step(r, 100)
    (s,) = r.steps()
    assert phases_ms(s) == {
        "data_wait": 2,
        "h2d": 0,
        "forward": 38 - 8,
        "backward": 55 - 15,
        "optimizer": 4,
        "collective_wait": 23,
        "other": 1,
    }
    assert ops_ms(s) == {"all_gather_single": 8, "reduce_scatter_single": 15}
    assert_adds_up(s)


@TIMERS
def test_ddp_bucket_wait_and_an_explicit_loss_all_reduce(timer: str) -> None:
    """DDP's gradient all-reduce wait inside backward, then the script all-reduces its loss."""
    r = Replay(timer)
    r.at(0, "data_begin").at(1, "data_end", 4)
    r.at(2, "forward_begin").at(12, "forward_end")
    r.at(13, "backward_begin")
    r.at(20, "bucket_launched").at(30, "bucket_launched")
    r.at(33, "bucket_done").at(45, "bucket_done")
    r.at(46, "backward_end")
    r.at(47, "collective_begin", "all_reduce").at(57, "collective_end")
    r.at(58, "optimizer_begin").at(60, "optimizer_end")
    next_step(r, 60)
    (s,) = r.steps()
    ddp = 15 + tail_ms(timer, 45, 46)
    assert phases_ms(s) == {
        "data_wait": 1,
        "h2d": 0,
        "forward": 10,
        "backward": 33 - ddp,
        "optimizer": 2,
        "collective_wait": ddp + 10,
        "other": 1 + 1 + 1 + 1,
    }
    assert ops_ms(s) == {"ddp_allreduce": ddp, "all_reduce": 10}
    assert_adds_up(s)


@TIMERS
def test_batch_fetched_inside_the_closure(timer: str) -> None:
    """A ``dataloader_iter`` training step asks for its batch inside ``optimizer.step``: the
    wait splits the optimizer phase and is data wait, never optimizer."""
    r = Replay(timer)
    r.at(0, "optimizer_begin")
    r.at(1, "data_begin").at(31, "data_end", 4)
    r.at(32, "forward_begin").at(42, "forward_end")
    r.at(42, "backward_begin").at(62, "backward_end")
    r.at(66, "optimizer_end")
    r.at(66, "optimizer_begin")
    r.at(67, "data_begin").at(97, "data_end", 4)  # closes step 0 (its optimizer step ended)
    r.at(98, "forward_begin").at(108, "forward_end")
    r.at(108, "backward_begin").at(128, "backward_end")
    r.at(132, "optimizer_end")
    r.sc.flush_open()
    s0, s1 = r.steps()
    assert phases_ms(s0) == {
        "data_wait": 30,
        "h2d": 0,
        "forward": 10,
        "backward": 20,
        "optimizer": 1 + 1 + 4 + 1,  # the next closure began before the batch was asked for
        "collective_wait": 0,
        "other": 0,
    }
    # Step 1 began inside the optimizer phase its batch was asked for in: split at the boundary.
    assert phases_ms(s1) == {
        "data_wait": 30,
        "h2d": 0,
        "forward": 10,
        "backward": 20,
        "optimizer": 1 + 4,
        "collective_wait": 0,
        "other": 0,
    }
    assert s0.step_s + s1.step_s == pytest.approx(132 * MS)
    for s in (s0, s1):
        assert_adds_up(s)


@TIMERS
def test_collective_inside_the_loader_is_data_wait_once(timer: str) -> None:
    r = Replay(timer)
    r.at(0, "data_begin")
    r.at(2, "collective_begin", "broadcast").at(9, "collective_end")
    r.at(10, "data_end", 4)
    r.at(10, "forward_begin").at(20, "forward_end")
    r.at(20, "backward_begin").at(30, "backward_end")
    r.at(30, "optimizer_begin").at(31, "optimizer_end")
    next_step(r, 31)
    (s,) = r.steps()
    assert phases_ms(s)["data_wait"] == 10
    assert phases_ms(s)["collective_wait"] == 0
    assert_adds_up(s)


@TIMERS
def test_inner_optimizer_does_not_end_the_step(timer: str) -> None:
    """A wrapping optimizer steps an inner one: one optimizer phase, the step ends once."""
    r = Replay(timer)
    r.at(0, "forward_begin").at(10, "forward_end")
    r.at(10, "backward_begin").at(20, "backward_end")
    r.at(20, "optimizer_begin").at(21, "optimizer_begin").at(25, "optimizer_end")
    assert r.sc.steps == 0
    r.at(26, "optimizer_end")
    assert r.sc.steps == 1  # no DataLoader: the step closes at the (outer) optimizer's end
    (s,) = r.steps()
    assert phases_ms(s)["optimizer"] == 6
    assert_adds_up(s)


@TIMERS
def test_a_forward_left_open_does_not_swallow_the_next_phases(timer: str) -> None:
    """An end event that never came (an exception in forward): the next end of an enclosing
    phase closes what was left open inside it."""
    r = Replay(timer)
    r.at(0, "optimizer_begin")
    r.at(1, "forward_begin")  # raised: no forward_end
    r.at(5, "optimizer_end")
    r.at(6, "forward_begin").at(10, "forward_end")
    r.at(10, "optimizer_begin").at(12, "optimizer_end")
    s0, s1 = r.steps()
    assert phases_ms(s0)["forward"] == 4 and phases_ms(s0)["optimizer"] == 1
    assert phases_ms(s1)["forward"] == 4 and phases_ms(s1)["optimizer"] == 2
    for s in (s0, s1):
        assert_adds_up(s)


def test_device_marks_of_a_split_phase_wait_for_the_device() -> None:
    """A nested phase splits the enclosing one: the step resolves only once the device passed
    every piece's marks, and then exactly."""
    r = Replay("device")
    assert r.dev is not None
    r.at(0, "forward_begin")
    r.at(5, "collective_begin", "all_reduce").at(9, "collective_end")
    r.at(20, "forward_end")
    r.at(20, "optimizer_begin").at(22, "optimizer_end")
    r.dev.passed = 1  # the device is inside the collective
    assert r.sc.resolve() == []
    r.dev.complete_all()
    (s,) = r.sc.resolve()
    assert phases_ms(s)["forward"] == 16 and ops_ms(s) == {"all_reduce": 4}


def test_unmeasured_gradient_wait_is_not_reported_partial() -> None:
    r = Replay("host")
    r.sc.collective_unmeasured = True
    r.at(0, "forward_begin").at(10, "forward_end")
    r.at(10, "collective_begin", "all_reduce").at(15, "collective_end")
    r.at(15, "optimizer_begin").at(16, "optimizer_end")
    (s,) = r.steps()
    assert s.collective_wait_s is None and s.collective_ops is None
    assert phases_ms(s)["other"] == 5  # the wait is in no phase: other, not forward
    assert_adds_up(s)


def test_micro_batches_count_the_step_loader_batches() -> None:
    """Hugging Face's Trainer fetches a step's micro-batches up front, then runs them; the end
    of an epoch (a fetch that yields nothing) is no micro-batch; no loader: one."""
    r = Replay("host")
    for t in (0, 2, 4, 6):
        r.at(t, "data_begin").at(t + 1, "data_end", 8)
    r.at(8, "data_begin").at(9, "data_end", None)  # StopIteration
    for t in (10, 20, 30, 40):
        r.at(t, "forward_begin").at(t + 4, "forward_end")
        r.at(t + 4, "backward_begin").at(t + 9, "backward_end")
    r.at(50, "optimizer_begin").at(51, "optimizer_end")
    next_step(r, 52)
    r.at(53, "data_end", 8)
    r.at(54, "optimizer_begin").at(55, "optimizer_end")
    next_step(r, 56)
    first, second = r.steps()
    assert (first.batch_size, first.micro_batches, first.micro_batch_size) == (32, 4, 8)
    assert (second.batch_size, second.micro_batches) == (8, 1)
    bare = Replay("host")
    bare.at(0, "forward_begin").at(1, "forward_end").at(2, "optimizer_begin")
    bare.at(3, "optimizer_end")
    (s,) = bare.steps()
    assert (s.batch_size, s.micro_batches) == (None, 1)


def test_data_cpu_is_summed_per_step_and_unknown_without_a_loader() -> None:
    r = Replay("host")
    r.at(0, "data_begin").at(10, "data_end", 4, 0.004)
    r.at(10, "data_begin").at(20, "data_end", 4, 0.001)
    r.at(20, "optimizer_begin").at(21, "optimizer_end")
    next_step(r, 22)
    r.at(22, "forward_begin").at(23, "forward_end")
    (s,) = r.steps()
    assert s.data_cpu_s == pytest.approx(0.005)
    r2 = Replay("host")
    r2.at(0, "optimizer_begin").at(1, "optimizer_end")
    (s2,) = r2.steps()
    assert s2.data_cpu_s is None


def test_the_loader_cpu_is_read_after_a_wait_and_on_every_sixteenth_step() -> None:
    """``cpu_due`` (the data hook reads the loader's CPU time where it says so): after a step
    that waited a millisecond or more for data, and after every DATA_CPU_EVERY-th step."""
    r = Replay("host")
    due = []
    t = 0.0
    for step in range(2 * DATA_CPU_EVERY + 2):
        wait = 2.0 if step == 5 else 0.1  # milliseconds
        r.at(t, "data_begin")  # closes the step before
        due.append(r.sc.cpu_due)
        r.at(t + wait, "data_end", 4, None)
        r.at(t + wait, "optimizer_begin").at(t + wait + 1, "optimizer_end")
        t += wait + 2
    expected = [True] + [s == 5 or s % DATA_CPU_EVERY == 0 for s in range(len(due) - 1)]
    assert due == expected


# --- older data: backward_s included the wait ----------------------------------------------------
def test_rows_of_an_older_probe_take_the_wait_out_of_backward() -> None:
    s = StepSample(
        rank=0, step=0, time=0.0, step_s=0.2, forward_s=0.05, backward_s=0.12,
        collective_wait_s=0.07, data_cpu_s=0.001, collective_ops={"ddp_allreduce": 0.07},
    )  # fmt: skip
    row = s.to_row()
    assert StepSample.from_row(row) == s  # today's row: as it is
    old = StepSample.from_row(row[: row.index(0.001)])  # an older probe's row ends before
    assert old.backward_s == pytest.approx(0.05)
    assert old.collective_wait_s == pytest.approx(0.07)
    assert old.compute_s == pytest.approx(0.10)


def test_v1_recordings_read_with_the_wait_out_of_backward(tmp_path: Path) -> None:
    step = {"rank": 0, "step": 0, "time": 1.0, "step_s": 0.2, "forward_s": 0.05,
            "backward_s": 0.12, "collective_wait_s": 0.07}  # fmt: skip
    v1 = tmp_path / "v1.jsonl"
    v1.write_text(
        json.dumps({"schema": "auditor.recording/v1", "job": "j"})
        + "\n"
        + json.dumps({"t": "step", **step})
        + "\n"
    )
    (s,) = read_recording(v1).batch.steps
    assert s.backward_s == pytest.approx(0.05)
    v2 = tmp_path / "v2.jsonl"
    write_recording(v2, [read_recording(v1).batch])
    assert json.loads(v2.read_text().splitlines()[0])["schema"] == SCHEMA
    (again,) = read_recording(v2).batch.steps
    assert again.backward_s == pytest.approx(0.05)  # v2 is read as written
