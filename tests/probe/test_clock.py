"""The step clock: hook events in, per-step phase durations out.

The host clock is a fake the test advances, and the phase timer is either the real
:class:`CpuTimer` or a fake device timer whose marks complete only when the test says the
device got there (what CUDA events do): :meth:`StepClock.resolve` must wait for them and then
report exact durations.
"""

from __future__ import annotations

import time

import pytest

from auditor.probe.clock import StepClock
from auditor.probe.timers import CpuTimer
from tests.helpers.clocks import Clock, DeviceTimer


def make(timer: str = "device", **kw: object) -> tuple[StepClock, Clock, DeviceTimer | None]:
    """``timer``: ``device`` (marks on a device's timeline), ``host`` (the same fake marks read
    as a host clock) or ``cpu`` (the real CpuTimer)."""
    clock = Clock()
    dev = DeviceTimer(clock) if timer in ("device", "host") else None
    if dev is not None and timer == "host":
        dev.device = False
    sc = StepClock(
        rank=lambda: 3,
        timer=dev if dev is not None else CpuTimer(),
        wall=lambda: 1_700_000_000.0 + clock.t,
        now=clock,
        **kw,  # type: ignore[arg-type]
    )
    return sc, clock, dev


def one_batch(
    sc: StepClock, c: Clock, t0: float, *, batch: int | None = 4, optimizer: bool = True
) -> None:
    """One loop iteration at fixed times: 10 ms data wait, 5 ms h2d, 30 ms forward, 60 ms
    backward and (with ``optimizer``) 8 ms optimizer step."""
    c.at(t0)
    began = sc.data_begin()
    c.at(t0 + 0.010)
    sc.data_end(began, batch)
    sc.h2d_begin()  # the batch's copy to the device
    c.at(t0 + 0.015)
    sc.h2d_end()
    sc.forward_begin()
    c.at(t0 + 0.045)
    sc.forward_end()
    c.at(t0 + 0.050)
    sc.backward_begin()
    c.at(t0 + 0.110)
    sc.backward_end()
    if optimizer:
        c.at(t0 + 0.112)
        sc.optimizer_begin()
        c.at(t0 + 0.120)
        sc.optimizer_end()


def test_device_marks_resolve_only_after_the_device_passed_them() -> None:
    sc, c, dev = make()
    assert dev is not None
    one_batch(sc, c, 0.0)
    c.at(0.125)
    sc.data_begin()  # the next batch is asked for: step 0 closes
    assert len(sc.pending) == 1
    last_mark = len(dev.times) - 1  # the optimizer's end mark
    dev.passed = last_mark - 1
    assert sc.resolve() == []  # the device is still inside the optimizer step
    assert len(sc.pending) == 1
    dev.passed = last_mark
    (s,) = sc.resolve(rss_bytes=1234)
    assert s.rank == 3 and s.step == 0
    assert s.time == pytest.approx(1_700_000_000.125)
    assert s.step_s == pytest.approx(0.125)
    assert s.data_wait_s == pytest.approx(0.010)
    assert s.h2d_s == pytest.approx(0.005)
    assert s.forward_s == pytest.approx(0.030)
    assert s.backward_s == pytest.approx(0.060)
    assert s.optimizer_s == pytest.approx(0.008)
    assert s.collective_wait_s is None  # no DDP hook ran: not measured, not zero
    assert s.batch_size == 4
    assert s.rss_bytes == 1234
    assert s.mem_allocated_bytes is None
    assert sc.resolve() == []


def test_resolve_returns_ready_steps_in_order_and_keeps_the_rest() -> None:
    sc, c, dev = make()
    assert dev is not None
    one_batch(sc, c, 0.0)
    # Step 0 ends at the mark the next request for a batch records (step 1's first mark).
    step0_end = len(dev.times)
    one_batch(sc, c, 0.125)
    c.at(0.250)
    sc.data_begin()
    assert len(sc.pending) == 2
    dev.passed = step0_end - 1
    assert sc.resolve() == []  # the device has not reached step 0's end yet
    dev.passed = step0_end
    assert [s.step for s in sc.resolve()] == [0]
    dev.complete_all()
    (s1,) = sc.resolve()
    assert s1.step == 1 and s1.forward_s == pytest.approx(0.030)


