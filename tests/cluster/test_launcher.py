"""The launcher: commands refused before they start, the child's process group stopped for
sure, and orphans re-parented to the auditor reaped (in a helper process: being a subreaper is
a property of the whole process, so the pytest process never becomes one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from auditor.cluster.launcher import Child, LaunchError, check_command, exit_code_of
from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_for
from tests.probe import SCRIPTS, clean_env


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ([], "nothing to run"),
        (["no-such-command-for-auditor-tests"], "command not found: no-such-command"),
        ([sys.executable, "-u", "missing_train.py"], "script not found: missing_train.py"),
        (["torchrun", "--nproc_per_node=2", "nope/train.py"], "script not found: nope/train.py"),
    ],
)
def test_check_command_refuses(command: list[str], message: str) -> None:
    if command[:1] == ["torchrun"]:
        require_tool("torchrun", install="it comes with torch: pip install torch")
    with pytest.raises(LaunchError, match=message):
        check_command(command)


@pytest.mark.parametrize(
    "command",
    [
        # Only the script is checked: the x.py after it is the script's own argument.
        pytest.param([sys.executable, "{script}", "--out", "x.py"], id="script-with-arguments"),
        pytest.param([sys.executable, "-c", "print(1)"], id="no-script"),
        pytest.param(["true"], id="on-path"),
    ],
)
def test_check_command_accepts_runnable_commands(command: list[str], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    command = [a.replace("{script}", str(script)) for a in command]
    assert check_command(command) is None  # accepted: nothing raised
    # ...and what it accepted really runs.
    child = Child(command, clean_env())
    child.start()
    assert child.wait(30) == 0


def test_exit_code_follows_the_shell_convention() -> None:
    assert exit_code_of(-15) == 143
    assert exit_code_of(-9) == 137
    assert exit_code_of(0) == 0
    assert exit_code_of(3) == 3


def test_child_passes_env_and_exit_code_and_gets_its_own_session() -> None:
    env = {**clean_env(), "AUDITOR_TEST_CODE": "7"}
    c = Child(
        [
            sys.executable,
            "-c",
            "import os,sys,time; time.sleep(0.2); sys.exit(int(os.environ['AUDITOR_TEST_CODE']))",
        ],
        env,
    )
    c.start()
    assert os.getsid(c.pid) == c.pid  # a session (and process group) of its own
    assert c.wait(30) == 7
    assert c.stop(1.0) == 7  # already done: nothing to signal


def test_child_start_error_is_one_clear_line() -> None:
    with pytest.raises(LaunchError, match="cannot start") as caught:
        Child(["/nonexistent/bin/train"], clean_env()).start()
    assert caught.value.exit_code == 127  # the shell's "not found"


def test_stop_ends_a_polite_child_with_sigterm() -> None:
    c = Child([sys.executable, "-c", "import time; time.sleep(60)"], clean_env())
    c.start()
    time.sleep(0.2)
    code = c.stop(grace_s=10)
    assert code == -15 and exit_code_of(code) == 143


STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    # SIG_IGN survives exec: the grandchild ignores SIGTERM as well
    "kid = subprocess.Popen(['sleep', '60'])\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f: f.write(str(kid.pid))\n"
    "import os; os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(60)\n"
)


def test_stop_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    c = Child([sys.executable, "-c", STUBBORN, str(ready)], clean_env())
    c.start()
    wait_for(ready.exists, timeout=30, what="the child to start its grandchild")
    kid = int(ready.read_text())
    t0 = time.monotonic()
    code = c.stop(grace_s=0.5)
    took = time.monotonic() - t0
    assert code == -9 and exit_code_of(code) == 137
    assert took >= 0.5  # SIGKILL only once the grace is over

    # the whole group got SIGKILL, including the grandchild
    def grandchild_gone() -> bool:
        try:
            return psutil.Process(kid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_for(grandchild_gone, timeout=5, what=f"grandchild {kid} to die with its group")


def test_reap_descendants_ends_orphans_reparented_to_the_subreaper() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "reaper.py")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["subreaper"] is True and r["ready"] is True
    assert r["parent"] == r["pid"], "the orphan was not re-parented to the subreaper"
    assert r["sleeper"] in r["found"]
    assert r["sleeper"] in r["reaped"]
    assert r["alive_after"] is False
    assert r["left"] == []
    assert r["took"] >= 0.5  # it ignored SIGTERM: killed after the grace period
