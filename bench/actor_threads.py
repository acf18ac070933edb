"""Where an actor's CPU goes, thread by thread, and what Ray's own settings change.

Two arms run at the same time, each in its own private single-node Ray (a subprocess each):
``default`` and ``tuned`` (``--tuned``: a JSON object of Ray ``_system_config`` keys, the
``RAY_<name>`` settings of Ray's ``ray_config_def.h``). In each, what ``auditor fleet`` runs on a
node (a NodeAgent pulling one GpuMonitor replaying a recorded GPU every 1 s) and an idle Ray actor
beside it. After ``--warmup`` seconds, every thread's CPU time (utime + stime from
``/proc/<pid>/task/<tid>/stat``) of each actor's worker process is read at the start and the end
of ``--seconds``; reported per thread name as % of one core.

    python bench/actor_threads.py [--seconds 60] [--tuned '{"metrics_report_interval_ms": 60000}']

Writes bench/results/actor_threads.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

import _common as c

TICK = os.sysconf("SC_CLK_TCK")
NODE = "bench-node"
DEFAULT_TUNED = {
    "metrics_report_interval_ms": 60000,
    "task_events_report_interval_ms": 60000,
}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{tid: (thread name, CPU seconds)} of one process."""
    out: dict[int, tuple[str, float]] = {}
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if int(tid) == pid:
            name = "main (Ray's task loop)"  # Python threads share the process's name
        elif name.startswith("ray::"):
            name = "Python threads (the actor's own)"
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def by_name(pid: int, t0: dict[int, tuple[str, float]], seconds: float) -> dict[str, float]:
    """% of one core per thread name between ``t0`` and now."""
    now = thread_cpu(pid)
    pct: dict[str, float] = defaultdict(float)
    for tid, (name, cpu) in now.items():
        pct[name] += (cpu - t0.get(tid, (name, 0.0))[1]) / seconds * 100
    return {k: round(v, 3) for k, v in sorted(pct.items(), key=lambda kv: -kv[1]) if v > 0}


def arm(config: dict[str, Any], seconds: float, warmup: float) -> dict[str, Any]:
    """One arm, in this process: its own Ray, the actors, the per-thread figures."""
    os.environ.setdefault("RAY_AUTH_MODE", c.RAY_AUTH_MODE)
    sys.path.insert(0, c.REPO)
    from pathlib import Path

    import ray

    from auditor.cluster.fleet import Fleet
    from tests.helpers.gpus import write_gpus

    work = tempfile.mkdtemp(prefix="aud-at-")
    spec = write_gpus(Path(work) / "gpus.jsonl", {NODE: 1}, seconds=30)
    ray.init(
        num_cpus=1,
        num_gpus=0,
        include_dashboard=False,
        log_to_driver=False,
        resources={f"auditor_node:{NODE}": 1},
        _temp_dir=os.path.join(work, "ray"),
        _node_ip_address="127.0.0.1",
        _system_config=config or None,
        namespace="auditor-bench",
    )

    @ray.remote(num_cpus=0, num_gpus=0)
    class Idle:
        def pid(self) -> int:
            return os.getpid()

    idle = Idle.remote()  # type: ignore[attr-defined]
    fleet = Fleet(device_source=spec, sample_interval_s=1.0, watch_interval_s=3600)
    fleet.start()
    try:
        (d,) = fleet.deployments().values()
        pids = {
            "NodeAgent": int(ray.get(d.agent.address.remote(), timeout=60)["pid"]),
            "GpuMonitor": int(
                ray.get(next(iter(d.monitors.values())).info.remote(), timeout=60)["pid"]
            ),
            "idle actor": int(ray.get(idle.pid.remote(), timeout=60)),
        }
        time.sleep(warmup)
        t0 = {k: thread_cpu(p) for k, p in pids.items()}
        start = time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - start
        threads = {k: by_name(p, t0[k], wall) for k, p in pids.items()}
        return {
            "system_config": config,
            "total_pct": {k: round(sum(v.values()), 3) for k, v in threads.items()},
            "threads_pct": threads,
        }
    finally:
        fleet.stop()
        ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--tuned", default=json.dumps(DEFAULT_TUNED))
    ap.add_argument("--arm", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm is not None:
        print(json.dumps(arm(json.loads(args.arm), args.seconds, args.warmup)), flush=True)
        return 0
    load_before = c.loadavg()
    arms = {"default": {}, "tuned": json.loads(args.tuned)}
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--arm",
                json.dumps(cfg),
                "--seconds",
                str(args.seconds),
                "--warmup",
                str(args.warmup),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, cfg in arms.items()
    }
    results: dict[str, Any] = {}
    for name, p in procs.items():
        out, _ = p.communicate(timeout=args.seconds + args.warmup + 180)
        lines = [x for x in out.splitlines() if x.startswith("{")]
        results[name] = json.loads(lines[-1]) if lines else {"error": f"exit {p.returncode}"}
    payload = {
        "benchmark": "actor_threads",
        "command": c.command_line(),
        "date": c.now_iso(),
        "machine": c.machine(),
        "ray_auth_mode": c.RAY_AUTH_MODE,
        "what": "CPU % of one core per thread name of each actor's worker process, two private "
        "Rays side by side (default and tuned _system_config)",
        "settings": {"seconds": args.seconds, "warmup": args.warmup},
        "load_avg_before": load_before,
        "load_avg_after": c.loadavg(),
        "arms": results,
    }
    path = c.write_result("actor_threads", payload)
    for name, r in results.items():
        print(f"{name}: {r.get('total_pct', r)}")
        for actor, threads in r.get("threads_pct", {}).items():
            print(f"  {actor}: {threads}")
    print(f"wrote {path}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