def test_gradient_accumulation_folds_batches_into_one_step() -> None:
    sc, c, dev = make()
    assert dev is not None
    one_batch(sc, c, 0.0, optimizer=False)
    one_batch(sc, c, 0.120, batch=6)  # second micro-batch, then the optimizer step
    c.at(0.250)
    sc.data_begin()
    dev.complete_all()
    (s,) = sc.resolve()
    assert s.step == 0
    assert s.batch_size == 10
    assert s.step_s == pytest.approx(0.250)
    assert s.data_wait_s == pytest.approx(0.020)
    assert s.h2d_s == pytest.approx(0.010)
    assert s.forward_s == pytest.approx(0.060)
    assert s.backward_s == pytest.approx(0.120)
    assert s.optimizer_s == pytest.approx(0.008)


def test_unknown_batch_size_stays_unknown() -> None:
    sc, c, dev = make()
    assert dev is not None
    one_batch(sc, c, 0.0, batch=None)
    c.at(0.2)
    sc.data_begin()
    dev.complete_all()
    (s,) = sc.resolve()
    assert s.batch_size is None


def test_loop_without_dataloader_closes_at_each_optimizer_step() -> None:
    sc, c, dev = make()
    assert dev is not None
    for t0 in (0.0, 0.1):
        c.at(t0 + 0.01)
        sc.forward_begin()
        c.at(t0 + 0.04)
        sc.forward_end()
        sc.backward_begin()
        c.at(t0 + 0.08)
        sc.backward_end()
        sc.optimizer_begin()
        c.at(t0 + 0.09)
        sc.optimizer_end()
        assert sc.steps == (1 if t0 == 0.0 else 2)
    dev.complete_all()
    s0, s1 = sc.resolve()
    assert s0.step_s == pytest.approx(0.08)  # first forward to first optimizer end
    assert s1.step_s == pytest.approx(0.10)  # optimizer end to optimizer end
    for s in (s0, s1):
        assert s.batch_size is None and s.data_wait_s == 0.0 and s.h2d_s == 0.0
        assert s.forward_s == pytest.approx(0.03)
        assert s.backward_s == pytest.approx(0.04)
        assert s.optimizer_s == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("timer", "wait"),
    # Host clock: last launch (30 ms) to the last all-reduce done (52 ms). Device: last launch
    # to backward's end (55 ms), where the stream waits for the all-reduce.
    [("host", 0.022), ("device", 0.025)],
)
def test_ddp_wait_runs_from_the_last_launch(timer: str, wait: float) -> None:
    sc, c, dev = make(timer)
    c.at(0.0)
    sc.forward_begin()
    c.at(0.010)
    sc.forward_end()
    sc.backward_begin()
    c.at(0.020)
    sc.bucket_launched()
    c.at(0.030)
    sc.bucket_launched()  # the last bucket ready on this rank
    c.at(0.035)
    sc.bucket_done()
    c.at(0.052)
    sc.bucket_done()  # the last all-reduce finishes: 22 ms after the last launch
    c.at(0.055)
    sc.backward_end()
    sc.optimizer_begin()
    c.at(0.060)
    sc.optimizer_end()
    # the next step has no DDP bucket: its wait is not measured
    c.at(0.070)
    sc.forward_begin()
    sc.forward_end()
    sc.backward_begin()
    sc.backward_end()
    sc.optimizer_begin()
    c.at(0.080)
    sc.optimizer_end()
    assert dev is not None
    dev.complete_all()
    s0, s1 = sc.resolve()
    assert s0.collective_wait_s == pytest.approx(wait)
    assert s0.collective_ops == pytest.approx({"ddp_allreduce": wait})
    assert s0.backward_s == pytest.approx(0.045 - wait)  # exclusive: the wait is carved out
    assert s0.compute_s == pytest.approx(0.010 + 0.045 - wait + 0.005)
    assert s1.collective_wait_s is None


