"""Rank intake: the node-side end of the probe's socket (see ``auditor/probe/sink.py``).

One thread multiplexes every rank connection with ``selectors``; each complete line is parsed
into samples and queued for :meth:`RankIntake.drain`. A closed connection marks its rank ended.
Malformed lines are counted and skipped: one bad sender must not cost the others their data.

One job (``auditor run``): samples are keyed by rank. Several jobs (a fleet node agent on the
probe's default socket, ``multi_job=True``): rank numbers repeat across jobs, so each ``(job,
rank)`` gets its own key, and every sample from that connection is rewritten to it; the
:class:`RankInfo` keeps the real job and rank, which is what the exporter labels with.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from auditor.samples import Batch, FlopCount, MemoryBudget, RankInfo, StepSample

log = logging.getLogger(__name__)


@dataclass
class _Conn:
    buf: bytes = b""
    rank: int | None = None  # the key its samples are filed under (the rank, or a job's key)
    pid: int | None = None
    bye: bool = False  # the probe said goodbye: its rank ends normally


@dataclass
class IntakeDelta:
    infos: dict[int, RankInfo] = field(default_factory=dict)
    steps: list[StepSample] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)
    died: set[int] = field(default_factory=set)
    memory: list[MemoryBudget] = field(default_factory=list)
    flops: list[FlopCount] = field(default_factory=list)


class RankIntake:
    """Listens on a Unix socket path and collects what the ranks send."""

    def __init__(
        self,
        path: str,
        *,
        on_workers: Callable[[int, int, tuple[int, ...]], None] | None = None,
        multi_job: bool = False,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.multi_job = multi_job
        self._keys: dict[tuple[str, int], int] = {}
        self._on_workers = on_workers
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._delta = IntakeDelta()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: socket.socket | None = None
        self._wall = wall
        self.infos: dict[int, RankInfo] = {}
        self.bad_lines = 0
        self.connections = 0

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)  # a stale socket from a dead agent
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.path)
        os.chmod(self.path, 0o600)  # only the job's user may send samples
        server.listen(128)
        server.setblocking(False)
        self._server = server
        self._sel.register(server, selectors.EVENT_READ, data=None)
        self._thread = threading.Thread(target=self._run, name="auditor-intake", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._stop.is_set():
            return  # already stopped: stopping twice is harmless
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for key in list(self._sel.get_map().values()):
            try:
                key.fileobj.close()  # type: ignore[union-attr]
            except OSError:
                pass
        self._sel.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def drain(self) -> Batch:
        """Everything received since the last drain."""
        with self._lock:
            d, self._delta = self._delta, IntakeDelta()
        return Batch(
            infos=tuple(d.infos.values()),
            steps=tuple(d.steps),
            ended=tuple(sorted(d.ended)),
            memory=tuple(d.memory),
            died=tuple(sorted(d.died)),
            flops=tuple(d.flops),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.2):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key)

    def _accept(self) -> None:
        assert self._server is not None
        try:
            conn, _ = self._server.accept()
        except OSError:
            return
        conn.setblocking(False)
        self.connections += 1
        self._sel.register(conn, selectors.EVENT_READ, data=_Conn())

    def _read(self, key: selectors.SelectorKey) -> None:
        sock: socket.socket = key.fileobj  # type: ignore[assignment]
        state: _Conn = key.data
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._sel.unregister(sock)
            sock.close()
            if state.buf.strip():
                self._line(state, state.buf)
            if state.rank is not None:
                self._ended_at(state.rank)
                with self._lock:
                    self._delta.ended.add(state.rank)
                    if not state.bye:
                        # End of file without the probe's goodbye: the rank was killed or
                        # crashed past Python's exit handlers (SIGKILL, OOM killer, abort).
                        self._delta.died.add(state.rank)
            return
        state.buf += chunk
        *lines, state.buf = state.buf.split(b"\n")
        for line in lines:
            if line.strip():
                self._line(state, line)

    def _ended_at(self, key: int) -> None:
        """The rank's process ended now (its socket closed): the end of its account, later than
        the probe's goodbye by what the interpreter's exit took after it."""
        info = self.infos.get(key)
        if info is None:
            return
        info = dataclasses.replace(info, ended_at=self._wall())
        self.infos[key] = info
        with self._lock:
            self._delta.infos[key] = info

    def _key(self, info: RankInfo) -> int:
        """The key a rank's samples are filed under: its rank, or with several jobs one key per
        ``(job, rank)`` (a rank that reconnects keeps its key, and so its totals)."""
        if not self.multi_job:
            return info.rank
        return self._keys.setdefault((info.job, info.rank), len(self._keys))

    def _line(self, state: _Conn, line: bytes) -> None:
        try:
            msg = json.loads(line)
            if not isinstance(msg, dict):
                raise ValueError(f"expected a JSON object, got {type(msg).__name__}")
            kind = msg.get("type")
            if kind in ("hello", "info"):
                info = RankInfo.from_dict(msg["info"])
                key = self._key(info)
                if self.multi_job:
                    info = dataclasses.replace(info, key=key)
                state.rank, state.pid = key, info.pid
                self.infos[key] = info
                with self._lock:
                    self._delta.infos[key] = info
                    self._delta.ended.discard(key)
                    self._delta.died.discard(key)
            elif kind == "steps":
                steps = [StepSample.from_row(row) for row in msg["rows"]]
                if self.multi_job and state.rank is not None:
                    steps = [dataclasses.replace(s, rank=state.rank) for s in steps]
                with self._lock:
                    self._delta.steps.extend(steps)
            elif kind == "memory":
                budget = MemoryBudget.from_dict(msg["budget"])
                if self.multi_job and state.rank is not None:
                    budget = dataclasses.replace(budget, rank=state.rank)
                with self._lock:
                    self._delta.memory.append(budget)
            elif kind == "flops":
                count = FlopCount.from_dict(msg["count"])
                if self.multi_job and state.rank is not None:
                    count = dataclasses.replace(count, rank=state.rank)
                with self._lock:
                    self._delta.flops.append(count)
            elif kind == "workers":
                if self._on_workers and state.rank is not None and state.pid is not None:
                    self._on_workers(state.rank, state.pid, tuple(int(p) for p in msg["pids"]))
            elif kind == "bye":
                state.bye = True
            else:
                raise ValueError(f"unknown message type {kind!r}")
        except (ValueError, KeyError, TypeError) as exc:
            self.bad_lines += 1
            if self.bad_lines <= 3:
                log.warning("auditor intake: skipped a malformed line: %s", exc)
