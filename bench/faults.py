"""The fault benchmark: injected faults of every class the rules name, and balanced controls.

For each case, a real job (plain DDP loop, Lightning, the Hugging Face Trainer; 2 ranks, gloo
on CPU) runs under::

    auditor run --no-ray --events events.jsonl --report before.json -- JOB

(``--no-ray``: the node agent in the run's own process, so that no run pays a Ray start-up and
teardown on two cores; ``--ray shared`` joins one Ray head for every run instead.)

Its fault starts ``--fault-after`` seconds into training; the faulty rank prints ``FAULT_ONSET
<epoch>``. Detection is read from the live stream (``--events``): the time of the first verdict
line in which the expected finding (kind, and exactly the expected ranks) appears, at warning or
above (info for memory imbalance: a CPU job's memory is never near full). Latency = that time -
onset. Then the advice is applied and the job run again: loader levers with ``auditor run
--apply before.json`` where this auditor has ``--apply``, everything else with the job's own
knob, read from the finding's typed fixes (``--fix RANK.LEVER=VALUE``). Achieved speed-up = the
job's step rate after the onset, after / before (``FAULT_RATE``, printed by the job); predicted =
the final report's ``predicted_speedup`` of the finding, and whether the achieved one fell inside
its ``predicted_range`` (the figure itself where the report gives no range). With ``--pairs N``
a case whose finding predicts a speed-up runs N alternated before/after pairs, the same advice
applied each time (this machine's pace drifts between runs by more than fixes differ); its
predicted speed-up, the ends of its range and its achieved speed-up are the medians over the
pairs, and detection is the first run's. Controls run once: any finding at warning or above,
live or final, is a false alarm.

    python bench/faults.py [--quick] [--cases a,b] [--seconds 22] [--fault-after 10]
                           [--pairs 1] [--ray none|shared|embedded] [--keep DIR]

Writes bench/results/faults.json (``--quick``: faults_quick.json; ``--cases``:
faults_cases.json) and prints a table; the last line reads ``faults: found F/N, false alarms
A/C, advice within 20%: W/V, inside range: I/V, median detection S s``. A memory climb's rate
and a slowdown's step are also set against the job's own measure of its fault (``FAULT_MEMORY``,
``FAULT_STEP``): within 20% of the rate, within 5% of the steps (``measure_holds``).
Goals: every case found with the right ranks, 0 false alarms, every predicted speed-up within
20% of the achieved one and inside its range, median detection within 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import _common as c
import _events as ev

from auditor.configs import LIVE_INTERVAL_S

JOBS = os.path.join(c.BENCH_DIR, "faults_jobs")
GOAL_RATIO = 0.20
GOAL_LATENCY_S = 3.0
_ONSET = re.compile(r"FAULT_ONSET ([0-9.]+) rank=(\d+)")
_RATE = re.compile(r"FAULT_RATE steps=(\d+) seconds=([0-9.]+) rate=([0-9.]+)")
_FIX = re.compile(r"^FIX rank=(\d+) (\S+)=(\S+) (.+)$", re.M)
_STEP = re.compile(r"FAULT_STEP step=(\d+) steps=(\d+) rank=(\d+)")
_MEMORY = re.compile(r"FAULT_MEMORY bytes_per_step=(-?[0-9.]+) bytes_per_s=(-?[0-9.]+) steps=(\d+)")
# How close a finding that measures the fault must come to the job's own measure: a memory
# climb's rate within 20% of the rate the rank measured itself; a change placed within 5% of
# the rank's steps of the step the rank turned slow at (the tolerances).
GOAL_RATE = 0.20
GOAL_STEP = 0.05
# The levers a job's knob stands in for when one fix of a rank is an alternative to another:
# the rank's extra work removed makes its batch share moot.
_ALTERNATIVES = {
    "batch_size": ("rank_work", "loading_cost"),
    "loss_weight": ("batch_size",),
    "checkpoint_async": ("checkpoint_interval",),
}


@dataclass(frozen=True)
class Case:
    name: str
    cls: str  # the class of fault, as the tables group them
    job: str  # plain, lightning or trainer
    case: str  # the job's --case
    kind: str | None  # the expected finding; None: a control
    ranks: tuple[int, ...] = ()
    min_severity: str = "warning"
    quick: bool = False
    injects: str = ""
    seconds: float | None = None  # this case's training seconds, where not --seconds

    @property
    def control(self) -> bool:
        return self.kind is None


CASES: tuple[Case, ...] = (
    Case("io_starvation", "data: I/O-bound", "plain", "io_starvation", "data_starvation", (1,),
         quick=True, injects="rank 1 reads 4 ms per sample, one worker"),
    Case("cpu_starvation", "data: CPU-bound", "plain", "cpu_starvation", "data_starvation", (1,),
         injects="rank 1 decodes every sample with CPU-heavy work, no worker"),
    Case("too_many_workers", "cpu oversubscription", "plain", "too_many_workers",
         "cpu_oversubscription", (1,), injects="rank 1: 8 CPU-heavy workers on 2 cores"),
    Case("forward_straggler", "compute: forward", "plain", "forward_straggler",
         "compute_straggler", (1,), quick=True, injects="rank 1: 30 ms more in forward"),
    Case("backward_straggler", "compute: backward", "plain", "backward_straggler",
         "compute_straggler", (1,), injects="rank 1: 30 ms more in backward"),
    Case("uneven_batch", "uneven batches", "plain", "uneven_batch", "batch_split", (1,),
         quick=True, injects="rank 1 takes twice the others' batch"),
    Case("periodic_stall", "stall: periodic", "plain", "periodic_stall", "stall", (1,),
         quick=True, injects="rank 1: 0.5 s of its own work every 20 steps"),
    Case("eval_rank0", "stall: evaluation on rank 0", "plain", "eval_rank0", "stall", (0,),
         injects="rank 0 alone evaluates 40 batches every 20 steps"),
    Case("checkpoint_rank0", "stall: checkpoint on rank 0", "plain", "checkpoint_rank0", "stall",
         (0,), injects="rank 0 alone saves a 256 MiB checkpoint every 20 steps"),
    Case("memory_imbalance", "memory imbalance", "plain", "memory_imbalance", "memory_imbalance",
         (1,), min_severity="info",
         injects="rank 1 keeps an extra 256 MiB module, from the start"),
    Case("slow_collective", "slow collective", "plain", "slow_collective", "compute_straggler",
         (1,), injects="rank 1 all-gathers 2 MB of metrics objects per step"),
    Case("slow_transfer", "slow transfer", "plain", "slow_transfer", "slow_collective", (),
         injects="every rank all-gathers 16 MiB per step: the transfer itself, no rank"),
    Case("accum_starvation", "data: under accumulation", "plain", "accum_starvation",
         "data_starvation", (1,), injects="io_starvation, 4 micro-batches per step"),
    Case("lightning_starvation", "data: Lightning", "lightning", "starvation", "data_starvation",
         (1,), injects="Lightning: rank 1 reads 5 ms per sample, no worker"),
    Case("trainer_starvation", "data: HF Trainer", "trainer", "starvation", "data_starvation",
         (1,), injects="HF Trainer: rank 1 reads 5 ms per sample, no worker"),
    Case("memory_growth", "memory growth", "plain", "memory_growth", "memory_growth", (1,),
         injects="rank 1 keeps every step's loss with its graph (retain_graph), ~5 MiB a step"),
    Case("slowdown", "slowdown midway", "plain", "slowdown", "slowdown", (1,),
         injects="rank 1, even until then, turns 30 ms slower in forward at the onset"),
    Case("control_plain", "control", "plain", "none", None, quick=True,
         injects="balanced plain loop"),
    Case("control_lightning", "control", "lightning", "none", None,
         injects="balanced Lightning job"),
    Case("control_even_eval", "control", "plain", "even_eval", None,
         injects="every rank evaluates its share every 20 steps"),
    Case("control_long_startup", "control", "plain", "long_startup", None, seconds=10.0,
         injects="balanced: 10 s of start-up (rank 0 prepares data, rank 1 waits), 10 s of steps"),
)  # fmt: skip


def job_command(case: Case, seconds: float, fault_after: float, fixes: list[str]) -> list[str]:
    seconds = case.seconds or seconds
    if case.job == "lightning":  # Lightning starts its own ranks
        head = [sys.executable, os.path.join(JOBS, "lightning_job.py")]
    else:
        name = "plain.py" if case.job == "plain" else "trainer_job.py"
        head = [c.tool("torchrun"), "--nproc_per_node=2", os.path.join(JOBS, name)]
    args = ["--case", case.case, "--seconds", str(seconds), "--fault-after", str(fault_after)]
    return [*head, *args, *(a for f in fixes for a in ("--fix", f))]


@dataclass
class Run:
    exit_code: int | None
    timed_out: bool
    wall_s: float
    onset: float | None
    rate: float | None
    fixes_said: list[str]
    stream: ev.Stream
    report: dict[str, Any] | None
    log_tail: str = ""
    started: float = 0.0
    fault_step: tuple[int, int] | None = None  # (the faulty rank's first faulty step, its steps)
    memory_rate: tuple[float, float] | None = None  # the rank's own (bytes/step, bytes/s)

    def finding(self, kind: str, ranks: tuple[int, ...]) -> dict[str, Any] | None:
        for f in (self.report or {}).get("findings", []):
            if f.get("kind") == kind and tuple(f.get("ranks") or ()) == ranks:
                return dict(f)
        return None


def run_once(
    cmd_job: list[str], tmp: str, tag: str, address: str | None, extra: list[str], timeout_s: float
) -> Run:
    events = os.path.join(tmp, f"{tag}.events.jsonl")
    report = os.path.join(tmp, f"{tag}.json")
    log = os.path.join(tmp, f"{tag}.log")
    cmd = [*c.which_auditor(), "run", "--events", events,
           "--report", report, *(["--address", address] if address else []), *extra,
           "--", *cmd_job]  # fmt: skip
    env = c.clean_env({"RAY_AUTH_MODE": c.RAY_AUTH_MODE, "PYTHONUNBUFFERED": "1"})
    t0 = time.time()
    timed_out = False
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=c.REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            c.stop_tree(proc)
    with open(log, errors="replace") as f:
        text = f.read()
    onset = _ONSET.search(text)
    rate = _RATE.search(text)
    step = _STEP.search(text)
    memory = _MEMORY.search(text)
    try:
        with open(report) as f:
            rep: dict[str, Any] | None = json.load(f)
    except (OSError, ValueError):
        rep = None
    return Run(
        exit_code=proc.returncode,
        timed_out=timed_out,
        wall_s=round(time.time() - t0, 1),
        onset=float(onset.group(1)) if onset else None,
        rate=float(rate.group(3)) if rate and float(rate.group(3)) > 0 else None,
        fixes_said=[m.group(0) for m in _FIX.finditer(text)],
        stream=ev.read(events),
        report=rep,
        log_tail=text[-3000:],
        started=t0,
        fault_step=(int(step.group(1)), int(step.group(2))) if step else None,
        memory_rate=(float(memory.group(1)), float(memory.group(2))) if memory else None,
    )


def severe(a: ev.Appearance | dict[str, Any], floor: str = "warning") -> bool:
    order = ("info", "warning", "critical")
    sev = a.severity if isinstance(a, ev.Appearance) else str(a.get("severity"))
    return sev in order and order.index(sev) >= order.index(floor)


def knob_fixes(actions: list[dict[str, Any]]) -> list[str]:
    """The finding's typed fixes as the job's ``--fix RANK.LEVER=VALUE`` options (per rank, an
    alternative to a lever also given is left out)."""
    by_rank: dict[int, dict[str, Any]] = {}
    for a in actions:
        if isinstance(a.get("rank"), int):
            by_rank.setdefault(a["rank"], {}).setdefault(a["lever"], a.get("proposed"))
    out = []
    for rank, levers in sorted(by_rank.items()):
        for lever, value in levers.items():
            if any(alt in levers for alt in _ALTERNATIVES.get(lever, ())):
                continue
            text = "none" if value is None else str(value).lower()
            out.append(f"{rank}.{lever}={text}")
    return out


def has_apply() -> bool:
    out = subprocess.run(
        [*c.which_auditor(), "run", "--help"], capture_output=True, text=True, cwd=c.REPO
    )
    return "--apply" in out.stdout


def known_kinds() -> list[str]:
    from auditor.analysis.rules import KINDS

    return list(KINDS)


def run_case(
    case: Case, args: argparse.Namespace, address: str | None, apply: bool, ray_args: list[str]
) -> dict[str, Any]:
    tmp = tempfile.mkdtemp(prefix=f"bench-faults-{case.name}-", dir=args.keep)
    timeout_s = args.seconds + 150
    rec: dict[str, Any] = {"case": case.name, "class": case.cls, "injects": case.injects,
                           "job": case.job, "control": case.control}  # fmt: skip
    try:
        before = run_once(job_command(case, args.seconds, args.fault_after, []), tmp, "before",
                          address, ray_args, timeout_s)  # fmt: skip
        rec["before"] = _run_record(before)
        if case.control:
            alarms = [a.key for a in before.stream.appearances if severe(a)]
            alarms += [f"{f['kind']} {f['ranks']} (final)"
                       for f in (before.report or {}).get("findings", []) if severe(f)]  # fmt: skip
            rec["false_alarms"] = alarms
            rec["ok"] = not alarms and before.exit_code == 0
            return rec
        expect = (str(case.kind), case.ranks)
        hit = None
        if before.onset is not None:
            hit = before.stream.first(
                lambda a: (a.kind, a.ranks) == expect and severe(a, case.min_severity),
                after=before.onset,
            )
        rec["expected"] = {"kind": case.kind, "ranks": list(case.ranks)}
        rec["found"] = hit is not None
        rec["latency_s"] = round(hit.time - before.onset, 2) if hit and before.onset else None
        rec["onset_before_first_verdict"] = before.onset is not None and (
            before.stream.first_verdict is None or before.onset < before.stream.first_verdict
        )
        rec["other_live_findings"] = sorted(
            {a.key for a in before.stream.appearances if severe(a) and (a.kind, a.ranks) != expect}
        )
        final = before.finding(*expect)
        rec["in_final_verdict"] = final is not None
        rec.update(measured_against_job(case, before, final))
        actions = list((final or {}).get("actions") or (hit.actions if hit else ()))
        predicted = (final or {}).get("predicted_speedup")
        if predicted is None and hit is not None:
            predicted = hit.predicted_speedup
        rec["predicted_speedup"] = predicted
        span = (final or {}).get("predicted_range")
        rec["predicted_range"] = span if isinstance(span, list) and len(span) == 2 else None
        rec["actions"] = actions
        if not isinstance(predicted, (int, float)):
            rec["not_judged"] = "the finding predicts no speed-up"
        if not actions:
            rec["advice"] = "no typed fix to apply"
            return rec
        loader_only = all(a.get("how") == "loader" for a in actions)
        extra: list[str] = []
        knobs = knob_fixes(actions)
        if apply and loader_only:
            shutil.copy(os.path.join(tmp, "before.json"), os.path.join(tmp, "advice.json"))
            extra = ["--apply", os.path.join(tmp, "advice.json")]
            knobs = []
            rec["advice"] = "auditor run --apply before.json"
        else:
            rec["advice"] = "the job's knobs: " + " ".join(f"--fix {k}" for k in knobs)

        def again(tag: str, fixes: list[str], more: list[str]) -> Run:
            return run_once(job_command(case, args.seconds, args.fault_after, fixes), tmp, tag,
                            address, [*ray_args, *more], timeout_s)  # fmt: skip

        after = again("after", knobs, extra)
        rec["after"] = _run_record(after)
        rec["after_still_found"] = after.finding(*expect) is not None
        if not (before.rate and after.rate):
            return rec
        pairs = [Pair(predicted, rec["predicted_range"], after.rate / before.rate)]
        if isinstance(predicted, (int, float)):
            # More alternated before/after pairs, the same advice applied: the machine's pace
            # drifts between runs by more than the fixes' effects differ.
            for k in range(2, args.pairs + 1):
                b, a = again(f"before{k}", [], []), again(f"after{k}", knobs, extra)
                f = b.finding(*expect)
                if b.rate and a.rate and f is not None:
                    span = f.get("predicted_range")
                    pairs.append(Pair(f.get("predicted_speedup"),
                                      span if isinstance(span, list) and len(span) == 2 else None,
                                      a.rate / b.rate))  # fmt: skip
        rec.update(judge(pairs))
        return rec
    finally:
        if args.keep:
            rec["kept"] = tmp
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class Pair:
    """One before/after pair of a case: the before run's prediction and range, and the
    speed-up the after run achieved over it."""

    predicted: Any
    span: list[float] | None
    achieved: float


def judge(pairs: list[Pair]) -> dict[str, Any]:
    """A case's figures over its pairs: the medians of the predictions, of the ranges' ends and
    of the achieved speed-ups (one pair: its own figures), and whether the achieved one came
    within 20% of the predicted one and inside the range (the point where no range was given)."""
    out: dict[str, Any] = {
        "achieved_speedup": round(statistics.median(p.achieved for p in pairs), 3)
    }
    if len(pairs) > 1:
        out["pairs"] = [{"predicted_speedup": p.predicted, "predicted_range": p.span,
                         "achieved_speedup": round(p.achieved, 3)} for p in pairs]  # fmt: skip
    told = [p for p in pairs if isinstance(p.predicted, (int, float))]
    if not told:
        return out
    predicted = round(statistics.median(p.predicted for p in told), 3)
    spans = [p.span or [p.predicted, p.predicted] for p in told]
    lo = round(statistics.median(s[0] for s in spans), 3)
    hi = round(statistics.median(s[1] for s in spans), 3)
    achieved = out["achieved_speedup"]
    ratio = predicted / achieved
    out.update(
        predicted_speedup=predicted,
        predicted_range=[lo, hi] if any(p.span for p in told) else None,
        predicted_over_achieved=round(ratio, 3),
        within_20pct=abs(ratio - 1.0) <= GOAL_RATIO,
        inside_range=lo <= achieved <= hi,
    )
    return out


def measured_against_job(case: Case, run: Run, final: dict[str, Any] | None) -> dict[str, Any]:
    """The final finding's figures against the job's own measure of its fault, where the case
    has one: a memory climb's rate per step (``evidence.per_rank[rank].bytes_per_step``) within
    20% of the slope of the rank's own resident set, with a time to full (``full_in_s``); a
    change's step (``evidence.step``) within 5% of the rank's steps of the first step it ran
    slow. Recorded beside the detection (``measure_holds``); not one of the four goals."""
    evidence = (final or {}).get("evidence") or {}
    out: dict[str, Any] = {}
    if case.kind == "memory_growth" and run.memory_rate is not None:
        own = run.memory_rate[0]
        row = (evidence.get("per_rank") or {}).get(str(case.ranks[0])) or {}
        got, full = row.get("bytes_per_step"), row.get("full_in_s")
        out["job_bytes_per_step"] = round(own)
        out["finding_bytes_per_step"] = got
        out["finding_seconds_to_full"] = full
        out["measure_holds"] = False
        if isinstance(got, (int, float)) and own > 0:
            err = got / own - 1.0
            out["rate_error"] = round(err, 3)
            out["measure_holds"] = abs(err) <= GOAL_RATE and isinstance(full, (int, float))
    if case.kind == "slowdown" and run.fault_step is not None:
        at, steps = run.fault_step
        got = evidence.get("step")
        out["job_fault_step"] = at
        out["job_steps"] = steps
        out["finding_step"] = got
        out["measure_holds"] = False
        if isinstance(got, int) and steps > 0:
            err = (got - at) / steps
            out["step_error"] = round(err, 4)
            out["measure_holds"] = abs(err) <= GOAL_STEP
    return out


def _run_record(r: Run) -> dict[str, Any]:
    out: dict[str, Any] = {
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "wall_s": r.wall_s,
        "rate_steps_per_s": r.rate,
        "fixes_said": r.fixes_said,
        "fault_step": r.fault_step,
        "memory_rate": r.memory_rate,
        "first_verdict_after_onset_s": (
            round(r.stream.first_verdict - r.onset, 2)
            if r.stream.first_verdict is not None and r.onset is not None
            else None
        ),
        "live_appearances": [
            {
                "finding": a.key,
                "severity": a.severity,
                "after_onset_s": None if r.onset is None else round(a.time - r.onset, 2),
                "after_start_s": round(a.time - r.started, 2),
            }
            for a in r.stream.appearances
        ],
        "final_findings": [
            {
                "kind": f.get("kind"),
                "ranks": f.get("ranks"),
                "severity": f.get("severity"),
                "predicted_speedup": f.get("predicted_speedup"),
            }
            for f in (r.report or {}).get("findings", [])
        ],
        "onset_after_start_s": None if r.onset is None else round(r.onset - r.started, 2),
        "first_verdict_after_start_s": (
            None if r.stream.first_verdict is None else round(r.stream.first_verdict - r.started, 2)
        ),
        "leftover_processes": leftovers(),
    }
    if r.exit_code != 0 or r.rate is None:
        out["log_tail"] = r.log_tail
    return out


# The shared Ray head's processes (this process's children; their own children, Ray's workers,
# are its too): never a run's leftovers.
_KEEP: set[int] = set()


def leftovers() -> list[str]:
    """What a run left behind below this process (:func:`_common.leftovers`), the shared Ray
    head's processes excepted: described, then ended by PID."""
    import psutil

    deadline = time.monotonic() + 5.0
    while True:
        c._reap_zombies()
        ray_tree = set(_KEEP)
        for pid in _KEEP:
            try:
                ray_tree.update(q.pid for q in psutil.Process(pid).children(recursive=True))
            except psutil.Error:
                pass
        procs = [p for p in c._children() if c._alive(p) and p.pid not in ray_tree]
        if not procs or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    found = [c.describe(p) for p in procs]
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    c._reap_zombies()
    return found


