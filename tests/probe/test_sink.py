"""The rank sink against a real intake on a real Unix socket: buffering while the agent is away,
hello on every (re)connection, a complete final flush, and the intake's resilience."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from auditor.cluster.intake import RankIntake
from auditor.probe.sink import Sink, encode, step_message
from auditor.samples import Batch, RankInfo, StepSample
from tests.helpers.waiting import wait_for

RANK = 2


def step(i: int, rank: int = RANK) -> StepSample:
    return StepSample(rank=rank, step=i, time=1000.0 + i, step_s=0.1, forward_s=0.03)


def hello_msg(rank: int = RANK, pid: int = 4242) -> dict[str, Any]:
    return {
        "type": "hello",
        "version": 1,
        "info": RankInfo(rank=rank, world_size=4, pid=pid, host="h").to_dict(),
    }


class Outbox:
    """What the probe would hand the sink: messages queued by the test, taken on each flush."""

    def __init__(self) -> None:
        self.msgs: list[dict[str, Any]] = []
        self.hellos = 0
        self.lock = threading.Lock()

    def put(self, *steps: StepSample) -> None:
        with self.lock:
            self.msgs.append(step_message(RANK, list(steps)))

    def collect(self) -> list[dict[str, Any]]:
        with self.lock:
            out, self.msgs = self.msgs, []
        return out

    def hello(self) -> dict[str, Any]:
        self.hellos += 1
        return hello_msg()


class Received:
    """Everything drained from an intake so far."""

    def __init__(self, intake: RankIntake) -> None:
        self.intake = intake
        self.batches: list[Batch] = []

    def poll(self) -> Received:
        self.batches.append(self.intake.drain())
        return self

    @property
    def steps(self) -> list[int]:
        return [s.step for b in self.batches for s in b.steps]

    @property
    def infos(self) -> list[RankInfo]:
        return [i for b in self.batches for i in b.infos]

    @property
    def ended(self) -> set[int]:
        return {r for b in self.batches for r in b.ended}


@pytest.fixture
def intakes() -> Iterator[list[RankIntake]]:
    started: list[RankIntake] = []
    yield started
    for i in started:
        i.stop()


def start_intake(path: str, intakes: list[RankIntake]) -> RankIntake:
    intake = RankIntake(path)
    intake.start()
    intakes.append(intake)
    return intake


def test_buffers_while_agent_absent_and_delivers_when_it_appears(
    path: str, intakes: list[RankIntake]
) -> None:
    box = Outbox()
    sink = Sink(path, box.collect, box.hello, interval_s=0.05)
    box.put(step(0), step(1))
    sink.flush()  # no agent yet: nothing listens, nothing fails
    box.put(step(2))
    sink.flush()
    assert sink.sent_messages == 0 and box.hellos == 0
    got = Received(start_intake(path, intakes))
    sink.start()
    wait_for(lambda: got.poll().steps == [0, 1, 2])
    assert [i.rank for i in got.infos] == [RANK]  # the hello came first
    assert box.hellos == 1
    sink.close()
    wait_for(lambda: RANK in got.poll().ended)


def test_stale_socket_file_is_not_an_error(path: str) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)  # the file of a dead agent: it exists, nobody accepts
    s.close()
    box = Outbox()
    sink = Sink(path, box.collect, box.hello, interval_s=0.05)
    box.put(step(0))
    sink.flush()
    sink.flush()
    assert sink.sent_messages == 0
    sink.close(timeout_s=0.2)


def test_hello_again_after_the_agent_restarts(path: str, intakes: list[RankIntake]) -> None:
    box = Outbox()
    sink = Sink(path, box.collect, box.hello, interval_s=0.05)
    first = Received(start_intake(path, intakes))
    sink.start()
    box.put(step(0))
    wait_for(lambda: first.poll().steps == [0])
    first.intake.stop()  # the agent goes away (its socket file with it)
    intakes.remove(first.intake)
    box.put(step(1))
    time.sleep(0.3)  # the sink notices while the agent is away
    box.put(step(2))
    second = Received(start_intake(path, intakes))
    wait_for(lambda: 2 in second.poll().steps, timeout=8)
    assert [i.rank for i in second.infos][:1] == [RANK]  # introduced itself again
    assert box.hellos == 2
    sink.close()


def test_close_sends_everything_then_ends_the_rank(path: str, intakes: list[RankIntake]) -> None:
    got = Received(start_intake(path, intakes))
    box = Outbox()
    sink = Sink(path, box.collect, box.hello, interval_s=60)  # only close() flushes
    for i in range(300):
        box.put(step(2 * i), step(2 * i + 1))
    sink.close()
    wait_for(lambda: RANK in got.poll().ended)
    assert got.steps == list(range(600))
    assert got.intake.bad_lines == 0


def test_close_waits_briefly_for_an_agent_still_starting(
    path: str, intakes: list[RankIntake]
) -> None:
    box = Outbox()
    sink = Sink(path, box.collect, box.hello, interval_s=60)
    box.put(step(0))
    late: list[RankIntake] = []
    timer = threading.Timer(0.3, lambda: late.append(start_intake(path, intakes)))
    timer.start()
    sink.close(timeout_s=3.0)
    timer.join()
    got = Received(late[0])
    wait_for(lambda: RANK in got.poll().ended)
    assert got.steps == [0]


def test_buffer_is_bounded_and_keeps_the_newest(path: str, intakes: list[RankIntake]) -> None:
    box = Outbox()
    sink = Sink(path, box.collect, box.hello, interval_s=60, max_buffered=5)
    for i in range(10):
        box.put(step(i))
        sink.flush()
    got = Received(start_intake(path, intakes))
    sink.close()
    wait_for(lambda: RANK in got.poll().ended)
    assert got.steps == [5, 6, 7, 8, 9]


def test_malformed_line_is_skipped_and_counted(path: str, intakes: list[RankIntake]) -> None:
    got = Received(start_intake(path, intakes))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(encode(hello_msg()))
        s.sendall(encode(step_message(RANK, [step(0)])))
        s.sendall(b"this is not json\n")
        s.sendall(b'{"type":"steps","rank":2,"rows":[[1,2,3]]}\n')  # a row of the wrong length
        s.sendall(encode(step_message(RANK, [step(1), step(2)])))
    wait_for(lambda: RANK in got.poll().ended)
    assert got.steps == [0, 1, 2]
    assert got.intake.bad_lines == 2


def test_closing_connection_marks_the_rank_ended(path: str, intakes: list[RankIntake]) -> None:
    got = Received(start_intake(path, intakes))
    a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    b = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    anonymous = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (a, b, anonymous):
        s.connect(path)
    a.sendall(encode(hello_msg(rank=0, pid=10)))
    b.sendall(encode(hello_msg(rank=1, pid=11)))
    wait_for(lambda: {i.rank for i in got.poll().infos} == {0, 1})
    anonymous.close()  # never said who it is: ends no rank
    a.close()
    wait_for(lambda: got.poll().ended == {0})
    time.sleep(0.1)
    assert got.poll().ended == {0}
    b.close()
    wait_for(lambda: got.poll().ended == {0, 1})


def test_stalled_agent_gets_every_step_exactly_once(path: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    received: list[bytes] = []
    readers: list[threading.Thread] = []

    def read(conn: socket.socket, stall_s: float) -> None:
        time.sleep(stall_s)  # an agent that stops reading for a while (busy, swapped out)
        chunks = []
        with conn:
            while chunk := conn.recv(1 << 16):
                chunks.append(chunk)
        received.append(b"".join(chunks))

    def accept() -> None:
        for stall in (1.5, 0.0):
            conn, _ = server.accept()
            t = threading.Thread(target=read, args=(conn, stall))
            t.start()
            readers.append(t)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    box = Outbox()
    for i in range(20_000):  # ~1.3 MB: more than the socket buffer holds
        box.put(step(i))
    sink = Sink(path, box.collect, box.hello, interval_s=60)
    sink.close(timeout_s=8)
    acceptor.join(timeout=5)
    for t in readers:
        t.join(timeout=5)
    server.close()
    delivered: list[int] = []
    for data in received:
        for line in data.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # a line cut by the dropped connection
            if msg.get("type") == "steps":
                delivered += [row[1] for row in msg["rows"]]
    assert sorted(delivered) == list(range(20_000))
