"""The live view: findings appear while the job still runs, as soon as the window supports them.

Piped (not a terminal), the live view is a status line at most every 10 s (the panel on a
terminal is tested in test_live_tty.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .conftest import REPO, base_env, torchrun

pytestmark = pytest.mark.e2e


def test_fault_injected_midway_shows_while_the_job_runs(ray_address: str, tmp_path: Path) -> None:
    # Rank 1's reads turn slow 20 s into training; the job trains 50 s in all.
    argv = [
        sys.executable, "-m", "auditor", "run", "--address", ray_address,
        "--live-interval", "1", "--report", str(tmp_path / "r.json"), "--",
        *torchrun("starved_rank.py", "--fault-after", "20", "--seconds", "50"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, env=base_env(), stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    lines: list[tuple[float, str]] = []
    out: list[tuple[float, str]] = []

    def pump(stream: object, into: list[tuple[float, str]]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append((time.monotonic(), line.rstrip("\n")))

    threads = [
        threading.Thread(target=pump, args=(proc.stderr, lines), daemon=True),
        threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
    ]
    for t in threads:
        t.start()
    code = proc.wait(timeout=180)
    ended = time.monotonic()
    for t in threads:
        t.join(timeout=5)
    assert code == 0, "\n".join(line for _, line in lines[-40:])

    status = [(t, line) for t, line in lines if re.match(r"^auditor (\d+s|\d+m\d\ds): ", line)]
    assert len(status) >= 3, "a status line about every 10 s"
    live = [(t, line) for t, line in status if "data_starvation rank 1" in line]
    assert live, "\n".join(line for _, line in lines[-60:])
    first = live[0][0]
    trained = [t for t, line in out if line.startswith("trained ")]
    assert trained, "the job's own output comes through"
    # Seen live, well before the job finished training (not only in the final verdict).
    assert first < trained[0] - 3, (first, trained[0])
    # And not before the fault: the first status lines with steps carried no such finding.
    with_steps = [t for t, line in status if "steps/s" in line]
    assert with_steps and with_steps[0] < first - 3
    assert ended >= first
