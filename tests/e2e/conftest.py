"""Fixtures for end-to-end runs: one real local Ray for the whole session, and a runner that
starts ``auditor run`` as a real subprocess (the way users start it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.tmproot import ray_temp_dir

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("AUDITOR_PROBE", None)
    return env


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One Ray head for the session (start-up costs seconds and about 1 GiB): every run joins it
    with --address. Its temp dir is short (Unix socket paths are limited to 107 bytes)."""
    ray = pytest.importorskip("ray")
    temp = ray_temp_dir("head-")
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp,
        _node_ip_address="127.0.0.1",
        namespace="auditor-tests",
    )
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any] | None
    elapsed_s: float

    def findings(self, kind: str | None = None) -> list[dict[str, Any]]:
        fs = (self.report or {}).get("findings", [])
        return [f for f in fs if kind is None or f["kind"] == kind]


def run_auditor(
    args: list[str],
    command: list[str],
    *,
    tmp: Path,
    timeout: float = 180,
    env: dict[str, str] | None = None,
) -> Run:
    report = tmp / "report.json"
    argv = [sys.executable, "-m", "auditor", "run", "--report", str(report), *args, "--", *command]
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env or base_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # Ctrl-C, as a user would: the auditor stops its job and says where each rank was. A
        # job that ignores it gets a second Ctrl-C (the auditor kills it); what still runs after
        # that is killed here, the job's own session included (it holds the pipes open).
        stdout = stderr = ""
        tree = _descendants(proc.pid)
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGKILL):
            if sig == signal.SIGKILL:
                for p in {*tree, *_descendants(proc.pid)}:
                    with contextlib.suppress(psutil.Error):
                        p.kill()
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
            try:
                stdout, stderr = proc.communicate(timeout=30)
                break
            except subprocess.TimeoutExpired:
                continue
        tail = "\n".join((stderr or "").splitlines()[-40:])
        pytest.fail(f"auditor run still ran after {timeout:.0f} s; its last lines:\n{tail}")
    data = json.loads(report.read_text()) if report.exists() else None
    return Run(proc.returncode, stdout, stderr, data, time.monotonic() - start)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def torchrun(script: str, *args: str) -> list[str]:
    return ["torchrun", "--nproc_per_node=2", str(EXAMPLES / script), *args]


def until_training(proc: subprocess.Popen[str], timeout_s: float) -> list[str]:
    """Reads ``auditor run``'s stderr until its first live status line with a step rate (the
    ranks train); fails with the last lines if none came within ``timeout_s``. The lines read."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("auditor ") and "steps/s" in line:
            return seen
        assert time.monotonic() < deadline, "".join(seen[-20:])
    raise AssertionError("auditor run ended before training: " + "".join(seen[-20:]))