def test_only_the_last_bucket_marks_the_device() -> None:
    """DDP says which bucket is a backward's last (``GradBucket.is_last()``): the buckets known
    not to be record no device mark, and the wait read is the one every bucket marking gives."""
    waits, marks = [], []
    for known in (False, True):
        sc, c, dev = make("device")
        assert dev is not None
        c.at(0.0)
        sc.forward_begin()
        c.at(0.010)
        sc.forward_end()
        sc.backward_begin()
        for t in (0.020, 0.025, 0.030):
            c.at(t)
            sc.bucket_launched(1024, last=t == 0.030 or not known)
        c.at(0.052)
        sc.bucket_done()
        c.at(0.055)
        sc.backward_end()
        sc.optimizer_begin()
        c.at(0.060)
        sc.optimizer_end()
        sc.data_begin()
        marks.append(len(dev.times))
        dev.complete_all()
        (s,) = sc.resolve()
        waits.append((s.collective_ops, s.collective_bytes, s.backward_s))
    assert waits[0] == waits[1]
    assert waits[1][0] == {"ddp_allreduce": pytest.approx(0.025)}  # last launch to backward's end
    assert waits[1][1] == {"ddp_allreduce": 3 * 1024}  # every bucket's bytes all the same
    assert marks[0] - marks[1] == 2  # the two earlier buckets' marks


def test_durations_are_sent_to_the_nanosecond() -> None:
    """A duration keeps the host clock's resolution (1 ns) and no more: its JSON is short."""
    sc, c, dev = make("host")
    one_batch(sc, c, 0.1234567891234)
    c.at(0.1234567891234 + 0.1300000004321)
    sc.data_begin()
    assert dev is not None
    dev.complete_all()
    (s,) = sc.resolve()
    for name in ("step_s", "data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s"):
        v = getattr(s, name)
        assert v == round(v, 9), name
        assert len(repr(v)) <= 12, (name, v)
    assert s.step_s == 0.13
    assert s.forward_s == 0.03


def test_host_ahead_of_the_device_books_each_instant_once() -> None:
    """The host asks for the next batch while the device still runs the step it launched. Host
    time: 20 ms data wait, launches h2d, forward, backward and optimizer, 1 ms more. Device: the
    step's work takes 13 ms (h2d 1, forward 4, backward 6, optimizer 2), run ahead of the host.
    On the device's timeline the step is 21 ms (the host's pace), its data wait the 8 ms the
    device sat idle (not the host's 20 ms, 12 of which the queued work covered), and everything
    adds up to the step."""
    sc, c, dev = make()
    assert dev is not None
    host, device = 0.0, 0.0
    for _ in range(4):
        c.at(host)
        dev.at = max(device, host)  # the device reaches the mark once its queue is done
        began = sc.data_begin()
        c.at(host + 0.020)
        dev.at = device = max(device, host + 0.020)
        sc.data_end(began, 8)
        for begin, end, cost in (
            (sc.h2d_begin, sc.h2d_end, 0.001),
            (sc.forward_begin, sc.forward_end, 0.004),
            (sc.backward_begin, sc.backward_end, 0.006),
            (sc.optimizer_begin, sc.optimizer_end, 0.002),
        ):
            begin()
            device = max(device, c.t) + cost  # queued behind what the device still runs
            dev.at = device
            end()
        host += 0.021
    c.at(host)
    dev.at = max(device, host)
    sc.data_begin()
    dev.complete_all()
    steps = sc.resolve()
    assert len(steps) == 4
    for s in steps[1:]:  # the first step had nothing queued: its whole wait was idle
        assert s.step_s == pytest.approx(0.021)
        assert s.data_wait_s == pytest.approx(0.021 - 0.013)
        assert (s.h2d_s, s.forward_s, s.backward_s, s.optimizer_s) == pytest.approx(
            (0.001, 0.004, 0.006, 0.002)
        )
        booked = s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s
        assert booked == pytest.approx(s.step_s)


