"""The job's terminal output, relayed through a pty so the live panel can stay pinned below it.

On a terminal the auditor draws its panel under the job's output, so the job must not write to
the terminal itself: its stdout and stderr both go to the slave side of one pseudo-terminal
(one, so their order is the order the job wrote them, as on a terminal). The job still sees a
terminal (``isatty`` is true, Python line-buffers, progress bars draw) of the real terminal's
size. A thread reads the master side and hands over

* complete lines, as a terminal shows them (what follows the last carriage return), and
* the current unfinished line (a progress bar redrawn with ``\\r``), which the panel shows on
  its first line until the line ends.

The pty is not the job's controlling terminal (the job runs in its own session, as without a
relay): Ctrl-C on the real terminal reaches the auditor, which forwards it to the job's group.
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import os
import select
import struct
import termios
import threading
import time
from collections.abc import Callable, Sequence

# A line longer than this without a newline is handed over as a line (memory stays bounded).
MAX_PARTIAL = 64 * 1024
READ_SIZE = 64 * 1024
# Once the job has exited: stop after this long without new output (descendants that still hold
# the pty open, e.g. DataLoader workers being torn down, must not hold up the verdict).
QUIET_S = 0.3
CLOSE_WITHIN_S = 3.0


def visible(segment: str) -> str:
    """What a terminal shows of a line written with carriage returns: the last non-empty part."""
    if "\r" not in segment:
        return segment
    return next((p for p in reversed(segment.split("\r")) if p), "")


class PtyRelay:
    """A pty for the job's stdout and stderr, and the thread that reads it.

    ``on_lines`` gets each batch of complete lines (without newlines); ``on_partial`` the
    current unfinished line ("" once it ended). Both are called from the relay's thread.
    """

    def __init__(
        self,
        on_lines: Callable[[Sequence[str]], None],
        on_partial: Callable[[str], None],
        *,
        size: tuple[int, int] | None = None,
    ) -> None:
        self._on_lines = on_lines
        self._on_partial = on_partial
        self.master, slave = os.openpty()
        self._slave: int | None = slave
        attrs = termios.tcgetattr(slave)
        # "\n" stays "\n" (no "\r\n" translation): lines arrive as the job wrote them.
        attrs[1] &= ~termios.ONLCR
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        if size is not None:
            self.resize(*size)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="auditor-relay", daemon=True)
        self._thread.start()

    @property
    def child_fd(self) -> int | None:
        """The slave side, for the job's stdout and stderr (None once the job has it)."""
        return self._slave

    def child_started(self) -> None:
        """The job holds the slave now: close ours, so the master reads EOF when the job ends."""
        if self._slave is not None:
            os.close(self._slave)
            self._slave = None

    def resize(self, columns: int, rows: int) -> None:
        """Give the job's terminal the real terminal's size (progress bars read it)."""
        fd = self._slave if self._slave is not None else self.master
        with contextlib.suppress(OSError):
            fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

    def close(self, timeout_s: float = CLOSE_WITHIN_S + 2) -> None:
        """After the job ended: relay what is left, hand over the unfinished line, stop."""
        self.child_started()
        self._closing.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            with contextlib.suppress(OSError):
                os.close(self.master)

    def _run(self) -> None:
        deadline: float | None = None
        try:
            while True:
                ready, _, _ = select.select([self.master], [], [], QUIET_S)
                if self._closing.is_set():
                    # A descendant that outlives the job and keeps writing must not hold up
                    # the verdict: what it writes after the deadline is not relayed.
                    deadline = deadline or time.monotonic() + CLOSE_WITHIN_S
                    if not ready or time.monotonic() > deadline:
                        break
                if not ready:
                    continue
                try:
                    data = os.read(self.master, READ_SIZE)
                except OSError:  # EIO: every slave descriptor is closed
                    break
                if not data:
                    break
                self._feed(self._decoder.decode(data))
        finally:
            self._feed(self._decoder.decode(b"", final=True))
            if self._partial:
                tail = visible(self._partial)
                self._partial = ""
                if tail:
                    self._on_lines([tail])
                self._on_partial("")

    def _feed(self, text: str) -> None:
        if not text:
            return
        *complete, rest = (self._partial + text).split("\n")
        if len(rest) > MAX_PARTIAL:
            complete.append(rest)
            rest = ""
        elif "\r" in rest:
            # Keep only what the terminal still shows: a bar redrawn forever stays small.
            rest = "\r" + visible(rest)
        before = self._partial
        self._partial = rest
        if complete:
            self._on_lines([visible(line) for line in complete])
        if rest != before or complete:
            self._on_partial(visible(rest))
