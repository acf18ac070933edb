"""The rank intake on a real Unix socket: many ranks at once, lines split anywhere by the
stream, and senders that say things it does not understand."""

from __future__ import annotations

import os
import random
import shutil
import socket
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from auditor.cluster.intake import RankIntake
from auditor.probe.sink import encode, step_message
from auditor.samples import Batch, RankInfo, StepSample
from tests.helpers.waiting import wait_for
from tests.probe import short_dir


def hello(rank: int, pid: int | None = None, **extra: Any) -> bytes:
    info = RankInfo(rank=rank, world_size=16, pid=pid or 1000 + rank, host="h", **extra)
    return encode({"type": "hello", "version": 1, "info": info.to_dict()})


def steps(rank: int, first: int, n: int) -> bytes:
    rows = [
        StepSample(rank=rank, step=i, time=float(i), step_s=0.1, batch_size=8)
        for i in range(first, first + n)
    ]
    return encode(step_message(rank, rows))


class Collected:
    def __init__(self, intake: RankIntake) -> None:
        self.intake = intake
        self.infos: dict[int, RankInfo] = {}
        self.steps: list[StepSample] = []
        self.ended: set[int] = set()

    def poll(self) -> Collected:
        b: Batch = self.intake.drain()
        self.infos.update({i.rank: i for i in b.infos})
        self.steps.extend(b.steps)
        self.ended.update(b.ended)
        return self


@pytest.fixture
def path() -> Iterator[str]:
    d = short_dir()
    yield os.path.join(d, "i.sock")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def workers_seen() -> list[tuple[int, int, tuple[int, ...]]]:
    return []


@pytest.fixture
def intake(path: str, workers_seen: list[tuple[int, int, tuple[int, ...]]]) -> Iterator[RankIntake]:
    i = RankIntake(path, on_workers=lambda r, p, w: workers_seen.append((r, p, w)))
    i.start()
    yield i
    i.stop()


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def test_socket_is_private_and_removed_on_stop(path: str) -> None:
    with open(path, "w"):
        pass  # a stale file where the socket goes
    i = RankIntake(path)
    i.start()
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    i.stop()
    assert not os.path.exists(path)


def test_many_ranks_concurrently_with_lines_split_anywhere(intake: RankIntake) -> None:
    ranks, per_rank = 16, 50
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            rng = random.Random(rank)
            data = hello(rank) + b"".join(steps(rank, i, 5) for i in range(0, per_rank, 5))
            with connect(intake.path) as s:
                pos = 0
                while pos < len(data):  # chunk boundaries fall inside lines
                    n = rng.randint(1, 300)
                    s.sendall(data[pos : pos + n])
                    pos += n
                    if rng.random() < 0.1:
                        time.sleep(0.002)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    got = Collected(intake)
    wait_for(lambda: len(got.poll().ended) == ranks)
    assert set(got.infos) == set(range(ranks))
    assert all(got.infos[r].pid == 1000 + r for r in range(ranks))
    for r in range(ranks):
        assert [s.step for s in got.steps if s.rank == r] == list(range(per_rank))
    assert intake.bad_lines == 0
    assert intake.connections == ranks


def test_partial_line_waits_for_its_end(intake: RankIntake) -> None:
    got = Collected(intake)
    data = hello(3) + steps(3, 0, 2)
    with connect(intake.path) as s:
        cut = len(data) - 10
        s.sendall(data[:cut])
        wait_for(lambda: 3 in got.poll().infos)
        time.sleep(0.1)  # the intake has read the cut line by now
        assert got.poll().steps == []
        s.sendall(data[cut:])
        wait_for(lambda: len(got.poll().steps) == 2)
        for b in steps(3, 2, 1):  # one byte per send
            s.send(bytes([b]))
        wait_for(lambda: len(got.poll().steps) == 3)
    assert intake.bad_lines == 0


def test_last_line_without_newline_is_read_at_end_of_file(intake: RankIntake) -> None:
    got = Collected(intake)
    with connect(intake.path) as s:
        s.sendall(hello(1) + steps(1, 0, 1).rstrip(b"\n"))
    wait_for(lambda: 1 in got.poll().ended)
    assert [s.step for s in got.steps] == [0]
    assert intake.bad_lines == 0


def test_unknown_message_type_is_counted_as_bad(intake: RankIntake) -> None:
    got = Collected(intake)
    with connect(intake.path) as s:
        s.sendall(hello(0))
        s.sendall(encode({"type": "telemetry-v9", "x": 1}))
        s.sendall(encode({"no_type": True}))
        s.sendall(steps(0, 0, 3))
    wait_for(lambda: 0 in got.poll().ended)
    assert intake.bad_lines == 2
    assert len(got.steps) == 3


def test_malformed_fields_are_counted_and_the_connection_goes_on(intake: RankIntake) -> None:
    got = Collected(intake)
    with connect(intake.path) as s:
        s.sendall(hello(0))
        s.sendall(b'{"type":"hello","info":"not a dict"}\n')
        s.sendall(b'{"type":"hello","info":{"world_size":2}}\n')  # no rank
        s.sendall(b'{"type":"steps","rank":0}\n')  # no rows
        s.sendall(b'{"type":"steps","rank":0,"rows":[5]}\n')
        s.sendall(b'{"type":"workers","pids":["x"]}\n')
        s.sendall(b"\xff\xfe garbage\n")
        s.sendall(steps(0, 0, 1))
    wait_for(lambda: 0 in got.poll().ended)
    assert intake.bad_lines == 6
    assert len(got.steps) == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_json_that_is_not_an_object_is_counted_as_bad(intake: RankIntake) -> None:
    got = Collected(intake)
    with connect(intake.path) as s:
        s.sendall(hello(0))
        s.sendall(b"[1,2]\n42\nnull\n")
        s.sendall(steps(0, 0, 1))
    wait_for(lambda: 0 in got.poll().ended, timeout=2)
    assert intake.bad_lines == 3
    assert len(got.steps) == 1