def test_bounded_pending_queue_counts_drops() -> None:
    sc, c, dev = make(max_pending=3)
    assert dev is not None
    for i in range(5):
        c.at(i * 0.1)
        sc.forward_begin()
        sc.forward_end()
        sc.optimizer_begin()
        c.at(i * 0.1 + 0.05)
        sc.optimizer_end()
    assert sc.steps == 5
    assert sc.dropped == 2
    assert len(sc.pending) == 3
    dev.complete_all()
    assert [s.step for s in sc.resolve()] == [2, 3, 4]  # the oldest were dropped


def test_flush_open_closes_only_a_finished_step() -> None:
    sc, c, dev = make()
    assert dev is not None
    one_batch(sc, c, 0.0, optimizer=False)
    sc.flush_open()
    assert sc.steps == 0  # no optimizer step yet: nothing to close
    c.at(0.2)
    sc.optimizer_begin()
    c.at(0.21)
    sc.optimizer_end()
    assert sc.steps == 0  # a DataLoader loop closes at the next batch ...
    c.at(0.3)
    sc.flush_open()  # ... or at exit
    dev.complete_all()
    (s,) = sc.resolve()
    assert s.step_s == pytest.approx(0.3)
    assert s.optimizer_s == pytest.approx(0.01)


def test_memory_reader_is_sampled_at_close() -> None:
    readings = iter([(10, 20, 30), (11, 21, 31)])
    sc, c, dev = make(memory=lambda: next(readings))
    assert dev is not None
    for t0 in (0.0, 0.2):
        one_batch(sc, c, t0)
    c.at(0.4)
    sc.data_begin()
    dev.complete_all()
    s0, s1 = sc.resolve()
    assert (s0.mem_allocated_bytes, s0.mem_reserved_bytes, s0.mem_peak_bytes) == (10, 20, 30)
    assert (s1.mem_allocated_bytes, s1.mem_reserved_bytes, s1.mem_peak_bytes) == (11, 21, 31)


def test_cpu_timer_measures_real_phases() -> None:
    sc = StepClock(rank=lambda: 0, timer=CpuTimer())
    began = sc.data_begin()
    time.sleep(0.01)
    sc.data_end(began, 2)
    sc.forward_begin()
    time.sleep(0.02)
    sc.forward_end()
    sc.backward_begin()
    time.sleep(0.01)
    sc.backward_end()
    sc.optimizer_begin()
    sc.optimizer_end()
    sc.data_begin()
    (s,) = sc.resolve()
    assert s.data_wait_s >= 0.01
    assert s.forward_s >= 0.02
    assert s.backward_s >= 0.01
    assert s.optimizer_s >= 0.0
    assert s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s <= s.step_s
    timer = CpuTimer()
    a = timer.mark()
    assert timer.ready(a)
    assert timer.elapsed(a, a - 1.0) == 0.0  # never negative


def test_workers_started_at_an_epoch_are_booked_on_the_step_that_pays() -> None:
    sc, c, dev = make("host")
    assert dev is not None
    sc.loader_started(0.3)  # the run's first iterator, before any step: its start-up
    one_batch(sc, c, 0.0)
    c.at(0.125)
    began = sc.data_begin()  # the epoch's end (StopIteration): step 0 closes
    c.at(0.126)
    sc.loader_stopping()  # its workers shut down: 1 ms
    sc.data_end(began, None)
    c.at(0.226)
    sc.loader_started(0.1)  # the next epoch's iterator started its workers: 0.1 s
    one_batch(sc, c, 0.226)  # its first batch: 10 ms, spent on their start
    c.at(0.4)
    sc.data_begin()
    one_batch(sc, c, 0.4)
    c.at(0.6)
    sc.data_begin()
    dev.complete_all()
    first, started, after = sc.resolve()
    assert first.loader_start_s is None and after.loader_start_s is None
    assert started.loader_start_s == pytest.approx(0.001 + 0.1 + 0.010)
    assert started.data_wait_s == pytest.approx(0.001 + 0.010)  # the start's creation: no phase
    assert started.other_s >= 0.1
