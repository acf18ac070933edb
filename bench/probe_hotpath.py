"""The probe's cost per training step, measured where it is visible: a near-empty step.

A whole DDP job on a shared 2-core machine swings by tens of percent from run to run, far more
than the probe's own cost. So this measures the absolute cost the probe adds to ONE step: the
same single-process loop (DataLoader -> forward -> backward -> optimizer step on a tiny model,
about 0.3 ms a step) with and without the probe, in alternating pairs of subprocesses. The
difference of the per-step medians is the probe's cost in microseconds; divided by a real step
time (the example job's, measured by probe_overhead.py) it gives the overhead share.

With ``--collective`` both arms also run a one-rank gloo process group and all-reduce the loss
every step (the probe then times that collective: its wrapper's cost is in the figure).

    python bench/probe_hotpath.py [--pairs 7] [--steps 20000] [--collective]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

from auditor.cluster.intake import RankIntake
from auditor.session import probe_env

LOOP = r"""
import sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
steps = int(sys.argv[1])
collective = sys.argv[2] == "1"
if collective:
    import tempfile
    import torch.distributed as dist
    init = "file://" + tempfile.mktemp(prefix="aud-hot-pg-")
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(steps, 8), torch.randint(0, 2, (steps,))), batch_size=1)
times = []
cpu0 = time.process_time()
last = time.perf_counter()
for x, y in data:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if collective:
        dist.all_reduce(loss.detach())
    opt.step()
    now = time.perf_counter()
    times.append(now - last)
    last = now
cpu = (time.process_time() - cpu0) / len(times)  # every thread of the process: flush included
times = sorted(times[100:])
print(f"cpu_us={cpu * 1e6:.3f} median_us={times[len(times) // 2] * 1e6:.3f}")
"""


def run_loop(steps: int, env: dict[str, str], collective: bool = False) -> tuple[float, float]:
    """(CPU time per step, median wall time per step), in microseconds."""
    out = subprocess.run(
        [sys.executable, "-c", LOOP, str(steps), "1" if collective else "0"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    fields = dict(kv.split("=") for kv in out.split()[-2:])
    return float(fields["cpu_us"]), float(fields["median_us"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--step-ms", type=float, default=None,
                   help="real step time to express the cost against (default: from "
                        "bench/results/probe_overhead.json, else 28 ms)")  # fmt: skip
    p.add_argument("--collective", action="store_true",
                   help="all-reduce the loss every step in a one-rank gloo group")  # fmt: skip
    args = p.parse_args(argv)
    base = dict(os.environ)
    base.pop("AUDITOR_PROBE", None)
    rundir = tempfile.mkdtemp(prefix="aud-hot-")
    sink = os.path.join(rundir, "s.sock")
    intake = RankIntake(sink)
    intake.start()
    probed = probe_env(base, sink=sink, job="hotpath")
    pairs = []
    try:
        for i in range(args.pairs):
            plain_cpu, plain = run_loop(args.steps, base, args.collective)
            probe_cpu, with_probe = run_loop(args.steps, probed, args.collective)
            received = len(intake.drain().steps)
            pairs.append({"plain_us": plain, "probe_us": with_probe, "plain_cpu_us": plain_cpu,
                          "probe_cpu_us": probe_cpu, "samples": received})  # fmt: skip
            print(f"pair {i + 1}/{args.pairs}: wall plain {plain:.1f} us, probe {with_probe:.1f} "
                  f"us; CPU plain {plain_cpu:.1f} us, probe {probe_cpu:.1f} us "
                  f"(+{probe_cpu - plain_cpu:.1f}); {received} samples received")  # fmt: skip
    finally:
        intake.stop()
    cost = statistics.median(q["probe_us"] - q["plain_us"] for q in pairs)
    cpu_cost = statistics.median(q["probe_cpu_us"] - q["plain_cpu_us"] for q in pairs)
    step_ms = args.step_ms or _example_step_ms()
    summary = {
        "probe_cost_per_step_us": round(cost, 2),
        "probe_cpu_per_step_us": round(cpu_cost, 2),
        "cpu_overhead_pct_at_reference_step": round(100 * cpu_cost / (step_ms * 1e3), 4),
        "plain_step_us_median": round(statistics.median(q["plain_us"] for q in pairs), 2),
        "reference_step_ms": step_ms,
        "overhead_pct_at_reference_step": round(100 * cost / (step_ms * 1e3), 4),
        "goal_pct": 0.5,
        "collective_per_step": args.collective,
        "samples_all_received": all(q["samples"] >= args.steps - 200 for q in pairs),
    }
    name = "probe_hotpath_collective" if args.collective else "probe_hotpath"
    c.write_result(name, {"summary": summary, "runs": pairs})
    print(json.dumps(summary, indent=2))
    return 0


def _example_step_ms() -> float:
    """The example job's plain step time from probe_overhead.json, else 28 ms (measured here)."""
    try:
        with open(os.path.join(c.RESULTS, "probe_overhead.json")) as f:
            runs = json.load(f)["runs"]
        rates = [r["steps_per_s"] for r in runs if r.get("arm") == "plain" and r.get("steps_per_s")]
        return round(1e3 / statistics.median(rates), 3)
    except (OSError, KeyError, ValueError, TypeError, statistics.StatisticsError):
        return 28.0


if __name__ == "__main__":
    sys.exit(main())
