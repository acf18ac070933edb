"""The job's exit code and output come through unchanged; signals reach the whole job; nothing
is left behind (ranks, DataLoader workers, Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.waiting import wait_quietly
from tests.tmproot import ray_temp_dir

from .conftest import REPO, base_env, run_auditor, torchrun, until_training

pytestmark = pytest.mark.e2e

CRASH = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = DataLoader(TensorDataset(torch.randn(4096, 16), torch.randint(0, 4, (4096,))), batch_size=8)
for step, (x, y) in enumerate(data):
    if rank == 1 and step == 40:
        print("rank 1 crashes now", flush=True)
        raise RuntimeError("injected failure on rank 1")
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
"""


def _leftovers(since: float, markers: tuple[str, ...]) -> list[str]:
    """Processes started after ``since`` whose command line names this run: its script (ranks,
    DataLoader workers, torchrun) or its Ray temp dir (every process of an embedded Ray)."""
    left = []
    for p in psutil.process_iter(["pid", "create_time", "cmdline", "name"]):
        try:
            if p.info["create_time"] < since - 1:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            if any(m in cmd for m in markers):
                left.append(f"{p.pid} {p.info['name']} {cmd[:120]}")
        except psutil.Error:
            continue
    return left


def _agents() -> int:
    return sum(
        1
        for p in psutil.process_iter(["cmdline"])
        if "NodeAgentCore" in " ".join(p.info["cmdline"] or [])
    )


def _wait_no_leftovers(since: float, *markers: str, timeout: float = 15) -> list[str]:
    """What of the run is still there after waiting up to ``timeout`` s for it to go (empty:
    nothing), for the caller's assert to name."""
    wait_quietly(lambda: not _leftovers(since, markers), timeout, every=0.5)
    return _leftovers(since, markers)


def test_exit_code_and_output_pass_through_unchanged(tmp_path: Path, ray_address: str) -> None:
    cmd = [
        sys.executable,
        "-c",
        "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(7)",
    ]
    bare = subprocess.run(cmd, capture_output=True, text=True)
    run = run_auditor(["--quiet", "--address", ray_address], cmd, tmp=tmp_path)
    assert run.returncode == bare.returncode == 7
    assert run.stdout.startswith(bare.stdout)
    assert run.stderr.startswith(bare.stderr)
    assert run.report is not None and run.report["job"]["exit_code"] == 7


def test_crashing_rank_exit_code_and_partial_report(tmp_path: Path, ray_address: str) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    cmd = ["torchrun", "--nproc_per_node=2", str(script)]
    bare = subprocess.run(cmd, capture_output=True, text=True, env=base_env(), timeout=120)
    started = time.time()
    agents_before = _agents()
    run = run_auditor(["--quiet", "--address", ray_address], cmd, tmp=tmp_path)
    assert bare.returncode != 0
    assert run.returncode == bare.returncode, run.stderr[-2000:]
    assert "rank 1 crashes now" in run.stdout
    assert "injected failure on rank 1" in run.stderr
    assert run.report is not None
    assert run.report["job"]["exit_code"] == run.returncode
    steps = {r["rank"]: r["steps"] for r in run.report["ranks"]}
    assert steps.get(1, 0) >= 30, steps  # what was seen before the crash is kept
    assert all(r["ended"] for r in run.report["ranks"])
    assert _wait_no_leftovers(started, str(script)) == []
    assert _agents() <= agents_before  # its node agent actor was killed in the shared cluster


def test_sigterm_ends_the_job_group_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM to ``auditor run`` on the embedded default (its own local Ray): the job ends,
    the report is written and marked interrupted, and no rank, worker or Ray process remains."""
    report = tmp_path / "r.json"
    script = str(REPO / "examples" / "train_ddp.py")
    ray_dir = ray_temp_dir()
    argv = [
        sys.executable, "-m", "auditor", "run", "--report", str(report), "--live-interval", "1",
        "--ray-temp-dir", ray_dir, "--",
        *torchrun("train_ddp.py", "--seconds", "120", "--workers", "2"),
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.Popen(argv, cwd=REPO, env=base_env(), stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    until_training(proc, 120)  # a live status line with a step rate: the ranks train
    me = psutil.Process(proc.pid)
    tree = me.children(recursive=True)
    assert len(tree) >= 6, [p.name() for p in tree]  # torchrun, 2 ranks, workers, Ray
    # The auditor yields to the job (--nice, 10 by default): it and its Ray run niced, the job
    # at the priority it was started with.
    own = os.getpriority(os.PRIO_PROCESS, 0)
    nice: dict[int, tuple[int, str]] = {}
    for p in tree:
        try:
            nice[p.pid] = (p.nice(), " ".join(p.cmdline()))
        except psutil.Error:  # a short-lived child (a Ray helper, a loader worker) already gone
            continue
    job = [n for n, cmd in nice.values() if script in cmd]
    ray_side = [n for n, cmd in nice.values() if ray_dir in cmd]
    assert len(job) >= 3 and len(ray_side) >= 2, nice
    assert me.nice() == max(own, 10) and set(ray_side) == {max(own, 10)}, nice
    assert set(job) == {own}, nice
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    code = proc.wait(timeout=60)
    assert code != 0
    data = json.loads(report.read_text())
    assert data["job"]["interrupted"] is True
    assert data["job"]["exit_code"] == code
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert all(r["steps"] > 0 for r in data["ranks"])
    _gone, alive = psutil.wait_procs(tree, timeout=15)
    assert alive == [], [p.pid for p in alive]
    assert _wait_no_leftovers(started, script, ray_dir) == []


def test_a_job_that_ignores_ctrl_c_ends_at_the_second(tmp_path: Path) -> None:
    """A job stuck where SIGINT does nothing (a rank blocked in a collective, a child blocked at
    fork): the first Ctrl-C reaches it and the auditor says a second one kills it; the second
    does, the report is written and marked interrupted, and nothing is left."""
    report = tmp_path / "r.json"
    marker = "ignores-sigint-job"
    job = (
        f"import signal, time  # {marker}\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    argv = [
        sys.executable, "-m", "auditor", "run", "--no-ray", "--report", str(report),
        "--live-interval", "0", "--", sys.executable, "-c", job,
    ]  # fmt: skip
    started = time.time()
    proc = subprocess.Popen(
        argv, cwd=REPO, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == "ready"
    tree = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGINT)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=2)  # the job ignored it, so the auditor waits for it as it should
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=30)
    err = proc.stderr.read()
    assert "SIGINT sent to the job; Ctrl-C again kills it" in err
    assert code == 128 + signal.SIGKILL, err[-2000:]
    data = json.loads(report.read_text())
    assert data["job"]["interrupted"] is True
    assert data["job"]["exit_code"] == code
    _gone, alive = psutil.wait_procs(tree, timeout=15)
    assert alive == [], [p.pid for p in alive]
    assert _wait_no_leftovers(started, marker) == []
