"""Shared pieces of the benchmarks: machine facts, ratio statistics, result files, process care.

Standard library and psutil only. Every benchmark measures a ratio of two arms run side by side
in alternating pairs (A, B, A, B, ...) so that slow drift on a shared machine hits both arms.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import psutil

from auditor.cluster.launcher import end_processes

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH_DIR)
EXAMPLES = os.path.join(REPO, "examples")
# Smoke runs can write elsewhere (BENCH_RESULTS_DIR) so they do not replace real results.
RESULTS = os.environ.get("BENCH_RESULTS_DIR") or os.path.join(BENCH_DIR, "results")

_PR_SET_CHILD_SUBREAPER = 36
# What the audited arms run with: the caller's setting, else Ray's token auth off (a private
# loopback Ray that lives and dies with each run).
RAY_AUTH_MODE = os.environ.get("RAY_AUTH_MODE", "disabled")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", REPO, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine() -> dict[str, Any]:
    """What the numbers were measured on (torch and ray versions without importing them)."""
    mem = psutil.virtual_memory()
    return {
        "nproc": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "memory_total_mb": round(mem.total / 2**20),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "ray": _version("ray"),
        "psutil": _version("psutil"),
        "auditor": _version("gpu-balance-auditor"),
        "git_commit": _git_commit(),
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    return shlex.join([sys.executable, *sys.argv])


def summary(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max (and mean, n) of a list of per-pair ratios or latencies."""
    vals = [float(v) for v in values]
    if not vals:
        return {"n": 0, "median": None, "min": None, "max": None, "mean": None}
    return {
        "n": len(vals),
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "mean": statistics.fmean(vals),
    }


def write_result(name: str, payload: Mapping[str, Any]) -> str:
    """Write ``<RESULTS>/<name>.json`` with command line, date and machine; return its path."""
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    doc = {
        "benchmark": name,
        "command": command_line(),
        "date": now_iso(),
        "machine": machine(),
        "ray_auth_mode": RAY_AUTH_MODE,
        **payload,
    }
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any AUDITOR_* variable (so no arm is audited by
    accident), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUDITOR_")}
    if extra:
        env.update(extra)
    return env


def tool(name: str) -> str:
    """A console script of this Python (next to ``sys.executable``), else the one on PATH.

    Going straight to the script skips wrappers such as pyenv shims, whose start-up would
    otherwise be charged to whichever arm has more of them.
    """
    import shutil

    here = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return shutil.which(name) or name


def which_auditor() -> list[str]:
    """The ``auditor`` console script when installed, else ``python -m auditor``."""
    exe = tool("auditor")
    return [exe] if os.path.isabs(exe) else [sys.executable, "-m", "auditor"]


# --------------------------------------------------------------------------------------------
# processes


def become_subreaper() -> bool:
    """Orphans of what we start (a rank whose torchrun died, a Ray daemon the auditor did not
    stop) are re-parented to us, so :func:`leftovers` can find them after each run."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def describe(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        return f"{p.pid} (gone)"
    return f"{p.pid} {cmd[:160]}"


def leftovers(grace_s: float = 5.0) -> list[str]:
    """Processes still below this one after a run finished: waits ``grace_s`` for them to exit
    on their own, then describes, ends (by PID) and reaps whatever is left. Returns the
    descriptions (empty: nothing was left behind)."""
    deadline = time.monotonic() + grace_s
    procs: list[psutil.Process] = []
    while True:
        _reap_zombies()
        procs = [p for p in _children() if _alive(p)]
        if not procs or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    found = [describe(p) for p in procs]
    end_processes(procs, 3)
    _reap_zombies()
    return found


def _children() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap_zombies() -> None:
    """Collect exited orphans re-parented to us (call only while no Popen of ours is running)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_tree(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGTERM a command we started (it forwards to its own children), SIGKILL after grace."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        for p in [*_tree(proc.pid), psutil.Process(proc.pid)]:
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait(5)
    except (ProcessLookupError, psutil.Error):
        pass


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def shown(path: str) -> str:
    """A results path as printed: relative to the repository when inside it."""
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel


def fmt_ratio(s: Mapping[str, Any], digits: int = 4) -> str:
    if not s.get("n"):
        return "no data"
    return (
        f"median {s['median']:.{digits}f}  (min {s['min']:.{digits}f}, max {s['max']:.{digits}f},"
        f" n={s['n']})"
    )