def start_ray() -> tuple[str | None, Any]:
    """One Ray head for every run (each ``auditor run`` joins it with ``--address``), as the
    e2e tests do: a run then pays no Ray start-up of its own."""
    import ray

    temp = tempfile.mkdtemp(prefix="rayf-", dir="/tmp")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=temp,
             _node_ip_address="127.0.0.1", namespace="auditor-bench")  # fmt: skip
    _KEEP.update(p.pid for p in c._children())
    return ray.get_runtime_context().gcs_address, (ray, temp)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    faults = [r for r in records if not r["control"]]
    controls = [r for r in records if r["control"]]
    found = [r for r in faults if r.get("found")]
    lat = [r["latency_s"] for r in found if r.get("latency_s") is not None]
    judged = [r for r in faults if "within_20pct" in r]
    measured = [r for r in faults if "measure_holds" in r]
    return {
        "found": len(found),
        "faults": len(faults),
        "false_alarms": sum(1 for r in controls if not r.get("ok")),
        "controls": len(controls),
        "advice_within_20pct": sum(1 for r in judged if r["within_20pct"]),
        "advice_judged": len(judged),
        "inside_range": sum(1 for r in judged if r.get("inside_range")),
        "median_detection_s": round(statistics.median(lat), 2) if lat else None,
        # Findings whose figures are checked against the job's own measure (a climb's rate, a
        # change's step): how many of them came close enough.
        "measures_hold": sum(1 for r in measured if r["measure_holds"]),
        "measured": len(measured),
        "not_judged": {r["case"]: r["not_judged"] for r in faults if r.get("not_judged")},
        "detection_s": c.summary(lat),
        "by_class": {r["class"]: ("found" if r.get("found") else "missed") for r in faults},
        "goals": {
            "all_found": len(found) == len(faults),
            "no_false_alarms": all(r.get("ok") for r in controls),
            "advice_within_20pct": bool(judged) and all(r["within_20pct"] for r in judged),
            "achieved_inside_range": bool(judged) and all(r.get("inside_range") for r in judged),
            "median_detection_within_3s": bool(lat) and statistics.median(lat) <= GOAL_LATENCY_S,
        },
    }


