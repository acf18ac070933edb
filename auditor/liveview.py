"""The live view of one ``auditor run``: a panel on a terminal, a status line elsewhere.

* On a terminal (stdout and stderr both ttys): one ``rich`` live panel, redrawn in place and
  pinned under the job's own output. The job writes to a pty (:mod:`auditor.cluster.relay`);
  its lines are printed above the panel in the order it wrote them, and its unfinished line (a
  progress bar) is shown on the panel's first line. The panel is cleared when the view closes,
  so the verdict prints once, below the job's output.
* Not a terminal (CI logs, ``| tee``, a file): the job's stdout and stderr are inherited, as
  without the auditor; a compact plain line at most every :data:`STATUS_EVERY_S` seconds.
* ``--quiet`` or ``--live-interval 0``: nothing while the job runs.

Every view has ``out``: where the session prints its own notes while the view is open (on a
terminal, above the panel).
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TextIO

from rich.ansi import AnsiDecoder
from rich.console import Console
from rich.file_proxy import FileProxy
from rich.live import Live
from rich.text import Text

from auditor.analysis.findings import Finding
from auditor.analysis.snapshot import Snapshot
from auditor.cluster.relay import PtyRelay
from auditor.report.live import LiveState, panel_height, panel_lines, status_line
from auditor.torchrun import expected_ranks

# Not a terminal: a status line at most this often (CI logs stay short).
STATUS_EVERY_S = 10.0
# Panel redraws per second (rich's refresh thread); updates in between wait for the next one.
REFRESH_PER_S = 2.0
_STYLES = {"critical": "bold red", "warning": "yellow", "bold": "bold", "dim": "dim"}


class LiveView:
    """Nothing while the job runs (``--quiet``); the base of the other views."""

    def __init__(self, out: TextIO, *, state: LiveState, started: float) -> None:
        self.out = out
        self.state = state
        self.started = started

    @property
    def child_fd(self) -> int | None:
        """Where the job's stdout and stderr go; None: inherited from the auditor."""
        return None

    def child_started(self) -> None:
        """The job runs (holding :attr:`child_fd`, if any)."""

    def stage(self, text: str | None) -> None:
        """What the run waits for before ranks report ("starting Ray", ...)."""
        self.state = replace(self.state, stage=text)
        self._changed()

    def update(self, snapshot: Snapshot | None, findings: Sequence[Finding]) -> None:
        """The latest window and what the rules found in it."""
        self.state = replace(self.state, snapshot=snapshot, findings=tuple(findings))
        self._changed()

    def close(self) -> None:
        """The job ended: relay its last output and clear the panel (idempotent)."""

    def _changed(self) -> None:
        pass

    def _now_state(self) -> LiveState:
        return replace(self.state, elapsed_s=time.time() - self.started)


class StatusView(LiveView):
    """Not a terminal: one plain line at most every ``every_s`` seconds, no control codes."""

    def __init__(
        self,
        out: TextIO,
        *,
        state: LiveState,
        started: float,
        every_s: float = STATUS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(out, state=state, started=started)
        self.every_s = every_s
        self._clock = clock
        self._last = clock()

    def _changed(self) -> None:
        now = self._clock()
        if now - self._last < self.every_s:
            return
        self._last = now
        print(status_line(self._now_state()), file=self.out, flush=True)


class _Notes(io.TextIOBase):
    """The session's notes: above the panel while it shows, straight to the stream after."""

    def __init__(self, view: TerminalView, stream: TextIO) -> None:
        self._view = view
        self._stream = stream
        self._proxy = FileProxy(view.console, stream)

    def write(self, text: str) -> int:
        if self._view.showing:
            self._proxy.write(text)
        else:
            self._proxy.flush()
            self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        self._proxy.flush()
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


class TerminalView(LiveView):
    """A terminal: the rich live panel under the job's output, relayed through a pty."""

    def __init__(self, out: TextIO, *, state: LiveState, started: float) -> None:
        self.console = Console(file=out, highlight=False)
        super().__init__(out, state=state, started=started)
        self.out: TextIO = _Notes(self, out)  # type: ignore[assignment]
        self._decoder = AnsiDecoder()
        self._size = (self.console.width, self.console.height)
        self._live = Live(
            console=self.console,
            get_renderable=self._render,
            refresh_per_second=REFRESH_PER_S,
            transient=True,
            # Python-level prints of the auditor (and Ray's log forwarding) go above the panel.
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._relay: PtyRelay | None = PtyRelay(
            self._print_lines, self._set_partial, size=self._size
        )
        self._closed = False
        self._live.start(refresh=True)

    @property
    def showing(self) -> bool:
        return self._live.is_started

    @property
    def child_fd(self) -> int | None:
        return self._relay.child_fd if self._relay is not None else None

    def child_started(self) -> None:
        if self._relay is not None:
            self._relay.child_started()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._relay is not None:
                self._relay.close()
        finally:
            self._live.stop()

    def _print_lines(self, lines: Sequence[str]) -> None:
        # The job's lines as it wrote them: its colours kept, never wrapped or cut by rich
        # (the terminal wraps a long line as it would without the auditor).
        text = Text("\n").join(self._decoder.decode_line(line) for line in lines)
        self.console.print(text, soft_wrap=True)

    def _set_partial(self, text: str) -> None:
        self.state = replace(self.state, partial=text)

    def _render(self) -> Text:

        width, height = self.console.width, self.console.height
        if (width, height) != self._size and self._relay is not None:
            self._size = (width, height)
            self._relay.resize(width, height)
        return panel_text(self._now_state(), width=width, height=height)


def panel_text(state: LiveState, *, width: int, height: int) -> Text:
    """The panel for a terminal of ``width`` x ``height``, styled for rich."""
    lines = panel_lines(state, width=width, height=panel_height(height))
    text = Text(no_wrap=True, overflow="crop")
    for i, line in enumerate(lines):
        if i:
            text.append("\n")
        text.append(line.text, style=_STYLES.get(line.style, ""))
    return text


def _is_terminal(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def open_view(
    out: TextIO,
    *,
    command: Sequence[str],
    job: str,
    window_s: float,
    quiet: bool,
    interval_s: float,
    started: float,
    stdout: TextIO | None = None,
) -> LiveView:
    """The view for where the auditor writes: a panel only when both stdout and stderr are the
    terminal (with stdout piped, e.g. ``| tee``, the job's output would write over the panel)."""
    state = LiveState(
        elapsed_s=0.0, job=job, window_s=window_s, expected_ranks=expected_ranks(command)
    )
    if quiet or interval_s <= 0:
        return LiveView(out, state=state, started=started)
    if _is_terminal(out) and _is_terminal(stdout if stdout is not None else sys.stdout):
        try:
            return TerminalView(out, state=state, started=started)
        except OSError as exc:  # no pty to be had: the job's output is inherited instead
            print(f"auditor: no live panel ({exc}); status lines instead", file=out)
    return StatusView(out, state=state, started=started)
