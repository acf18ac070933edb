"""The account of each rank's whole run (``auditor.analysis.accounting``): every second booked
once, the parts add up to the wall time, waits never booked as work, the whole run's steps (not
only the window's), and the loss the verdict leads with."""

from __future__ import annotations

import pytest

from auditor.analysis.accounting import Account, RunTotals, account, largest_loss, losses
from auditor.analysis.snapshot import SampleStore
from auditor.samples import Batch, DeviceSample, GpuProcess, RankInfo, StepSample

T0 = 1_700_000_000.0


def steps(
    rank: int,
    n: int,
    *,
    start: float,
    step_s: float = 0.1,
    wait_s: float = 0.0,
    data_s: float = 0.01,
    save_every: int = 0,
    save_s: float = 0.0,
) -> list[StepSample]:
    """``n`` back-to-back steps (each starts where the last ended, as the probe's host clock
    books them): 10 ms data, 20 fwd, 40 bwd, 5 opt, ``wait_s`` at the all-reduce, and every
    ``save_every``-th step a checkpoint of ``save_s`` in its other time."""
    out, t = [], start
    for i in range(n):
        save = save_s if save_every and (i + 1) % save_every == 0 else 0.0
        total = step_s + wait_s + save
        t += total
        out.append(
            StepSample(
                rank=rank,
                step=i,
                time=t,
                step_s=total,
                data_wait_s=data_s,
                forward_s=0.02,
                backward_s=0.04,
                optimizer_s=0.005,
                collective_wait_s=wait_s,
                outside={"checkpoint": save} if save else None,
            )
        )
    return out


def info(rank: int, started: float | None, ended: float | None) -> RankInfo:
    return RankInfo(rank=rank, world_size=2, started_at=started, ended_at=ended)


def totals(samples: list[StepSample]) -> RunTotals:
    t = RunTotals()
    for s in samples:
        t.add(s)
    return t


def test_every_second_once_the_parts_add_up_to_the_wall_time() -> None:
    ss = steps(0, 50, start=T0 + 3.0, wait_s=0.03, save_every=10, save_s=0.5)
    a = account(0, totals(ss), started_at=T0, ended_at=ss[-1].time + 0.4)
    assert a is not None
    assert a.wall_s == pytest.approx(3.0 + 50 * 0.13 + 5 * 0.5 + 0.4)
    assert a.booked_s == pytest.approx(a.wall_s, rel=0.02)
    assert all(v >= 0 for v in a.parts().values())
    assert a.startup_s == pytest.approx(3.0)
    assert a.teardown_s == pytest.approx(0.4)
    assert a.outside == pytest.approx({"checkpoint": 2.5})
    assert a.gaps_s == pytest.approx(0.0, abs=1e-4)  # wall-clock floats near 1.7e9
    # 100 ms steps: 75 ms of phases, 25 ms other, of which nothing named but the saves.
    assert a.other_s == pytest.approx(50 * 0.025)
    assert a.steps == 50


def test_a_wait_is_booked_as_a_wait_never_as_work() -> None:
    ss = steps(1, 20, start=T0 + 1.0, wait_s=0.5)
    a = account(1, totals(ss), started_at=T0, ended_at=ss[-1].time)
    assert a is not None
    assert a.collective_wait_s == pytest.approx(10.0)
    assert a.forward_s + a.backward_s + a.optimizer_s == pytest.approx(20 * 0.065)
    assert a.booked_s == pytest.approx(a.wall_s, rel=0.02)


def test_named_work_is_never_more_than_the_steps_other_time() -> None:
    # A sample claiming more named work than its step leaves (bad input): capped, not added.
    bad = StepSample(
        rank=0, step=0, time=T0 + 1.0, step_s=1.0, forward_s=0.9, outside={"checkpoint": 0.5}
    )
    a = account(0, totals([bad]), started_at=T0, ended_at=T0 + 1.0)
    assert a is not None
    assert a.outside["checkpoint"] == pytest.approx(0.1)
    assert a.other_s == pytest.approx(0.0)
    assert a.booked_s == pytest.approx(a.wall_s)


def test_gaps_between_reported_steps_are_booked_apart() -> None:
    ss = steps(0, 4, start=T0)
    # The third step reported 2 s after the second ended (steps lost on the way, say).
    ss[2:] = [StepSample(**{**s.__dict__, "time": s.time + 2.0}) for s in ss[2:]]
    a = account(0, totals(ss), started_at=T0, ended_at=ss[-1].time)
    assert a is not None
    assert a.gaps_s == pytest.approx(2.0)
    assert a.booked_s == pytest.approx(a.wall_s)


def test_unknown_ends_book_no_start_up_or_teardown() -> None:
    ss = steps(0, 10, start=T0 + 5)
    a = account(0, totals(ss))
    assert a is not None
    assert (a.startup_s, a.teardown_s, a.started, a.ended) == (0.0, 0.0, False, False)
    assert a.wall_s == pytest.approx(1.0)
    assert account(0, None) is None
    never = account(0, RunTotals(), started_at=T0, ended_at=T0 + 4.0)
    assert never is not None and never.startup_s == pytest.approx(4.0) and never.steps == 0


def test_the_store_keeps_the_whole_runs_account_beyond_its_window() -> None:
    store = SampleStore("job", max_steps_per_rank=100)
    ss = steps(0, 1_000, start=T0 + 2.0, save_every=100, save_s=1.0)
    store.add(Batch(infos=(info(0, T0, None),)))
    for k in range(0, 1_000, 50):
        store.add(Batch(steps=tuple(ss[k : k + 50])))
    store.add(Batch(infos=(info(0, T0, ss[-1].time + 1.0),)))
    snap = store.snapshot(ss[-1].time, window_s=5.0)
    a = snap.accounts[0]
    assert len(snap.ranks[0].steps) < 100  # the window and the kept steps are a fraction
    assert a.steps == 1_000
    assert a.outside == pytest.approx({"checkpoint": 10.0})
    assert a.wall_s == pytest.approx(2.0 + 100.0 + 10.0 + 1.0)
    assert a.booked_s == pytest.approx(a.wall_s, rel=0.02)


