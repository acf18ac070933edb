"""The probe's cost per training step, measured where it is visible: a near-empty step.

A whole DDP job on a shared 2-core machine swings by tens of percent from run to run, far more
than the probe's own cost. So this measures the absolute cost the probe adds to ONE step: the
same single-process loop (DataLoader -> forward -> backward -> optimizer step on a tiny model,
about 0.3 ms a step) with and without the probe, in alternating pairs of subprocesses. The
difference of the per-step medians is the probe's cost in microseconds; divided by a real step
time (the example job's, measured by probe_overhead.py) it gives the overhead share. The
difference of the means (``probe_mean_cost_per_step_us``) adds what only some steps pay (a
forward whose activations the memory meter samples), which a median step leaves out.

With ``--collective`` both arms also run a one-rank gloo process group and all-reduce the loss
every step (the probe then times that collective: its wrapper's cost is in the figure).

With ``--memory`` each round runs three arms side by side, in an order rotated from round to
round: no probe, the probe with its memory measure off (``AUDITOR_PROBE_MEMORY=0``), and the probe
with it on (every ``--memory-every``-th forward sampled: ``AUDITOR_PROBE_MEMORY_EVERY``; the
probe's default 10 if not given). The memory measure's own cost is the median over rounds of
(on - off); the result goes to ``probe_hotpath_memory.json``. Each arm's budgets are counted: the
on arm must send at least one, the off arm none. The CPU figures include the measure's one-time
cost (its first fixed-part walk and ``gc`` scan for modules outside the model, tens of ms) spread
over ``--steps``: short runs overstate it; the wall figures are medians and leave it out.

FLOPs per step (``auditor.probe.flops``) are counted on one step of each probed run (the 4th,
inside the skipped warm-up, so no median holds it): that step's own extra cost, as the probe
reports it (``FlopCount.cost_s``), is summarised apart (``flops_count_cost_ms_median``); every
other step pays only a shape comparison at the model's forward, which the per-step figures hold.

With ``--flush-off`` each round also runs the probe with its flush thread held off until the
process exits (``AUDITOR_PROBE_FLUSH_S=3600``): the training thread's hooks alone. The median over
rounds of (probe - flush off) is what the flush thread (resolving, encoding and sending every
step) adds to the median step (``flush_cost_per_step_us``), to the mean step
(``flush_mean_cost_per_step_us``: a step that needs the GIL while the flush holds it waits) and
to the CPU (``flush_cpu_per_step_us``); its rows arrive at exit, so it is not held to the sample
count.

With ``--against REV`` each round also runs REV's probe (checked out into a temporary git
worktree, booted from there) beside this tree's: ``cost_vs_against_us`` is the median over
rounds of (this tree's probe - REV's probe), what a change costs every step; the result goes to
``probe_hotpath_against.json``.

With ``--profile`` nothing is timed side by side: one probed loop (and REV's, with
``--against``) runs under cProfile, its flush thread asleep, and the loop's end flushes every
step under cProfile too; the costliest calls of each, in microseconds a step, are printed and
go to ``probe_hotpath_profile.json``. cProfile adds its own cost to every Python call: read the
ranking, not the absolute figures.

    python bench/probe_hotpath.py [--pairs 7] [--steps 20000] [--collective]
        [--memory [--memory-every N]] [--flush-off] [--against REV] [--profile]

A smoke run that leaves the real results alone:
``BENCH_RESULTS_DIR=/tmp/hot python bench/probe_hotpath.py --pairs 1 --steps 300 --memory``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

from auditor.cluster.intake import RankIntake
from auditor.cluster.probing import BOOT_DIR, probe_env
from auditor.probe.memory import ACTIVATIONS_EVERY

# The goal: the probe costs at most this share of a real step, in wall time.
GOAL_PCT = 0.1
# The loop's first steps (start-up, the probe attaching) are left out of its median.
SKIPPED_STEPS = 100

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
prof = None
if sys.argv[3] == "1":
    import cProfile
    prof = cProfile.Profile()
    prof.enable()
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
if prof is not None:
    prof.disable()
    import json, pstats
    from auditor.probe.hooks import current
    def costliest(p, n):
        st = pstats.Stats(p).stats
        rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:n]
        return [{"function": f"{k[0].split('site-packages/')[-1]}:{k[1]}({k[2]})", "calls": v[1],
                 "own_us_per_step": round(v[2] / len(times) * 1e6, 3),
                 "cumulative_us_per_step": round(v[3] / len(times) * 1e6, 3)} for k, v in rows]
    flush = cProfile.Profile()
    flush.enable()
    current().sink.flush()  # every step of the loop: the flush thread never woke during it
    flush.disable()
    print("PROFILE=" + json.dumps({"loop": costliest(prof, 80), "flush": costliest(flush, 15)}))
times = sorted(times[__SKIP__:])
median, mean = times[len(times) // 2], sum(times) / len(times)
print(f"cpu_us={cpu * 1e6:.3f} median_us={median * 1e6:.3f} mean_us={mean * 1e6:.3f}")
"""


