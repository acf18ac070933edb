"""The DeepSpeed launcher and engine under ``auditor run``, for real on CPU (gloo, 2 ranks).

* ``deepspeed --num_gpus=2 --no_local_rank examples/starved_rank.py``: a plain DDP script under
  the DeepSpeed launcher; rank 1 starved -> data_starvation on rank 1.
* ``examples/frameworks/deepspeed_engine.py`` under ``deepspeed --num_gpus=2``: the engine's own
  loop (``engine.backward``, ``engine.step``), ZeRO 2 with rank 1 starved, ZeRO 1 with four
  micro-batches per update and rank 1 slow, ZeRO 0 balanced: the right rank named, a step per
  model update, ZeRO's collectives named, the phases adding up to the step.
* The job's exit code and a SIGTERM come through the launcher's two levels (the runner and
  ``deepspeed.launcher.launch``) and leave nothing behind.

DeepSpeed on CPU needs no GPU: the launcher takes ``--num_gpus`` as the ranks to start, and its
CPU accelerator (``DS_ACCELERATOR=cpu``) builds its small shared-memory op once (a C++ compiler,
ninja), cached under ``~/.cache/torch_extensions``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers.exits import ended_well, failure_text
from tests.helpers.waiting import wait_quietly

from .conftest import EXAMPLES, REPO, Run, base_env, run_auditor, until_training

pytestmark = pytest.mark.e2e

ENGINE = EXAMPLES / "frameworks" / "deepspeed_engine.py"
SEVERE = ("warning", "critical")
PHASES = ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s", "collective_wait_s")
# The report's per-phase medians sum near the median step, not on it (see test_frameworks.py).
PHASE_SUM_TOLERANCE = 0.12
STEPS = 60


def ds_env() -> dict[str, str]:
    pytest.importorskip("deepspeed")
    env = base_env()
    env["DS_ACCELERATOR"] = "cpu"
    return env


def deepspeed(*args: str) -> list[str]:
    return ["deepspeed", "--num_gpus=2", *args]


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Run]]:
    """The engine example with ``args``, once per module."""
    done: dict[tuple[str, ...], Run] = {}

    def get(*args: str) -> Run:
        if args not in done:
            done[args] = run_auditor(
                ["--quiet", "--no-ray"],
                deepspeed(str(ENGINE), *args, "--steps", str(STEPS)),
                tmp=tmp_path_factory.mktemp("deepspeed"),
                env=ds_env(),
                timeout=300,
            )
        return done[args]

    yield get


def _checked(run: Run, steps: int = STEPS) -> dict[str, Any]:
    assert run.report is not None, run.stderr[-4000:]
    ranks = run.report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1], ranks
    trained = all(steps - 2 <= r["steps"] <= steps for r in ranks)
    assert ended_well(run.returncode, run.stderr, finished=trained), failure_text(
        run.stderr, tail=4000
    )
    assert trained, [r["steps"] for r in ranks]
    assert run.report["job"]["world_size"] == 2
    return run.report


def _blamed(report: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["kind"] == kind]
    assert found, [(f["kind"], f["severity"], f["ranks"]) for f in report["findings"]]
    for f in report["findings"]:
        if f["severity"] in SEVERE:
            assert 0 not in f["ranks"], f  # rank 0 only waits
    return found[0]


def _phases_add_up(report: dict[str, Any]) -> None:
    assert report["job"]["parallel_mode"] == "deepspeed"
    for r in report["ranks"]:
        assert r["parallel_mode"] == "deepspeed", r
        assert r["unmeasured"] == [], r["unmeasured"]
        total = sum(r[p] for p in PHASES)
        assert abs(total - r["step_s"]) <= PHASE_SUM_TOLERANCE * r["step_s"], (
            r["rank"],
            {p: r[p] for p in PHASES},
            r["step_s"],
        )
        assert r["backward_s"] > 0 and r["optimizer_s"] > 0, r


def test_ddp_script_under_the_deepspeed_launcher(tmp_path: Path) -> None:
    script = str(EXAMPLES / "starved_rank.py")
    run = run_auditor(
        ["--quiet", "--no-ray"],
        deepspeed("--no_local_rank", script, "--seconds", "9"),
        tmp=tmp_path,
        env=ds_env(),
        timeout=300,
    )
    assert run.report is not None, run.stderr[-4000:]
    ranks = run.report["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert ended_well(run.returncode, run.stderr, finished="trained" in run.stdout)
    assert run.report["job"]["world_size"] == 2
    assert run.report["job"]["parallel_mode"] == "ddp"
    f = _blamed(run.report, "data_starvation")
    assert f["ranks"] == [1] and f["severity"] in SEVERE, f
    assert all(r["steps"] > 20 for r in ranks)


def test_zero_2_starved_rank_is_named(engine_run: Callable[..., Run]) -> None:
    report = _checked(engine_run("--zero", "2", "--fault", "starved"))
    f = _blamed(report, "data_starvation")
    assert f["ranks"] == [1] and f["severity"] in SEVERE, f
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[1]["data_wait_s"] > 2 * by_rank[0]["data_wait_s"], by_rank
    _phases_add_up(report)


def test_zero_2_collectives_are_seen(engine_run: Callable[..., Run]) -> None:
    """deepspeed.comm calls torch.distributed: the gradients' reduction and the updated
    partitions' all-gather are collective wait, by name, on every rank."""
    report = _checked(engine_run("--zero", "2", "--fault", "starved"))
    for r in report["ranks"]:
        ops = set(r["collective_ops"] or {})
        assert "all_gather_into_tensor" in ops or "all_gather" in ops, ops
        assert ops & {"all_reduce", "reduce_scatter_tensor", "reduce_scatter", "reduce"}, ops
        assert r["off_thread_collectives"] == 0, r


