"""The pty relay: a real child writes to stdout and stderr; lines come back in order."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from auditor.cluster.launcher import Child
from auditor.cluster.relay import PtyRelay, visible

CHILD = r"""
import os, shutil, sys, time
print("tty", sys.stdout.isatty(), sys.stderr.isatty(), shutil.get_terminal_size())
for i in range(200):
    stream = sys.stdout if i % 2 else sys.stderr
    stream.write(f"line {i:03d} \x1b[32mgreen\x1b[0m\n")
    stream.flush()
for p in range(0, 101, 25):
    sys.stderr.write(f"\r{p:3d}%|{'#' * (p // 10):<10}|")
    sys.stderr.flush()
    if p == 50:  # until the test has seen this bar as the unfinished line
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.01)
sys.stderr.write("\n")
sys.stdout.write("no newline at the end")
sys.exit(3)
"""


class Sink:
    def __init__(self, go: Path) -> None:
        self.go = go
        self.lines: list[str] = []
        self.partials: list[str] = []
        self.lock = threading.Lock()

    def on_lines(self, lines: Sequence[str]) -> None:
        with self.lock:
            self.lines.extend(lines)

    def on_partial(self, text: str) -> None:
        with self.lock:
            self.partials.append(text)
        if text == " 50%|#####     |":
            self.go.touch()


def test_child_output_relayed_in_order_through_a_terminal(tmp_path: Path) -> None:
    sink = Sink(tmp_path / "go")
    relay = PtyRelay(sink.on_lines, sink.on_partial, size=(100, 30))
    command = [sys.executable, "-c", CHILD, str(sink.go)]
    child = Child(command, {"PATH": "/usr/bin:/bin"}, output=relay.child_fd)
    child.start()
    relay.child_started()
    assert child.wait(60) == 3  # the exit code is the job's
    relay.close()
    lines = sink.lines
    # The job saw a terminal of the real terminal's size on both streams.
    assert lines[0] == "tty True True os.terminal_size(columns=100, lines=30)"
    body = lines[1:201]
    assert body == [f"line {i:03d} \x1b[32mgreen\x1b[0m" for i in range(200)]
    # A progress bar redrawn with \r ends as the terminal shows it; on the way it was partial.
    assert lines[201] == "100%|##########|"
    assert " 50%|#####     |" in sink.partials
    # The unfinished last line is not lost when the job ends.
    assert lines[202:] == ["no newline at the end"]
    assert sink.partials[-1] == ""


def test_visible_keeps_what_a_terminal_shows() -> None:
    assert visible("plain") == "plain"
    assert visible("\r 10%\r 20%") == " 20%"
    assert visible("done\r") == "done"
    assert visible("\r") == ""