def test_workers_are_reported_for_the_connection_rank(
    intake: RankIntake, workers_seen: list[tuple[int, int, tuple[int, ...]]]
) -> None:
    got = Collected(intake)
    with connect(intake.path) as s:
        s.sendall(encode({"type": "workers", "pids": [1]}))  # before hello: whose? ignored
        s.sendall(hello(5, pid=777))
        s.sendall(encode({"type": "workers", "pids": [801, 802]}))
        s.sendall(encode({"type": "bye"}))
    wait_for(lambda: 5 in got.poll().ended)
    assert workers_seen == [(5, 777, (801, 802))]
    assert intake.bad_lines == 0


def test_info_updates_replace_the_rank_info(intake: RankIntake) -> None:
    got = Collected(intake)
    with connect(intake.path) as s:
        s.sendall(hello(0))
        wait_for(lambda: 0 in got.poll().infos)
        info = RankInfo(rank=0, world_size=16, pid=1000, parallel_mode="ddp", unmeasured=("h2d",))
        s.sendall(encode({"type": "info", "info": info.to_dict()}))
        wait_for(lambda: got.poll().infos[0].parallel_mode == "ddp")
    assert got.infos[0].unmeasured == ("h2d",)
    assert intake.infos[0].parallel_mode == "ddp"


def test_a_rank_that_reconnects_is_not_ended(intake: RankIntake) -> None:
    old = connect(intake.path)
    old.sendall(hello(4))
    got = Collected(intake)
    wait_for(lambda: 4 in got.poll().infos)
    old.close()
    time.sleep(0.2)  # the intake sees the end, but nobody drained yet
    with connect(intake.path) as new:
        new.sendall(hello(4))
        time.sleep(0.2)
        batch = intake.drain()
        assert [i.rank for i in batch.infos] == [4]
        assert batch.ended == ()  # the hello after the end wins within one drain


def test_stop_twice_is_harmless(path: str) -> None:
    i = RankIntake(path)
    i.start()
    i.stop()
    i.stop()
    # Stopped: the socket file is gone and nothing listens there any more...
    assert not os.path.exists(path)
    with pytest.raises(OSError), connect(path):
        pass
    # ...and a new intake takes the same path and hears a rank.
    again = RankIntake(path)
    again.start()
    try:
        with connect(path) as s:
            s.sendall(hello(1))
            got = Collected(again)
            wait_for(lambda: 1 in got.poll().infos, what="rank 1's hello at the new intake")
    finally:
        again.stop()


def test_several_jobs_keep_their_ranks_apart(path: str) -> None:
    """A fleet agent's intake: rank 0 of two jobs is two ranks, each sample filed under its
    (job, rank) key, the infos keeping their real job and rank."""
    seen: list[tuple[int, int, tuple[int, ...]]] = []
    intake = RankIntake(path, on_workers=lambda r, p, w: seen.append((r, p, w)), multi_job=True)
    intake.start()
    try:
        socks = []
        for job, pid in (("train", 501), ("eval", 502)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.sendall(hello(0, pid=pid, job=job) + steps(0, 0, 3))
            s.sendall(encode({"type": "workers", "pids": [pid + 100]}))
            socks.append(s)
        got: dict[int, RankInfo] = {}
        all_steps: list[StepSample] = []

        def both() -> bool:
            b = intake.drain()
            got.update({i.slot: i for i in b.infos})
            all_steps.extend(b.steps)
            return len(got) == 2 and len(all_steps) == 6 and len(seen) == 2

        wait_for(both)
        assert sorted((i.job, i.rank, i.key) for i in got.values()) == [
            ("eval", 0, 1),
            ("train", 0, 0),
        ]
        by_key = {k: sum(1 for s in all_steps if s.rank == k) for k in got}
        assert by_key == {0: 3, 1: 3}
        assert sorted(seen) == [(0, 501, (601,)), (1, 502, (602,))]
        # A rank that reconnects keeps its key (and so its totals in the agent's state).
        socks[0].close()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(hello(0, pid=503, job="train"))
        socks.append(s)
        # The closed connection may report its own end first (pid 501); wait for the new one.
        again: list[RankInfo] = []

        def reconnected() -> bool:
            again.extend(intake.drain().infos)
            return any(i.pid == 503 for i in again)

        wait_for(reconnected)
        assert [(i.job, i.key) for i in again if i.pid == 503] == [("train", 0)]
        assert {i.key for i in again} == {0}
        for s in socks:
            s.close()
    finally:
        intake.stop()


def test_one_job_files_samples_by_rank(intake: RankIntake, path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(hello(3, job="train") + steps(3, 0, 2))
    got: list[RankInfo] = []
    wait_for(lambda: bool(got.extend(intake.drain().infos) or got))
    assert got[0].key is None and got[0].slot == 3
    s.close()


def test_rank_closing_without_goodbye_died(intake: RankIntake) -> None:
    """End of file after the probe's "bye": the rank ended; without it: the rank died."""
    clean, killed = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    for rank, s in ((0, clean), (1, killed)):
        s.connect(intake.path)
        s.sendall(hello(rank) + steps(rank, 0, 3))
    clean.sendall(encode({"type": "bye"}))
    clean.close()
    killed.close()
    got: list[Batch] = []
    wait_for(lambda: {0, 1} <= {r for b in got for r in b.ended} or got.append(intake.drain()))
    assert {r for b in got for r in b.died} == {1}
