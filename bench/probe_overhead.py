"""Probe overhead: training steps per second with and without the probe, side by side.

Both arms run the same command, ``torchrun --nproc_per_node=2 bench/steps_job.py --seconds S``
(the train_ddp example, timed from inside the job so start-up is excluded). The probe arm adds
the environment ``auditor run`` gives a job (``PYTHONPATH=auditor/probe/boot``,
``AUDITOR_PROBE=1``, ``AUDITOR_SINK=<socket>``); the socket is served by a real
``auditor.cluster.intake.RankIntake`` in this process, drained once a second, so samples are
really sent and received. Arms alternate (plain, probe, plain, probe, ...); each pair gives one
ratio probe/plain of steps per second. Goal (README): the probe costs at most 0.5 %, i.e. a
median ratio of at least 0.995.

    python bench/probe_overhead.py [--pairs 5] [--seconds 20]

Writes bench/results/probe_overhead.json.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from typing import Any

import _common as c

GOAL_MIN_RATIO = 0.995  # probe at most 0.5 % slower
_RATE = re.compile(r"steps_per_s=([0-9.]+) timed_steps=(\d+) timed_s=([0-9.]+)")


class IntakeServer:
    """A RankIntake (the agent's own socket end) plus a thread that drains and counts."""

    def __init__(self, path: str) -> None:
        from auditor.cluster.intake import RankIntake

        self.intake = RankIntake(path)
        self.steps: Counter[int] = Counter()
        self.ranks_ended: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-drain", daemon=True)

    def start(self) -> None:
        self.intake.start()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._drain()

    def _drain(self) -> None:
        batch = self.intake.drain()
        for s in batch.steps:
            self.steps[s.rank] += 1
        self.ranks_ended.update(batch.ended)

    def reset(self) -> dict[str, Any]:
        """Counts since the last reset (after a run's last flush arrived)."""
        self._drain()
        out = {
            "steps_received": {str(k): v for k, v in sorted(self.steps.items())},
            "ranks_ended": sorted(self.ranks_ended),
            "connections": self.intake.connections,
            "bad_lines": self.intake.bad_lines,
        }
        self.steps.clear()
        self.ranks_ended.clear()
        return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3)
        self.intake.stop()


def run_arm(
    name: str, seconds: float, env: dict[str, str], logdir: str, index: int, timeout_s: float
) -> dict[str, Any]:
    cmd = [
        c.tool("torchrun"),
        "--nproc_per_node=2",
        os.path.join(c.BENCH_DIR, "steps_job.py"),
        "--seconds",
        str(seconds),
    ]
    err_path = os.path.join(logdir, f"{index:02d}-{name}.stderr")
    t0 = time.perf_counter()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, cwd=c.REPO)
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            c.stop_tree(proc)
            out = b""
    wall = time.perf_counter() - t0
    text = out.decode(errors="replace")
    m = _RATE.search(text)
    rec: dict[str, Any] = {
        "arm": name,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 3),
        "steps_per_s": float(m.group(1)) if m else None,
        "timed_steps": int(m.group(2)) if m else None,
        "timed_s": float(m.group(3)) if m else None,
        "leftover_processes": c.leftovers(),
    }
    if m is None or proc.returncode != 0:
        rec["stdout_tail"] = text[-1500:]
        rec["stderr_tail"] = c.tail(err_path)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5, help="alternating plain/probe pairs")
    ap.add_argument("--seconds", type=float, default=20.0, help="training seconds per run")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")

    from auditor.cluster.probing import probe_env

    c.become_subreaper()
    rundir = tempfile.mkdtemp(prefix="bench-probe-")
    sink = os.path.join(rundir, "sink.sock")
    server = IntakeServer(sink)
    server.start()
    plain_env = c.clean_env()
    probe_env_ = probe_env(plain_env, sink=sink, job="bench-probe-overhead")
    timeout_s = args.seconds * 3 + 120
    load_before = c.loadavg()
    runs: list[dict[str, Any]] = []
    ratios: list[float] = []
    try:
        for i in range(args.pairs):
            pair: dict[str, dict[str, Any]] = {}
            for name, env in (("plain", plain_env), ("probe", probe_env_)):
                server.reset()
                rec = run_arm(name, args.seconds, env, rundir, len(runs), timeout_s)
                time.sleep(1.2)  # one more drain after the ranks' final flush
                rec["intake"] = server.reset()
                rec["pair"] = i
                runs.append(rec)
                pair[name] = rec
                print(
                    f"pair {i + 1}/{args.pairs} {name:5s}: "
                    + (
                        f"{rec['steps_per_s']:.3f} steps/s over {rec['timed_steps']} steps"
                        if rec["steps_per_s"]
                        else f"FAILED (exit {rec['exit_code']})"
                    )
                    + (
                        f", intake got {sum(rec['intake']['steps_received'].values())} samples"
                        if name == "probe"
                        else ""
                    ),
                    flush=True,
                )
            a, b = pair["plain"]["steps_per_s"], pair["probe"]["steps_per_s"]
            if a and b:
                ratios.append(b / a)
    finally:
        server.stop()
        for f in os.listdir(rundir):
            try:
                os.unlink(os.path.join(rundir, f))
            except OSError:
                pass
        try:
            os.rmdir(rundir)
        except OSError:
            pass

    s = c.summary(ratios)
    slowdown = {k: (1.0 - v) * 100 if isinstance(v, float) else v for k, v in s.items()}
    probe_samples = [
        sum(r["intake"]["steps_received"].values()) for r in runs if r["arm"] == "probe"
    ]
    payload = {
        "what": "training steps/s, probe arm over plain arm, per alternating pair",
        "settings": {
            "pairs": args.pairs,
            "seconds": args.seconds,
            "nproc_per_node": 2,
            "warmup_steps": int(os.environ.get("BENCH_WARMUP_STEPS", "5")),
        },
        "goal": {"min_ratio": GOAL_MIN_RATIO, "max_slowdown_pct": 0.5},
        "ratio_probe_over_plain": s,
        "per_pair_ratios": ratios,
        "slowdown_pct": {
            "median": slowdown["median"],
            "best": slowdown["max"],
            "worst": slowdown["min"],
        },
        "meets_goal": (s["median"] is not None and s["median"] >= GOAL_MIN_RATIO),
        "probe_samples_received": probe_samples,
        "load_avg_before": load_before,
        "load_avg_after": c.loadavg(),
        "runs": runs,
    }
    path = c.write_result("probe_overhead", payload)
    print()
    print(f"probe overhead: steps/s ratio probe/plain {c.fmt_ratio(s)}")
    if s["n"]:
        print(
            f"  slowdown median {slowdown['median']:+.2f} %  (goal <= 0.5 %: "
            f"{'met' if payload['meets_goal'] else 'NOT met'})"
        )
    print(f"  samples received from probed runs: {probe_samples}")
    left = [x for r in runs for x in r["leftover_processes"]]
    if left:
        print(f"  WARNING: {len(left)} process(es) left behind after runs (see JSON)")
    print(f"  results: {c.shown(path)}")
    failed = len(ratios) < args.pairs or any(n == 0 for n in probe_samples)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
