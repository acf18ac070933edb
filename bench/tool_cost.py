"""Whole-tool cost of ``auditor run``: wall time against the bare job, and the auditor's memory.

(a) Wall time of ``auditor run --quiet -- torchrun --nproc_per_node=2 examples/train_ddp.py
    --seconds S`` (embedded Ray, the default) against the bare ``torchrun ... --seconds S``, in
    alternating pairs (bare, audited, bare, audited, ...); one ratio audited/bare per pair.
    Goal: median ratio <= 1.05.
(b) Peak memory of everything the auditor starts except the training job: every 0.5 s the
    process tree under the auditor is walked and the PSS (``memory_full_info().pss``; RSS where
    PSS cannot be read) of the auditor and its descendants is summed, leaving out the job's own
    tree (the auditor's direct ``torchrun`` child and everything below it, and any process that
    carries the probe's ``AUDITOR_PROBE`` environment, e.g. a rank re-parented to the auditor).
    Ray's processes (gcs_server, raylet, its Python helpers, the ``ray::NodeAgentCore`` actor
    worker) are included. Reported: the peak sum and the breakdown by process at the peak.
    Goal: <= 400 MB.

The same sampler also runs during the bare arm (it then measures the job alone), so the
sampling cost falls on both arms; the job's own peak PSS is reported for both arms too.

    python bench/tool_cost.py [--pairs 5] [--seconds 60]
    python bench/tool_cost.py --quick          # smoke run: 2 pairs of 15 s

Writes bench/results/tool_cost.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import _common as c
import psutil

GOAL_MAX_RATIO = 1.05
GOAL_MAX_MB = 400.0
POLL_S = 0.5
MB = 2**20
_TRAINED = re.compile(rb"trained (\d+) steps")


def label(p: psutil.Process, root_pid: int) -> str:
    """A readable name: ``ray::NodeAgentCore``, ``raylet``, ``log_monitor.py``, ``auditor``."""
    try:
        cmd = p.cmdline()
        name = p.name()
    except psutil.Error:
        return "?"
    if p.pid == root_pid:
        return "auditor (driver)"
    if cmd and cmd[0].startswith("ray::"):
        return cmd[0].split()[0].split(".")[0]  # ray::NodeAgentCore.drain -> ray::NodeAgentCore
    if cmd and "python" in os.path.basename(cmd[0]):
        for i, arg in enumerate(cmd[1:], 1):
            if arg == "-m" and i + 1 < len(cmd):
                return f"python -m {cmd[i + 1]}"
            if arg.endswith(".py"):
                return os.path.basename(arg)
    if cmd:
        return os.path.basename(cmd[0]) or name
    return name


def memory_of(p: psutil.Process) -> tuple[int, str] | None:
    try:
        return int(p.memory_full_info().pss), "pss"
    except (psutil.AccessDenied, AttributeError, NotImplementedError):
        pass
    except psutil.Error:
        return None
    try:
        return int(p.memory_info().rss), "rss"
    except psutil.Error:
        return None


def _is_job_process(p: psutil.Process) -> bool:
    try:
        env = p.environ()
    except psutil.Error:
        return False
    return env.get("AUDITOR_PROBE", "") not in ("", "0", "false", "no")


class TreeSampler:
    """Samples a process tree every ``POLL_S`` seconds in a thread.

    ``audited``: the root is ``auditor run``; its ``torchrun`` child's tree (and anything carrying
    the probe's environment) is the job, everything else is the auditor's. Otherwise the whole
    tree is the job.
    """

    def __init__(self, root_pid: int, *, audited: bool) -> None:
        self.root_pid = root_pid
        self.audited = audited
        self.samples = 0
        self.kinds: set[str] = set()
        self.peak_tool = 0
        self.peak_tool_at = 0.0
        self.peak_tool_breakdown: list[dict[str, Any]] = []
        self.peak_job = 0
        self.max_tool_processes = 0
        self.cpu_s = 0.0
        self._t0 = time.monotonic()
        self._job_cache: dict[int, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        start_cpu = time.thread_time()
        try:
            while not self._stop.is_set():
                self._sample()
                self._stop.wait(POLL_S)
        finally:
            self.cpu_s = time.thread_time() - start_cpu

    def _classify(self, root: psutil.Process, procs: list[psutil.Process]) -> set[int]:
        """PIDs of the job's processes."""
        if not self.audited:
            return {p.pid for p in procs} | {root.pid}
        job: set[int] = set()
        for child in _safe_children(root, recursive=False):
            try:
                is_job = "torchrun" in " ".join(child.cmdline())
            except psutil.Error:
                continue
            if is_job:
                job.add(child.pid)
                job.update(p.pid for p in _safe_children(child, recursive=True))
        for p in procs:
            if p.pid in job:
                continue
            cached = self._job_cache.get(p.pid)
            if cached is None:
                cached = self._job_cache[p.pid] = _is_job_process(p)
            if cached:
                job.add(p.pid)
        return job

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
        except psutil.Error:
            return
        procs = [root, *_safe_children(root, recursive=True)]
        job = self._classify(root, procs)
        tool_total, job_total = 0, 0
        rows: list[dict[str, Any]] = []
        for p in procs:
            m = memory_of(p)
            if m is None:
                continue
            nbytes, kind = m
            self.kinds.add(kind)
            if p.pid in job:
                job_total += nbytes
            else:
                tool_total += nbytes
                rows.append({"pid": p.pid, "process": label(p, self.root_pid), "mb": nbytes / MB})
        self.samples += 1
        self.peak_job = max(self.peak_job, job_total)
        self.max_tool_processes = max(self.max_tool_processes, len(rows))
        if self.audited and tool_total > self.peak_tool:
            self.peak_tool = tool_total
            self.peak_tool_at = time.monotonic() - self._t0
            self.peak_tool_breakdown = sorted(rows, key=lambda r: -r["mb"])

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "samples": self.samples,
            "memory_kind": sorted(self.kinds),
            "peak_job_mb": round(self.peak_job / MB, 1),
            "sampler_cpu_s": round(self.cpu_s, 3),
        }
        if self.audited:
            by_name: dict[str, dict[str, Any]] = {}
            for r in self.peak_tool_breakdown:
                e = by_name.setdefault(r["process"], {"process": r["process"], "count": 0, "mb": 0})
                e["count"] += 1
                e["mb"] += r["mb"]
            out.update(
                {
                    "peak_tool_mb": round(self.peak_tool / MB, 1),
                    "peak_tool_at_s": round(self.peak_tool_at, 1),
                    "max_tool_processes": self.max_tool_processes,
                    "peak_breakdown_by_name": [
                        {**e, "mb": round(e["mb"], 1)}
                        for e in sorted(by_name.values(), key=lambda e: -e["mb"])
                    ],
                    "peak_breakdown": [
                        {**r, "mb": round(r["mb"], 1)} for r in self.peak_tool_breakdown
                    ],
                }
            )
        return out