def table(records: list[dict[str, Any]]) -> str:
    rows = [f"{'case':22} {'class':28} {'result':9} {'ranks':6} {'detect':>7} "
            f"{'pred':>6} {'range':>9} {'achieved':>8} {'p/a':>6} {'in':>3}  advice"]  # fmt: skip

    def num(r: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str:
        v = r.get(key)
        return fmt.format(v) if isinstance(v, (int, float)) else "-"

    for r in records:
        if r["control"]:
            result = "clean" if r.get("ok") else "ALARM"
            ranks = "-"
        else:
            result = "found" if r.get("found") else "MISSED"
            ranks = ",".join(map(str, r["expected"]["ranks"]))
        rows.append(
            f"{r['case']:22} {r['class'][:28]:28} {result:9} {ranks:6} "
            f"{num(r, 'latency_s', '{:.1f}s'):>7} {num(r, 'predicted_speedup'):>6} "
            f"{_span(r.get('predicted_range')):>9} "
            f"{num(r, 'achieved_speedup'):>8} {num(r, 'predicted_over_achieved'):>6} "
            f"{_yes(r.get('inside_range')):>3}  "
            f"{r.get('advice', '')[:60]}"
        )
        if r["control"] and r.get("false_alarms"):
            rows.append(f"{'':22}   false alarms: {', '.join(r['false_alarms'][:4])}")
        elif not r["control"] and not r.get("found") and r.get("other_live_findings"):
            rows.append(f"{'':22}   seen instead: {', '.join(r['other_live_findings'][:4])}")
        notes = [n for n in (_measure_note(r), _judged_note(r)) if n]
        if notes:
            rows.append(f"{'':22}   {'; '.join(notes)}")
    return "\n".join(rows)


def _span(span: Any) -> str:
    return f"{span[0]:.2f}-{span[1]:.2f}" if isinstance(span, list) and len(span) == 2 else "-"


def _yes(inside: Any) -> str:
    return "-" if inside is None else ("yes" if inside else "no")


def _measure_note(r: dict[str, Any]) -> str:
    """The finding's figure against the job's own measure, in a few words."""
    if "job_bytes_per_step" in r:
        got, full = r.get("finding_bytes_per_step"), r.get("finding_seconds_to_full")
        err = r.get("rate_error")
        return (
            f"rate {'-' if got is None else f'{got / 2**20:.2f}'} MiB/step against the job's "
            f"{r['job_bytes_per_step'] / 2**20:.2f}"
            + ("" if err is None else f" ({err * 100:+.0f}%)")
            + f", full in {'-' if full is None else f'{full:.0f} s'}"
        )
    if "job_fault_step" in r:
        got, err = r.get("finding_step"), r.get("step_error")
        return f"step {'-' if got is None else got} against the job's {r['job_fault_step']}" + (
            "" if err is None else f" ({err * 100:+.1f}% of its steps)"
        )
    return ""


def _judged_note(r: dict[str, Any]) -> str:
    if not r.get("not_judged") or r["control"]:
        return ""
    still = r.get("after_still_found")
    after = "" if still is None else "; after the fix: " + ("still found" if still else "gone")
    return f"advice not judged: {r['not_judged']}{after}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 cases, to try changes")
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--seconds", type=float, default=22.0, help="training seconds per run")
    ap.add_argument("--fault-after", type=float, default=10.0, help="seconds before the fault")
    ap.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="alternated before/after runs of each "
        "case whose finding predicts a speed-up; its figures are the pairs' medians",
    )
    ap.add_argument("--keep", metavar="DIR", help="keep each case's logs, event streams and "
                    "reports in a folder under DIR (default: deleted)")  # fmt: skip
    ap.add_argument("--ray", choices=("none", "shared", "embedded"), default="none",
                    help="the node agent: in each run's own process (--no-ray, the default: "
                    "no Ray start-up or teardown in a run's time on 2 cores), on one Ray head "
                    "shared by every run (--address), or on each run's embedded Ray")  # fmt: skip
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    if args.seconds <= args.fault_after + 5:
        ap.error("--seconds must leave at least 5 s of fault after --fault-after")
    cases = [k for k in CASES if k.quick] if args.quick else list(CASES)
    if args.cases:
        names = set(args.cases.split(","))
        unknown = names - {k.name for k in CASES}
        if unknown:
            ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
        cases = [k for k in CASES if k.name in names]
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    c.become_subreaper()
    kinds = known_kinds()
    apply = has_apply()
    address, ray_handle = start_ray() if args.ray == "shared" else (None, None)
    ray_args = ["--no-ray"] if args.ray == "none" else []
    started = time.time()
    records: list[dict[str, Any]] = []
    try:
        for i, case in enumerate(cases):
            rec = run_case(case, args, address, apply, ray_args)
            if case.kind and case.kind not in kinds:
                rec["note"] = f"no rule of kind {case.kind} in this tree"
            records.append(rec)
            state = ("clean" if rec.get("ok") else "ALARM") if case.control else (
                f"found in {rec['latency_s']} s" if rec.get("found") else "MISSED")  # fmt: skip
            speeds = (
                ""
                if case.control
                else f", predicted {_times(rec.get('predicted_speedup'))}, "
                f"achieved {_times(rec.get('achieved_speedup'))}"
            )
            print(f"[{i + 1}/{len(cases)}] {case.name}: {state}{speeds}", flush=True)
    finally:
        if ray_handle is not None:
            ray, temp = ray_handle
            ray.shutdown()
            shutil.rmtree(temp, ignore_errors=True)
    s = summarize(records)
    payload = {
        "what": "injected faults: found (kind and ranks) in the live stream, seconds from onset, "
        "advice applied and the job re-run: achieved speed-up against predicted",
        "settings": {
            "quick": args.quick,
            "seconds": args.seconds,
            "fault_after": args.fault_after,
            "pairs": args.pairs,
            "live_interval": LIVE_INTERVAL_S,
            "window": "default",
            "apply_available": apply,
            "ray": args.ray,
            "rule_kinds": kinds,
        },
        "goals": {
            "max_predicted_over_achieved_error": GOAL_RATIO,
            "max_median_detection_s": GOAL_LATENCY_S,
        },
        "summary": s,
        "total_s": round(time.time() - started, 1),
        "load_avg_after": c.loadavg(),
        "cases": records,
    }
    # A subset of cases never replaces the whole run's or the quick run's results.
    name = "faults_cases" if args.cases else "faults_quick" if args.quick else "faults"
    path = c.write_result(name, payload)
    print()
    print(table(records))
    print(f"\n  results: {c.shown(path)} ({payload['total_s']:.0f} s)")
    print(last_line(s))
    return 0


def _times(v: object) -> str:
    return f"{v}x" if isinstance(v, (int, float)) else "-"


def last_line(s: dict[str, Any]) -> str:
    med = s["median_detection_s"]
    return (
        f"faults: found {s['found']}/{s['faults']}, false alarms {s['false_alarms']}/"
        f"{s['controls']}, advice within 20%: {s['advice_within_20pct']}/{s['advice_judged']}, "
        f"inside range: {s.get('inside_range', 0)}/{s['advice_judged']}, "
        f"median detection {'-' if med is None else f'{med:.1f}'} s"
    )


if __name__ == "__main__":
    sys.exit(main())