def test_zero_1_accumulating_slow_rank_is_named(engine_run: Callable[..., Run]) -> None:
    """Four micro-batches of 8 per update: a step is an update (``engine.step()`` between
    micro-batches updates nothing), 32 samples, and rank 1's slow forward is named."""
    report = _checked(engine_run("--zero", "1", "--accumulate", "4", "--fault", "slow"))
    for r in report["ranks"]:
        assert r["batch_size"] == 32, r
    f = _blamed(report, "compute_straggler")
    assert f["ranks"] == [1] and f["severity"] in SEVERE, f
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[1]["forward_s"] > by_rank[0]["forward_s"], by_rank
    assert by_rank[0]["collective_wait_s"] > by_rank[1]["collective_wait_s"], by_rank
    _phases_add_up(report)


def test_zero_0_balanced_run_gets_no_warning(engine_run: Callable[..., Run]) -> None:
    report = _checked(engine_run("--zero", "0", "--fault", "none"))
    severe = [(f["kind"], f["ranks"]) for f in report["findings"] if f["severity"] in SEVERE]
    assert severe == []
    _phases_add_up(report)


# Rank 1 fails with 3 while rank 0 is busy (not at a collective, whose broken connection would
# fail it too, with 1, racing rank 1 to the launcher): the launcher ends rank 0 and exits 3.
CRASH = """
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    print("rank 1 exits 3", flush=True)
    os._exit(3)
time.sleep(120)
"""


def test_exit_code_comes_through_the_launcher(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    cmd = deepspeed("--no_local_rank", str(script))
    env = ds_env()
    bare = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
    run = run_auditor(["--quiet", "--no-ray"], cmd, tmp=tmp_path, env=env, timeout=180)
    assert bare.returncode == 3, bare.stderr[-2000:]
    assert run.returncode == 3, run.stderr[-2000:]
    assert "rank 1 exits 3" in run.stdout
    assert run.report is not None and run.report["job"]["exit_code"] == 3


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def test_sigterm_ends_the_deepspeed_job_and_leaves_nothing(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    argv = [
        sys.executable, "-m", "auditor", "run", "--no-ray", "--report", str(report),
        "--live-interval", "1", "--",
        *deepspeed(str(ENGINE), "--zero", "2", "--steps", "100000"),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env=ds_env(), stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    until_training(proc, 180)  # a live status line with a step rate: the ranks train
    tree = psutil.Process(proc.pid).children(recursive=True)
    # The runner, deepspeed.launcher.launch and the two ranks (``--local_rank=N``).
    commands = [_cmdline(p) for p in tree]
    assert sum(str(ENGINE) in c and "--local_rank=" in c for c in commands) == 2, commands
    assert any("deepspeed.launcher.launch" in c for c in commands), commands
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    code = proc.wait(timeout=60)
    assert code != 0
    data = json.loads(report.read_text())
    assert data["job"]["interrupted"] is True
    assert data["job"]["exit_code"] == code
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert all(r["steps"] > 0 for r in data["ranks"])

    def gone() -> bool:
        return not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    wait_quietly(gone, 15, every=0.5)
    assert gone(), [p.pid for p in tree if p.is_running()]
