"""The live view as people see it: ``auditor run`` in a real pseudo-terminal (100x30), read back
through a terminal emulator (pyte) with its scrollback; and the same run piped to files.

The job is ``examples/starved_rank.py`` under torchrun, wrapped by ``chatty_job.py``, which
prints numbered lines on stdout and stderr while it trains.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import EXAMPLES, REPO, base_env, run_auditor

pyte = pytest.importorskip("pyte")

pytestmark = pytest.mark.e2e

COLUMNS, ROWS = 100, 30
PANEL_HEADER = re.compile(r"^\s*rank\s+node\s+steps\s+step ms")
VERDICT_HEADER = re.compile(r"^\s*rank\s+host\s+steps\s+step ms")
JOB_LINE = re.compile(r"^job line (\d{3})")
STATUS = re.compile(r"^auditor (\d+s|\d+m\d\ds|\d+h\d\dm): ")


def _job() -> list[str]:
    torchrun = ["torchrun", "--nproc_per_node=2", str(EXAMPLES / "starved_rank.py")]
    return [sys.executable, str(Path(__file__).with_name("chatty_job.py")), *torchrun]


@dataclass
class Terminal:
    returncode: int
    frames: list[list[str]]  # the screen, sampled while the run went on
    lines: list[str]  # scrollback and the final screen, top to bottom


def _line_text(line: object, columns: int) -> str:
    return "".join(line[x].data for x in range(columns)).rstrip()  # type: ignore[index]


def run_in_terminal(argv: list[str], *, env: dict[str, str], timeout: float = 240) -> Terminal:
    """Run ``argv`` with a pty of COLUMNS x ROWS as its stdin, stdout and stderr; feed what it
    draws to a terminal emulator and sample the screen twice a second."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    screen = pyte.HistoryScreen(COLUMNS, ROWS, history=20_000)
    stream = pyte.ByteStream(screen)
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    frames: list[list[str]] = []
    deadline = time.monotonic() + timeout
    next_frame = 0.0
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the run and everything it started closed the pty
                    break
                if not data:
                    break
                stream.feed(data)
            if time.monotonic() >= next_frame:
                frames.append([line.rstrip() for line in screen.display])
                next_frame = time.monotonic() + 0.5
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    history = [_line_text(line, COLUMNS) for line in screen.history.top]
    return Terminal(code, frames, history + [line.rstrip() for line in screen.display])


def _tty_env() -> dict[str, str]:
    env = base_env()
    env["TERM"] = "xterm-256color"
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR"):
        env.pop(name, None)
    return env


def _job_lines_in_order(lines: list[str]) -> list[int]:
    numbers = [int(m.group(1)) for line in lines if (m := JOB_LINE.match(line))]
    assert numbers, "the job's own lines are missing"
    assert numbers == list(range(len(numbers))), numbers  # all there, once, in order
    return numbers


def test_panel_in_place_under_the_job_output_then_the_verdict_once(
    ray_address: str, tmp_path: Path
) -> None:
    argv = [
        sys.executable, "-m", "auditor", "run", "--address", ray_address,
        "--report", str(tmp_path / "r.json"), "--", *_job(),
    ]  # fmt: skip
    term = run_in_terminal(argv, env=_tty_env())
    text = "\n".join(term.lines)
    assert term.returncode == 0, text

    # While it ran: never more than one panel on the screen, and the panel was there, below
    # the job's latest lines.
    counts = [sum(bool(PANEL_HEADER.match(x)) for x in frame) for frame in term.frames]
    assert max(counts) == 1, "\n".join(term.frames[counts.index(max(counts))])
    with_rows = [
        f
        for f in term.frames
        if any(PANEL_HEADER.match(x) for x in f) and any(re.match(r"^\s*!?1\s", x) for x in f)
    ]
    assert with_rows, "the panel never showed the ranks"
    frame = with_rows[-1]
    header = next(i for i, x in enumerate(frame) if PANEL_HEADER.match(x))
    assert any(JOB_LINE.match(x) for x in frame[:header]), "\n".join(frame)
    assert not any(JOB_LINE.match(x) for x in frame[header:]), "\n".join(frame)
    waits = [x for f in term.frames for x in f if "waiting for ranks" in x or "Ray ..." in x]
    assert waits, "no progress shown while waiting"

    # Afterwards: the panel is gone, the job's lines are all there in order, the verdict once.
    assert not any(PANEL_HEADER.match(x) for x in term.lines), text
    assert sum(bool(VERDICT_HEADER.match(x)) for x in term.lines) == 1, text
    assert "chatty: stdout tty True, stderr tty True" in term.lines  # the job saw a terminal
    numbers = _job_lines_in_order(term.lines)
    assert "trained" in text
    verdict = [i for i, x in enumerate(term.lines) if x.startswith("Verdict:")]
    assert len(verdict) == 1, text
    # The starved rank is named (on a loaded 2-core machine its slow steps may be read as
    # compute; which finding leads is the rules' business, not the view's).
    assert term.lines[verdict[0]].startswith("Verdict: rank 1 holds the job back"), text
    last_job_line = max(i for i, x in enumerate(term.lines) if JOB_LINE.match(x))
    assert last_job_line < verdict[0] and len(numbers) > 8


def test_piped_run_has_no_escape_codes_and_a_status_line_per_10s(
    ray_address: str, tmp_path: Path
) -> None:
    run = run_auditor(["--address", ray_address], _job(), tmp=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "\x1b" not in run.stdout and "\x1b" not in run.stderr
    assert "chatty: stdout tty False, stderr tty False" in run.stdout  # inherited, as before
    status = [line for line in run.stderr.splitlines() if STATUS.match(line)]
    assert len(status) <= run.elapsed_s / 10 + 1, status
    assert not any(PANEL_HEADER.match(line) for line in run.stderr.splitlines())
    # The job's own output, unchanged: even lines on stdout, odd ones on stderr, in order.
    out = [int(m.group(1)) for x in run.stdout.splitlines() if (m := JOB_LINE.match(x))]
    err = [int(m.group(1)) for x in run.stderr.splitlines() if (m := JOB_LINE.match(x))]
    assert out == sorted(out) and err == sorted(err)
    assert sorted(out + err) == list(range(len(out) + len(err)))
    assert all(n % 2 == 1 for n in err) and all(n % 2 == 0 for n in out[:-1])
    assert "Verdict: rank 1 holds the job back" in run.stderr