LOOP_SOURCE = LOOP.replace("__SKIP__", str(SKIPPED_STEPS))


def _loop_output(steps: int, env: dict[str, str], collective: bool, profile: bool) -> str:
    """The loop's stdout, run in a fresh interpreter with ``env``."""
    return subprocess.run(
        [
            sys.executable, "-c", LOOP_SOURCE, str(steps),
            "1" if collective else "0", "1" if profile else "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # fmt: skip


def run_loop(
    steps: int, env: dict[str, str], collective: bool = False
) -> tuple[float, float, float]:
    """(CPU time per step, median and mean wall time per step), in microseconds."""
    out = _loop_output(steps, env, collective, profile=False)
    fields = dict(kv.split("=") for kv in out.split()[-3:])
    return float(fields["cpu_us"]), float(fields["median_us"]), float(fields["mean_us"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=7,
                   help="rounds of arms side by side (a pair; three with --memory)")  # fmt: skip
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--step-ms", type=float, default=None,
                   help="real step time to express the cost against (default: from "
                        "bench/results/probe_overhead.json, else 28 ms)")  # fmt: skip
    p.add_argument("--collective", action="store_true",
                   help="all-reduce the loss every step in a one-rank gloo group")  # fmt: skip
    p.add_argument("--memory", action="store_true",
                   help="also run the probe with its memory measure off, beside it on")  # fmt: skip
    p.add_argument("--memory-every", type=int, default=None, metavar="N",
                   help="AUDITOR_PROBE_MEMORY_EVERY for the probe with memory on "
                        "(default: the probe's own, every 10th forward)")  # fmt: skip
    p.add_argument("--flush-off", action="store_true",
                   help="also run the probe with its flush thread held off until exit")  # fmt: skip
    p.add_argument("--against", metavar="REV", default=None,
                   help="also run REV's probe (a git worktree) beside this tree's")  # fmt: skip
    p.add_argument("--profile", action="store_true",
                   help="instead: one probed loop (and REV's) under cProfile: the costliest "
                        "calls per step of the loop and of the flush")  # fmt: skip
    args = p.parse_args(argv)
    if args.steps <= SKIPPED_STEPS:
        p.error(f"--steps must be more than the {SKIPPED_STEPS} warm-up steps the loop skips")
    if args.profile:
        return profile_main(args)
    base = dict(os.environ)
    base.pop("AUDITOR_PROBE", None)
    rundir = tempfile.mkdtemp(prefix="aud-hot-")
    sink = os.path.join(rundir, "s.sock")
    intake = RankIntake(sink)
    intake.start()
    probed = probe_env(base, sink=sink, job="hotpath")
    if args.memory_every is not None:
        probed["AUDITOR_PROBE_MEMORY_EVERY"] = str(args.memory_every)
    if args.memory:
        arms = {
            "plain": base,
            "memory_off": {**probed, "AUDITOR_PROBE_MEMORY": "0"},
            "memory_on": {**probed, "AUDITOR_PROBE_MEMORY": "1"},
        }
    else:
        arms = {"plain": base, "probe": probed}
    if args.flush_off:
        arms["flush_off"] = {**arms["memory_on" if args.memory else "probe"],
                             "AUDITOR_PROBE_FLUSH_S": "3600"}  # fmt: skip
    worktree = _worktree(args.against) if args.against else None
    if worktree is not None:
        arms["against"] = _booted_from(probed, worktree)
    names = list(arms)
    rounds: list[dict[str, Any]] = []
    try:
        for i in range(args.pairs):
            # Rotated each round, so that no arm always runs first (or right after another).
            order = names[i % len(names) :] + names[: i % len(names)]
            row: dict[str, Any] = {"order": order}
            for name in order:
                cpu, wall, mean = run_loop(args.steps, arms[name], args.collective)
                samples, budgets, counts = received(intake, probed=name != "plain")
                row[name] = {"wall_us": wall, "mean_us": mean, "cpu_us": cpu, "samples": samples,
                             "budgets": budgets, "flops_cost_s": counts}  # fmt: skip
            rounds.append(row)
            print(f"round {i + 1}/{args.pairs}: " + "; ".join(
                f"{n} wall {row[n]['wall_us']:.1f} us, CPU {row[n]['cpu_us']:.1f} us"
                + (f" ({row[n]['samples']} samples, {row[n]['budgets']} budgets)"
                   if n != "plain" else "")
                for n in names
            ))  # fmt: skip
    finally:
        intake.stop()
        if worktree is not None:
            subprocess.run(["git", "-C", c.REPO, "worktree", "remove", "--force", worktree],
                           capture_output=True)  # fmt: skip

    def cost(arm: str, against: str, key: str) -> float:
        return round(statistics.median(q[arm][key] - q[against][key] for q in rounds), 2)

    step_ms = args.step_ms or _example_step_ms()
    probe = "memory_on" if args.memory else "probe"
    wall_cost, cpu_cost = cost(probe, "plain", "wall_us"), cost(probe, "plain", "cpu_us")
    probed_arms = [n for n in names if n != "plain"]
    overhead_pct = _pct(wall_cost, step_ms)
    summary: dict[str, Any] = {
        "probe_cost_per_step_us": wall_cost,
        "probe_cpu_per_step_us": cpu_cost,
        # The mean holds what a median step leaves out: work on some steps only (a forward
        # whose activations are sampled; the FLOP count is in the skipped warm-up).
        "probe_mean_cost_per_step_us": cost(probe, "plain", "mean_us"),
        "cpu_overhead_pct_at_reference_step": _pct(cpu_cost, step_ms),
        "plain_step_us_median": round(statistics.median(q["plain"]["wall_us"] for q in rounds), 2),
        "reference_step_ms": step_ms,
        "overhead_pct_at_reference_step": overhead_pct,
        "goal_pct": GOAL_PCT,
        "goal_met": overhead_pct <= GOAL_PCT,
        "collective_per_step": args.collective,
        "probe_memory": arms[probe].get("AUDITOR_PROBE_MEMORY", "1") != "0",
        "memory_every": int(arms[probe].get("AUDITOR_PROBE_MEMORY_EVERY", ACTIVATIONS_EVERY)),
        "samples_all_received": all(
            q[n]["samples"] >= args.steps - 200
            for q in rounds
            for n in probed_arms
            if n != "flush_off"
        ),
    }
    count_costs = [x for q in rounds for n in probed_arms for x in q[n]["flops_cost_s"]]
    summary["flops_counts"] = len(count_costs)
    if count_costs:
        summary["flops_count_cost_ms_median"] = round(1e3 * statistics.median(count_costs), 3)
        summary["flops_count_cost_ms_max"] = round(1e3 * max(count_costs), 3)
    if args.memory:
        mem_wall = cost("memory_on", "memory_off", "wall_us")
        mem_cpu = cost("memory_on", "memory_off", "cpu_us")
        summary.update(
            {
                "probe_without_memory_cost_per_step_us": cost("memory_off", "plain", "wall_us"),
                "probe_without_memory_cpu_per_step_us": cost("memory_off", "plain", "cpu_us"),
                "memory_cost_per_step_us": mem_wall,
                "memory_mean_cost_per_step_us": cost("memory_on", "memory_off", "mean_us"),
                "memory_cpu_per_step_us": mem_cpu,
                "memory_overhead_pct_at_reference_step": _pct(mem_wall, step_ms),
                "memory_cpu_overhead_pct_at_reference_step": _pct(mem_cpu, step_ms),
                # The on arm measured a budget; the off arm sent none.
                "memory_budgets_as_expected": all(
                    q["memory_on"]["budgets"] >= 1 and q["memory_off"]["budgets"] == 0
                    for q in rounds
                ),
            }
        )
    if args.flush_off:
        summary["flush_cost_per_step_us"] = cost(probe, "flush_off", "wall_us")
        summary["flush_mean_cost_per_step_us"] = cost(probe, "flush_off", "mean_us")
        summary["flush_cpu_per_step_us"] = cost(probe, "flush_off", "cpu_us")
    if worktree is not None:
        summary["against"] = args.against
        summary["cost_vs_against_us"] = cost(probe, "against", "wall_us")
        summary["cpu_vs_against_us"] = cost(probe, "against", "cpu_us")
        summary["against_cost_per_step_us"] = cost("against", "plain", "wall_us")
        summary["mean_cost_vs_against_us"] = cost(probe, "against", "mean_us")
        summary["against_mean_cost_per_step_us"] = cost("against", "plain", "mean_us")
    name = "probe_hotpath" + ("_memory" if args.memory else "")
    name += "_against" if worktree is not None else ""
    name += "_collective" if args.collective else ""
    c.write_result(name, {"summary": summary, "runs": rounds})
    print(json.dumps(summary, indent=2))
    ok = summary["samples_all_received"] and summary.get("memory_budgets_as_expected", True)
    return 0 if ok else 1


def profile_main(args: argparse.Namespace) -> int:
    """``--profile``: the probed loop under cProfile, this tree's probe (and REV's)."""
    steps = min(args.steps, PROFILE_MAX_STEPS)
    base = dict(os.environ)
    base.pop("AUDITOR_PROBE", None)
    rundir = tempfile.mkdtemp(prefix="aud-hot-")
    sink = os.path.join(rundir, "s.sock")
    intake = RankIntake(sink)
    intake.start()
    # The flush thread sleeps through the loop; the loop's end flushes every step, profiled.
    probed = {**probe_env(base, sink=sink, job="hotpath"), "AUDITOR_PROBE_FLUSH_S": "3600"}
    arms = {"probe": probed}
    worktree = _worktree(args.against) if args.against else None
    if worktree is not None:
        arms["against"] = _booted_from(probed, worktree)
    out: dict[str, Any] = {"steps": steps, "collective_per_step": args.collective}
    try:
        for name, env in arms.items():
            out[name] = profile_loop(steps, env, args.collective)
            received(intake, probed=True)
    finally:
        intake.stop()
        if worktree is not None:
            subprocess.run(["git", "-C", c.REPO, "worktree", "remove", "--force", worktree],
                           capture_output=True)  # fmt: skip
    for name in arms:
        for part in ("loop", "flush"):
            print(f"{name}, {part} (own microseconds a step under cProfile):")
            for row in out[name][part][:20]:
                print(f"  {row['own_us_per_step']:8.2f}  {row['calls']:7d}  {row['function']}")
    out["against_rev"] = args.against
    c.write_result("probe_hotpath_profile", out)
    return 0


# The probe keeps at most 10,000 closed steps between flushes (StepClock's max_pending).
PROFILE_MAX_STEPS = 9_000


def profile_loop(steps: int, env: dict[str, str], collective: bool) -> dict[str, Any]:
    out = _loop_output(steps, env, collective, profile=True)
    line = next(x for x in out.splitlines() if x.startswith("PROFILE="))
    result: dict[str, Any] = json.loads(line[len("PROFILE=") :])
    return result


def received(
    intake: RankIntake, *, probed: bool, timeout_s: float = 10.0
) -> tuple[int, int, list[float]]:
    """(steps, budgets, the FLOP-counted steps' costs) the last arm sent: for a probed arm,
    everything until the intake saw its connection close (its last flush may still be in the
    socket when the process has exited)."""
    steps = budgets = 0
    costs: dict[int, float] = {}  # by counted step: a count may be resent on a new connection
    deadline = time.monotonic() + timeout_s
    while True:
        got = intake.drain()
        steps += len(got.steps)
        budgets += len(got.memory)
        costs.update({f.step: f.cost_s for f in got.flops if f.cost_s is not None})
        if not probed or got.ended or time.monotonic() > deadline:
            return steps, budgets, list(costs.values())
        time.sleep(0.05)


def _worktree(rev: str) -> str:
    """``rev`` checked out (detached) into a temporary worktree."""
    path = tempfile.mkdtemp(prefix="aud-hot-rev-")
    os.rmdir(path)
    subprocess.run(["git", "-C", c.REPO, "worktree", "add", "--detach", path, rev],
                   check=True, capture_output=True)  # fmt: skip
    return path


def _booted_from(probed: dict[str, str], tree: str) -> dict[str, str]:
    """The probed environment with the probe booted from ``tree``'s package, not this one's."""
    env = dict(probed)
    rest = [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x and x != BOOT_DIR]
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(tree, "auditor", "probe", "boot"), tree, *rest]
    )
    env["AUDITOR_PROBE_ROOT"] = tree
    return env


def _pct(cost_us: float, step_ms: float) -> float:
    return round(100 * cost_us / (step_ms * 1e3), 4)


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