def _safe_children(p: psutil.Process, *, recursive: bool) -> list[psutil.Process]:
    try:
        return p.children(recursive=recursive)
    except psutil.Error:
        return []


def run_arm(arm: str, seconds: float, logdir: str, index: int, timeout_s: float) -> dict[str, Any]:
    job = [
        c.tool("torchrun"),
        "--nproc_per_node=2",
        os.path.join("examples", "train_ddp.py"),
        "--seconds",
        str(seconds),
    ]
    audited = arm == "auditor"
    if audited:
        cmd = [*c.which_auditor(), "run", "--quiet", "--", *job]
        env = c.clean_env({"RAY_AUTH_MODE": c.RAY_AUTH_MODE})
    else:
        cmd, env = job, c.clean_env()
    out_path = os.path.join(logdir, f"{index:02d}-{arm}.stdout")
    err_path = os.path.join(logdir, f"{index:02d}-{arm}.stderr")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, cwd=c.REPO)
        sampler = TreeSampler(proc.pid, audited=audited)
        sampler.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            c.stop_tree(proc)
        wall = time.perf_counter() - t0
        sampler.stop()
    with open(out_path, "rb") as f:
        m = _TRAINED.search(f.read())
    rec: dict[str, Any] = {
        "arm": arm,
        "command": cmd,
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 3),
        "trained_steps": int(m.group(1)) if m else None,
        "memory": sampler.result(),
        "leftover_processes": c.leftovers(),
    }
    if proc.returncode != 0 or m is None:
        rec["stdout_tail"] = c.tail(out_path)
        rec["stderr_tail"] = c.tail(err_path)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=None, help="alternating pairs (default 5)")
    ap.add_argument("--seconds", type=float, default=None, help="training seconds (default 60)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 pairs of 15 s")
    args = ap.parse_args(argv)
    pairs = args.pairs if args.pairs is not None else (2 if args.quick else 5)
    seconds = args.seconds if args.seconds is not None else (15.0 if args.quick else 60.0)
    if pairs < 1:
        ap.error("--pairs must be at least 1")

    c.become_subreaper()
    logdir = tempfile.mkdtemp(prefix="bench-toolcost-")
    timeout_s = seconds * 3 + 180
    load_before = c.loadavg()
    runs: list[dict[str, Any]] = []
    ratios: list[float] = []
    try:
        for i in range(pairs):
            pair: dict[str, dict[str, Any]] = {}
            for arm in ("bare", "auditor"):
                rec = run_arm(arm, seconds, logdir, len(runs), timeout_s)
                rec["pair"] = i
                runs.append(rec)
                pair[arm] = rec
                mem = rec["memory"]
                extra = (
                    f", tool peak {mem['peak_tool_mb']:.0f} MB" if arm == "auditor" else ""
                ) + f", job peak {mem['peak_job_mb']:.0f} MB"
                print(
                    f"pair {i + 1}/{pairs} {arm:7s}: {rec['wall_s']:.2f} s wall, exit "
                    f"{rec['exit_code']}, {rec['trained_steps']} steps{extra}",
                    flush=True,
                )
            a, b = pair["bare"], pair["auditor"]
            if a["exit_code"] == 0 and b["exit_code"] == 0:
                ratios.append(b["wall_s"] / a["wall_s"])
    finally:
        shutil.rmtree(logdir, ignore_errors=True)

    audited = [r for r in runs if r["arm"] == "auditor"]
    peaks = [r["memory"]["peak_tool_mb"] for r in audited]
    worst = max(audited, key=lambda r: r["memory"]["peak_tool_mb"]) if audited else None
    s = c.summary(ratios)
    mem_s = c.summary(peaks)
    step_ratios = [
        b["trained_steps"] / a["trained_steps"]
        for a, b in zip(runs[0::2], runs[1::2], strict=False)
        if a["trained_steps"] and b["trained_steps"]
    ]
    payload = {
        "what": "wall time audited/bare per alternating pair; peak PSS of the auditor's own "
        "processes (job excluded)",
        "settings": {"pairs": pairs, "seconds": seconds, "quick": args.quick, "poll_s": POLL_S},
        "goal": {"max_wall_ratio": GOAL_MAX_RATIO, "max_tool_mb": GOAL_MAX_MB},
        "wall_ratio_auditor_over_bare": s,
        "per_pair_wall_ratios": ratios,
        "trained_steps_ratio_auditor_over_bare": c.summary(step_ratios),
        "tool_peak_mb": mem_s,
        "tool_peak_breakdown_by_name": worst["memory"]["peak_breakdown_by_name"] if worst else [],
        "job_peak_mb": {
            "bare": c.summary([r["memory"]["peak_job_mb"] for r in runs if r["arm"] == "bare"]),
            "auditor": c.summary([r["memory"]["peak_job_mb"] for r in audited]),
        },
        "meets_goal": {
            "wall": s["median"] is not None and s["median"] <= GOAL_MAX_RATIO,
            "memory": bool(peaks) and max(peaks) <= GOAL_MAX_MB,
        },
        "load_avg_before": load_before,
        "load_avg_after": c.loadavg(),
        "runs": runs,
    }
    path = c.write_result("tool_cost", payload)
    print()
    print(f"tool cost: wall ratio auditor/bare {c.fmt_ratio(s, 3)}")
    print(f"  goal <= {GOAL_MAX_RATIO}: {'met' if payload['meets_goal']['wall'] else 'NOT met'}")
    if peaks:
        print(
            f"  auditor memory (job excluded): peak {max(peaks):.0f} MB "
            f"(median over runs {mem_s['median']:.0f} MB); goal <= {GOAL_MAX_MB:.0f} MB: "
            f"{'met' if payload['meets_goal']['memory'] else 'NOT met'}"
        )
        assert worst is not None
        for e in worst["memory"]["peak_breakdown_by_name"]:
            print(f"    {e['mb']:7.1f} MB  {e['process']} (x{e['count']})")
    left = [x for r in runs for x in r["leftover_processes"]]
    if left:
        print(f"  WARNING: {len(left)} process(es) left behind after runs:")
        for x in left:
            print(f"    {x}")
    print(f"  results: {c.shown(path)}")
    return 0 if len(ratios) == pairs else 1


if __name__ == "__main__":
    sys.exit(main())
