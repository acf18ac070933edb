"""The rank sink: hands a rank's samples to its node's agent, off the training thread.

Transport: newline-delimited JSON over a Unix domain stream socket whose path the launcher chose
before anything started (``AUDITOR_SINK``). Why this and not Ray or UDP:

* no Ray inside a training process (DESIGN.md); ranks only need the standard library;
* node-local by construction, so nothing listens on the network and there is no port to race
  for: the path is fixed before the agent binds it, which lets the job start while Ray starts;
* a stream is ordered and lossless while connected, and its end-of-file tells the agent that
  the rank ended, including when it crashed;
* a daemon thread flushes four times a second (``FLUSH_S``); if the agent is not there yet (or
  gone) rows wait in a bounded buffer and the training loop never blocks or fails.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from auditor.samples import FlopCount, MemoryBudget, StepSample

PROTOCOL_VERSION = 1
_WIRE_FIELDS = StepSample.wire_fields()


def encode(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def step_message(rank: int, steps: list[StepSample]) -> dict[str, Any]:
    return {"type": "steps", "rank": rank, "rows": [s.to_row() for s in steps]}


def memory_message(budget: MemoryBudget) -> dict[str, Any]:
    """A rank's memory budget (``auditor.probe.memory``): sent when it changes, rarely."""
    return {"type": "memory", "rank": budget.rank, "budget": budget.to_dict()}


def flops_message(count: FlopCount) -> dict[str, Any]:
    """A rank's FLOPs per step (``auditor.probe.flops``): counted on a sampled step, rarely."""
    return {"type": "flops", "rank": count.rank, "count": count.to_dict()}


# Seconds between flushes. A step reaches the live verdict (judged every 0.5 s) up to this late:
# a fault's evidence waits for it. Each flush costs a wake-up and a send; the steps themselves
# cost the same however they are grouped.
FLUSH_S = 0.25


class Sink:
    """Periodic flusher: pulls resolved samples from ``collect`` and writes them to the socket.

    ``collect`` returns the messages to send (already JSON-ready dicts); ``hello`` returns the
    rank's identity message, sent first on every (re)connection.
    """

    def __init__(
        self,
        path: str,
        collect: Callable[[], list[dict[str, Any]]],
        hello: Callable[[], dict[str, Any]],
        *,
        interval_s: float = FLUSH_S,
        max_buffered: int = 20_000,
        connect_timeout_s: float = 1.0,
    ) -> None:
        self.path = path
        self._collect = collect
        self._hello = hello
        self._interval = interval_s
        self._buffer: deque[bytes] = deque(maxlen=max_buffered)
        # Bytes taken from the buffer and not yet written; kept across flushes so a slow agent
        # never gets a line twice or half a line.
        self._out = b""
        self._out_messages = 0
        self._mid_line = False
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connect_timeout = connect_timeout_s
        self._next_connect = 0.0
        self.sent_messages = 0

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="auditor-probe-sink", daemon=True
            )
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # the probe must never take the training job down
                pass

    def flush(self) -> None:
        with self._lock:
            for msg in self._collect():
                self._buffer.append(encode(msg))
            if not self._buffer and not self._out:
                return
            if self._sock is None and not self._connect():
                return
            assert self._sock is not None
            if not self._out:
                self._out = b"".join(self._buffer)
                self._out_messages = len(self._buffer)
                self._buffer.clear()
            try:
                while self._out:
                    sent = self._sock.send(self._out)
                    self._mid_line = self._out[sent - 1 : sent] != b"\n"
                    self._out = self._out[sent:]
                self.sent_messages += self._out_messages
                self._out_messages = 0
            except TimeoutError:
                pass  # the agent is slow: keep the connection and the rest for the next flush
            except OSError:
                self._drop_connection()

    def _connect(self) -> bool:
        now = time.monotonic()
        if now < self._next_connect or not os.path.exists(self.path):
            return False
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self._connect_timeout)
        try:
            s.connect(self.path)
            s.sendall(encode(self._hello()))
        except OSError:
            s.close()
            self._next_connect = now + 1.0
            return False
        self._sock = s
        return True

    def _drop_connection(self) -> None:
        if self._mid_line:
            # Part of a line went out on the old connection: the agent discards that fragment,
            # so the rest of it must not start the new connection. Whole lines are resent once.
            cut = self._out.find(b"\n")
            self._out = self._out[cut + 1 :] if cut >= 0 else b""
        self._mid_line = False
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._next_connect = time.monotonic() + 1.0

    def close(self, timeout_s: float = 2.0, *, linger: bool = False) -> None:
        """Final flush, then close. Returns as soon as everything is written; waits up to
        ``timeout_s`` only while the agent is not there yet or not reading (a job shorter than
        Ray's start-up must not lose its samples).

        ``linger`` (the probe at exit): after the goodbye the connection's descriptor is left
        open, owned by no Python object, so the kernel closes it when the process really ends;
        the agent's end-of-file then marks the process's end, after the interpreter's own
        teardown (seconds, for a job whose process group threads linger), which no exit handler
        sees."""
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._next_connect = 0.0
                self.flush()
            except Exception:
                pass
            with self._lock:
                done = not self._buffer and not self._out
            if done or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        with self._lock:
            # Never after half a line: the agent would read the fragment and "bye" as one line.
            if self._sock is not None and not self._out:
                try:
                    self._sock.sendall(encode({"type": "bye"}))
                    if linger:
                        self._sock.detach()  # non-inheritable: no child process keeps it
                        self._sock = None
                except OSError:
                    pass
            self._drop_connection()

    def abandon(self) -> None:
        """In a forked child: forget the parent's socket and thread."""
        self._stop.set()
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                # Closing the child's copy of the descriptor leaves the parent's connection open,
                # and lets the agent see end-of-file as soon as the rank itself ends.
                sock.close()
            except OSError:
                pass
        self._buffer.clear()
        self._out = b""
        self._thread = None
        self._lock = threading.Lock()