def two_ranks(save_s: float) -> dict[int, Account]:
    """Rank 0 saves a checkpoint every 10 steps; rank 1 waits for it at the all-reduce."""
    r0 = steps(0, 100, start=T0 + 2.0, save_every=10, save_s=save_s)
    r1 = [
        StepSample(**{**s.__dict__, "rank": 1, "outside": None, "collective_wait_s": save})
        for s, save in zip(r0, [(s.outside or {}).get("checkpoint", 0.0) for s in r0], strict=True)
    ]
    out = {}
    for rank, ss in ((0, r0), (1, r1)):
        a = account(rank, totals(ss), started_at=T0, ended_at=ss[-1].time + 0.2)
        assert a is not None
        out[rank] = a
    return out


def test_the_largest_loss_is_the_work_peers_waited_for_not_their_wait() -> None:
    accounts = two_ranks(save_s=1.0)
    assert accounts[1].collective_wait_s == pytest.approx(10.0)
    loss = largest_loss(accounts)
    assert loss is not None
    assert (loss.kind, loss.rank, loss.waiting) == ("checkpoint", 0, (1,))
    assert loss.seconds == pytest.approx(10.0)
    assert loss.share == pytest.approx(10.0 / accounts[0].wall_s)
    # The wait itself is listed, as rank 1's, and blames nobody.
    waits = [x for x in losses(accounts) if x.kind == "collective_wait"]
    assert [(x.rank, x.waiting) for x in waits] == [(1, ())]


def test_start_up_leads_when_it_is_the_largest_loss() -> None:
    accounts = two_ranks(save_s=0.01)
    loss = largest_loss(accounts)
    assert loss is not None and (loss.kind, loss.rank) == ("startup", 0)
    assert loss.seconds == pytest.approx(2.0)
    # Both ranks took as long to start: the job's loss, no one rank's, nobody waited for it.
    assert (loss.alike, loss.waiting) == ((1,), ())


def test_the_account_reads_back_from_its_json_and_survives_bad_values() -> None:
    a = two_ranks(save_s=1.0)[0].rounded()
    assert Account.from_dict(0, a.to_dict()) == a
    b = Account.from_dict(3, {"wall_s": "ten", "outside": {"checkpoint": "x", "evaluation": 2}})
    assert b.wall_s == 0.0 and dict(b.outside) == {"evaluation": 2.0} and b.rank == 3


def _gpu(t: float, procs: dict[int, int], *, used: int = 2 << 30) -> DeviceSample:
    return DeviceSample(
        node="h",
        index=0,
        uuid="GPU-0",
        time=t,
        gpu_util=0.0,
        mem_used_bytes=used,
        processes=tuple(GpuProcess(pid, b) for pid, b in procs.items()),
    )


def test_gpu_memory_held_while_starting_up_and_ending_is_booked_there() -> None:
    # Rank 0 (PID 100) starts at T0, steps from T0 + 10 s for 5 s and ends 2 s later. NVML
    # reads once a second: before CUDA starts nothing of it (the driver's 500 MiB in use), then
    # its context and model (1 GiB), 3 GiB while training, 3 GiB until it ends.
    store = SampleStore("gpu")
    info = RankInfo(
        rank=0,
        world_size=1,
        host="h",
        pid=100,
        device="cuda:0",
        device_uuids=("GPU-0",),
        started_at=T0,
        ended_at=T0 + 17.0,
    )
    store.add(Batch(infos=(info,), steps=tuple(steps(0, 50, start=T0 + 10.0))))
    gpu = [_gpu(T0 + k, {}, used=500 << 20) for k in range(4)]
    gpu += [_gpu(T0 + k, {100: 1 << 30}) for k in range(4, 10)]
    gpu += [_gpu(T0 + k + 0.5, {100: 3 << 30}) for k in range(10, 17)]
    store.add(Batch(devices=tuple(gpu)))
    a = store.snapshot(T0 + 20, None).accounts[0]
    assert a.startup_s == pytest.approx(10.0)
    assert a.startup_gpu_bytes == 1 << 30
    assert a.teardown_gpu_bytes == 3 << 30
    # Read back from the report as written; an account without a GPU writes neither figure.
    assert Account.from_dict(0, a.to_dict()) == a
    plain = account(0, RunTotals(), started_at=T0, ended_at=T0 + 1)
    assert plain is not None and "startup_gpu_bytes" not in plain.to_dict()


def test_gpu_memory_outside_the_steps_is_not_booked_where_unmeasured() -> None:
    # Another process on the GPU (PID 7), none of the rank's in its start-up; no process end
    # reported: no teardown booked, so none noted.
    store = SampleStore("gpu")
    info = RankInfo(
        rank=0,
        world_size=1,
        host="h",
        pid=100,
        device="cuda:0",
        device_uuids=("GPU-0",),
        started_at=T0,
    )
    store.add(Batch(infos=(info,), steps=tuple(steps(0, 50, start=T0 + 10.0))))
    store.add(Batch(devices=tuple(_gpu(T0 + k, {7: 1 << 30}) for k in range(20))))
    a = store.snapshot(T0 + 20, None).accounts[0]
    assert (a.startup_gpu_bytes, a.teardown_gpu_bytes) == (None, None)
