"""Every GPU path of the auditor, checked on a real GPU in one run of a few minutes.

    python bench/gpu_validate.py [--dry-run] [--only NAME[,NAME...]] [--record-dir DIR]

Eight groups of checks, one line each (``holds`` / ``falls short``, with the figure):

1. ``nvml``: every field of every GPU present, or missing with NVML's reason; values sane; the
   cost of one ``sample()``; a 20 s recording of a real CUDA training job (``gpu_jobs.py
   train``), written to ``tests/data/<gpu>_live/nvml_recording.jsonl``.
2. ``phases``: the probe's CUDA-event phase timings (H2D, forward, backward, optimizer) against
   the same steps timed between ``torch.cuda.synchronize()`` calls, each within 10% or 0.5 ms;
   the phases of a step add up to no more than the step; no synchronisation added (CUDA's sync
   debug mode); the probe's cost per step side by side with the bare loop, within 0.5%.
3. ``verdict``: two ranks on the one GPU under ``auditor run --no-ray -- torchrun
   --nproc_per_node=2``: rank 1 starved (data_starvation on rank 1, advice names ``num_workers``
   and ``pin_memory``), rank 1 slow in its forward on the device (compute_straggler on rank 1, no
   data_starvation, rank 0 never blamed), balanced (no warning); both ranks mapped to GPU 0 and
   no GPU rule reading the shared GPU as imbalanced. Each run is recorded with ``--record`` into
   the record dir (real GPU fixtures the replay tests read).
4. ``memory``: the probe's budget (parameters, gradients, Adam's state) against the exact bytes;
   activations per sample x batch against ``max_memory_allocated()`` less the fixed part, within
   15%; the headroom finding's largest batch run for real: it fits.
5. ``sampling``: the GPU monitor's sampling loop at 1 s in this process, CPU per GPU (the
   sampling thread's own CPU time) beside the recorded source.
6. ``over_time``: the verdict job judged over its run, two ranks on the one GPU: balanced after
   a start-up as long as its training, each rank holding 1 GiB on the device meanwhile (no
   idle_device, no warning); rank 1 keeping every step's loss with its graph (memory_growth on
   rank 1, its rate per step within 20% of the slope the rank measures itself with
   ``torch.cuda.memory_allocated()``, a time to full given, no larger batch advised to it);
   rank 1 turning slow in its forward halfway (slowdown on rank 1, at the step it turned slow
   within 5% of its steps).

7. ``mfu``: a matmul job of known FLOPs (``gpu_jobs.py matmul``) under ``auditor run``, in bf16
   (autocast) and in fp32 with TF32 off: the FLOPs the probe counted within 2% of the exact
   count, all in the job's dtype; each rank's MFU its FLOP/s over the peak table's figure for
   the card and dtype (within 1%); the bf16 job's FLOP/s at least 3x the fp32 one's, the fp32
   job's report booking half or more of its steps' time to precision (what bf16 would give back)
   with a ``low_mfu`` finding. (Its MFU against the fp32 peak is the card's fp32 matmul
   efficiency, near the bf16 job's: MFU is judged at the peak of the dtype the FLOPs ran in.)
   And the bf16 job half-starved (each batch read for as long as two steps compute: the read
   overlaps the step the device still runs): its MFU 0.3-0.7 of the fed job's, the data wait
   the largest part of its steps' gap and 30% or more of the steps' time.

8. ``ray``: the verdict job balanced, two ranks on the one GPU, under ``auditor run`` on its
   embedded Ray (no ``--no-ray``) with the real NVML source; meanwhile a watcher in a process
   of its own (``--ray-look PID``) joins that Ray and reads the GPU monitors: Ray's actor table
   (class, name, required resources, process) and each monitor's ``info()`` twice, 4 s apart.
   (a) GPU 0's samples, with its UUID, over the run, from a ``GpuMonitor`` actor of that UUID
   on the run's Ray node; (b) the actor requires no GPU and no CPU, and both ranks still run on
   GPU 0; (c) the sampling thread's CPU per wall second per GPU, and the actor process's (figures).
   Without Ray here: one line, ``ray: no Ray here`` (``bench/ray_bundle.py`` makes a trimmed
   Ray to carry to a machine without one).

Writes ``bench/results/gpu_validate.json`` (``BENCH_RESULTS_DIR`` to write elsewhere): the
device's name and driver, and ``checks``: ``[{"name", "holds", "figure"}]``. Exit status: 0 when
every check holds, 1 when one falls short, 2 when there is no GPU and no ``--dry-run``.

``--dry-run`` runs the same plan on the CPU with the recorded NVML source (the fixture
``tests/data/balanced_4gpu``) and writes its recordings to a temporary folder: it proves the
script, not the GPU. The timing checks are figures there (a CPU has no device clock to check),
the verdict and memory checks hold as they do on a GPU.

The device machine has torch but no Ray: every group but ``ray`` runs with ``--no-ray`` and the
node agent in-process; only the ``ray`` group's watcher imports Ray.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
import psutil

from auditor.cluster.intake import RankIntake
from auditor.cluster.monitor import GpuMonitorCore
from auditor.cluster.probing import probe_env
from auditor.samples import Batch, DeviceSample, MemoryBudget, StepSample
from auditor.telemetry.nvml import SLOW_EVERY_S
from auditor.telemetry.recorded import RecordingWriter, read_recording
from auditor.telemetry.sources import DeviceSource, RecordedDeviceSource, make_source

JOBS = os.path.join(c.BENCH_DIR, "gpu_jobs.py")
DRY_SOURCE = os.path.join(c.REPO, "tests", "data", "balanced_4gpu", "recording.jsonl")

# Tolerances the issue sets.
PHASE_REL, PHASE_ABS_S = 0.10, 0.0005  # each phase within 10% or 0.5 ms of the reference
PROBE_COST_MAX = 0.005  # the probe's cost per step within 0.5% of the step
PAIRS = 3  # bare/probed pairs of the phase job for that cost
ADD_UP_MAX = 1.02  # the phases of a step add up to at most the step (2% for clock rounding)
ACTIVATION_REL = 0.15  # activations x batch within 15% of the allocator's peak less the fixed part
GPU_KINDS = ("utilization_imbalance", "hardware_straggler", "idle_device", "memory_imbalance")
RATE_REL = 0.20  # a memory climb's rate within 20% of the rank's own measure
STEP_REL = 0.05  # a change placed within 5% of the rank's steps of the step it turned slow
STARTUP_SHARE = 0.4  # the start-up job's start-up, at least this share of its run (about half)
FLOPS_REL = 0.02  # counted FLOPs within 2% of the exact count
PRECISION_RATIO = 3.0  # the bf16 matmul job's FLOP/s at least this many times the fp32 one's

# DeviceSample fields that come from NVML reads (identity and time excluded), and the NVML
# function behind each (what a "missing" report names).
VALUE_FIELDS = tuple(
    f.name
    for f in fields(DeviceSample)
    if f.name not in ("node", "index", "uuid", "time", "model", "lost", "processes")
)
FIELD_FUNCTIONS = {
    "gpu_util": "nvmlDeviceGetUtilizationRates",
    "mem_util": "nvmlDeviceGetUtilizationRates",
    "mem_used_bytes": "nvmlDeviceGetMemoryInfo",
    "mem_total_bytes": "nvmlDeviceGetMemoryInfo",
    "sm_clock_mhz": "nvmlDeviceGetClockInfo",
    "sm_clock_max_mhz": "nvmlDeviceGetMaxClockInfo",
    "mem_clock_mhz": "nvmlDeviceGetClockInfo",
    "mem_clock_max_mhz": "nvmlDeviceGetMaxClockInfo",
    "throttle_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "power_w": "nvmlDeviceGetPowerUsage",
    "power_limit_w": "nvmlDeviceGetEnforcedPowerLimit",
    "temperature_c": "nvmlDeviceGetTemperature",
    "pcie_gen": "nvmlDeviceGetCurrPcieLinkGeneration",
    "pcie_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
    "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
    "pcie_width_max": "nvmlDeviceGetMaxPcieLinkWidth",
}


@dataclass
class Check:
    name: str
    holds: bool
    figure: str
    detail: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{'holds      ' if self.holds else 'falls short'}  {self.name}: {self.figure}"


@dataclass
class Plan:
    dry_run: bool
    source_spec: str  # nvml, or recorded:PATH on a dry run
    record_dir: Path
    workdir: Path
    env: dict[str, str]
    seconds: float  # each verdict job's training time
    steps: int  # each phase arm's steps
    profile: bool = False
    device: dict[str, Any] = field(default_factory=dict)


# -- 1. NVML -------------------------------------------------------------------------------------


def sanity(s: DeviceSample) -> list[str]:
    """Values that cannot be right (missing values are not problems)."""
    if s.lost:
        return ["GPU is lost"]
    out: list[str] = []
    for name in ("gpu_util", "mem_util"):
        v = getattr(s, name)
        if v is not None and not 0.0 <= v <= 1.0:
            out.append(f"{name}={v} outside 0..1")
    for cur, top in (
        ("mem_used_bytes", "mem_total_bytes"),
        ("sm_clock_mhz", "sm_clock_max_mhz"),
        ("mem_clock_mhz", "mem_clock_max_mhz"),
        ("pcie_gen", "pcie_gen_max"),
        ("pcie_width", "pcie_width_max"),
    ):
        a, b = getattr(s, cur), getattr(s, top)
        if a is not None and b is not None and a > b:
            out.append(f"{cur}={a} > {top}={b}")
    if s.mem_total_bytes is not None and s.mem_total_bytes <= 0:
        out.append(f"mem_total_bytes={s.mem_total_bytes}")
    for name in ("power_w", "power_limit_w"):
        v = getattr(s, name)
        if v is not None and v <= 0:
            out.append(f"{name}={v} not positive")
    if s.temperature_c is not None and not 0 < s.temperature_c < 130:
        out.append(f"temperature_c={s.temperature_c} implausible")
    return out


def read_fields(source: DeviceSource, uuid: str, reads: int) -> dict[str, Any]:
    """One GPU's fields (present with value, or missing with NVML's reason) and a read's cost."""
    s = source.sample(uuid)
    nvml = getattr(source, "nvml", None)
    reasons = nvml.missing() if nvml is not None else {}
    costs: list[float] = []
    for _ in range(reads):
        t = time.perf_counter()
        source.sample(uuid)
        costs.append(time.perf_counter() - t)
    costs.sort()
    return {
        "uuid": uuid,
        "model": s.model,
        "present": {
            k: (list(v) if isinstance(v, tuple) else v)
            for k in VALUE_FIELDS
            if (v := getattr(s, k)) is not None
        },
        "missing": {
            k: reasons.get(FIELD_FUNCTIONS[k], "not in the recording" if nvml is None else "?")
            for k in VALUE_FIELDS
            if getattr(s, k) is None
        },
        "problems": sanity(s),
        "sample_ms": {
            "median": round(statistics.median(costs) * 1e3, 4),
            "p95": round(costs[round(0.95 * (len(costs) - 1))] * 1e3, 4),
        },
        "calls_ms": call_costs(source, uuid, 30),
    }


def call_costs(source: DeviceSource, uuid: str, reads: int) -> dict[str, float]:
    """Mean ms of each NVML call of a full read (every field asked, maxima included), dearest
    first: what the steady read's cadence (auditor.telemetry.nvml.SLOW_FUNCTIONS) saves."""
    nvml = getattr(source, "nvml", None)
    if nvml is None or not hasattr(nvml, "costs"):
        return {}
    before = nvml.costs()
    for _ in range(reads):
        # A new source knows nothing yet: its first read asks NVML for every field.
        fresh = type(source)(getattr(source, "node", ""), nvml=nvml)
        try:
            fresh.sample(uuid)
        finally:
            fresh.close()
    after = nvml.costs()
    mean = {
        fn: (after[fn][1] - before.get(fn, (0, 0.0))[1]) / n * 1e3
        for fn in after
        if (n := after[fn][0] - before.get(fn, (0, 0.0))[0]) > 0
    }
    return {fn: round(ms, 4) for fn, ms in sorted(mean.items(), key=lambda kv: -kv[1])}


def record_job(plan: Plan, source: DeviceSource, path: Path, seconds: float) -> dict[str, Any]:
    """Sample every GPU once a second while a CUDA training job runs (2 s idle either side)."""
    idents = source.devices()
    writer = RecordingWriter(
        path,
        job="gpu_train",
        meta={
            "source": "bench/gpu_validate.py (nvml)",
            "device": plan.device,
            "train": f"bench/gpu_jobs.py train --seconds {seconds:g}",
            "interval_s": 1.0,
        },
    )
    proc: subprocess.Popen[str] | None = None
    ended: float | None = None
    seen_pid = False
    peak_util = 0.0
    ticks, t0 = 0, time.time()
    try:
        while True:
            now = time.time()
            if proc is None and now - t0 >= 2.0:
                proc = subprocess.Popen(
                    [sys.executable, JOBS, "train", "--seconds", str(seconds)],
                    env=plan.env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            if proc is not None and ended is None and proc.poll() is not None:
                ended = now
            if ended is not None and now - ended >= 2.0:
                break
            samples = tuple(source.sample(i.uuid) for i in idents)
            writer.write(Batch(devices=samples))
            ticks += 1
            for s in samples:
                peak_util = max(peak_util, s.gpu_util or 0.0)
                seen_pid |= proc is not None and any(p.pid == proc.pid for p in s.processes)
            time.sleep(max(0.0, t0 + ticks - time.time()))
    finally:
        writer.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
    assert proc is not None
    out = proc.communicate(timeout=30)[0]
    return {
        "path": str(path),
        "ticks": ticks,
        "returncode": proc.returncode,
        "output": out.strip()[-300:],
        "peak_gpu_util": peak_util,
        "job_pid_in_processes": seen_pid,
    }


def check_nvml(plan: Plan) -> list[Check]:
    source = make_source(plan.source_spec, socket.gethostname())
    try:
        idents = source.devices()
        gpus = [read_fields(source, i.uuid, 200) for i in idents]
        driver = source.driver_info() if hasattr(source, "driver_info") else {}
        plan.device.setdefault("driver", driver)
        rec = record_job(plan, source, plan.record_dir / "nvml_recording.jsonl", plan.seconds)
    finally:
        close = getattr(source, "close", None)
        if close:
            close()
    problems = {g["uuid"]: g["problems"] for g in gpus if g["problems"]}
    present = sum(len(g["present"]) for g in gpus)
    missing = {k: v for g in gpus for k, v in g["missing"].items()}
    cost = max((g["sample_ms"]["median"] for g in gpus), default=None)
    replay = read_recording(rec["path"])
    replayed = RecordedDeviceSource(
        replay, replay.batch.devices[0].node if replay.batch.devices else ""
    )
    busy = rec["returncode"] == 0 and (plan.dry_run or rec["peak_gpu_util"] > 0.5)
    return [
        Check(
            "nvml.fields",
            bool(gpus) and not problems,
            f"{len(gpus)} GPU(s), {present} fields present, "
            + (f"missing {sorted(missing)}" if missing else "none missing")
            + (f"; problems {problems}" if problems else ""),
            {"gpus": gpus, "driver": driver},
        ),
        Check(
            "nvml.sample_cost",
            cost is not None,
            f"one sample() {cost} ms median (the slowest GPU; the slow fields every "
            f"{SLOW_EVERY_S:g} s); a full read's dearest calls: "
            + (
                ", ".join(f"{fn} {ms} ms" for fn, ms in list(gpus[0]["calls_ms"].items())[:4])
                if gpus and gpus[0]["calls_ms"]
                else "not measured (no NVML calls on a recorded source)"
            ),
            {"calls_ms": {g["uuid"]: g["calls_ms"] for g in gpus}},
        ),
        Check(
            "nvml.recording",
            busy and len(replayed.devices()) == len(idents) and rec["ticks"] >= plan.seconds,
            f"{rec['ticks']} ticks over a {plan.seconds:g} s job, peak utilisation "
            f"{rec['peak_gpu_util']:.0%}, job PID seen by NVML: {rec['job_pid_in_processes']}",
            rec,
        ),
    ]


# -- 2. phases on the device ----------------------------------------------------------------------


def _phase_arm(plan: Plan, arm: str, env: dict[str, str], profile: bool = False) -> dict[str, Any]:
    out = plan.workdir / f"phases_{arm}_{time.monotonic_ns()}.json"
    cmd = [sys.executable, JOBS, "phases", "--arm", arm, "--steps", str(plan.steps)]
    subprocess.run(
        [*cmd, "--out", str(out), *(["--profile"] if profile else [])],
        env=env,
        check=True,
        timeout=300,
    )
    return dict(json.loads(out.read_text()))


def _drain(
    intake: RankIntake, timeout_s: float = 15.0
) -> tuple[list[StepSample], list[MemoryBudget]]:
    """Everything the last probed process sent, until its connection closed."""
    steps: list[StepSample] = []
    budgets: list[MemoryBudget] = []
    deadline = time.monotonic() + timeout_s
    while True:
        got = intake.drain()
        steps += got.steps
        budgets += got.memory
        if got.ended or time.monotonic() > deadline:
            return steps, budgets
        time.sleep(0.05)


def check_phases(plan: Plan) -> list[Check]:
    sink = str(plan.workdir / "phases.sock")
    intake = RankIntake(sink)
    intake.start()
    probed = probe_env(plan.env, sink=sink, job="gpu_phases")
    try:
        if plan.profile:  # where the probe's time goes on this device (printed, not judged)
            _phase_arm(plan, "probe", probed, profile=True)
            _drain(intake)
        reference = _phase_arm(plan, "sync", plan.env)
        pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
        samples: list[StepSample] = []
        for i in range(PAIRS):  # alternated pairs, order swapped: drift hits both arms
            if i % 2 == 0:
                bare = _phase_arm(plan, "plain", plan.env)
                probe = _phase_arm(plan, "probe", probed)
            else:
                probe = _phase_arm(plan, "probe", probed)
                bare = _phase_arm(plan, "plain", plan.env)
            got, _ = _drain(intake)
            samples = got or samples
            pairs.append((bare, probe))
    finally:
        intake.stop()
    checks: list[Check] = []
    steady = sorted(samples, key=lambda s: s.step)[len(samples) // 5 :]
    ref = reference["reference_s"]
    got_s = {
        "h2d": [s.h2d_s for s in steady],
        "forward": [s.forward_s for s in steady],
        "backward": [s.backward_s for s in steady],
        "optimizer": [s.optimizer_s for s in steady],
    }
    for name, ref_s in ref.items():
        vals = [v for v in got_s[name] if v is not None]
        med = statistics.median(vals) if vals else None
        ok = med is not None and abs(med - ref_s) <= max(PHASE_REL * ref_s, PHASE_ABS_S)
        checks.append(
            Check(
                f"phases.{name}",
                ok or plan.dry_run,
                f"probe {_ms(med)} against synchronised {_ms(ref_s)}"
                + (f" ({(med / ref_s - 1) * 100:+.1f}%)" if med and ref_s else ""),
                {"probe_s": med, "reference_s": ref_s, "steps": len(vals)},
            )
        )
    # Every instant of a step is booked once: data wait (host clock) + device-timed phases +
    # collective wait never exceed the step.
    ratios = sorted(
        (s.data_wait_s + s.h2d_s + s.forward_s + s.backward_s + s.optimizer_s
         + (s.collective_wait_s or 0.0)) / s.step_s
        for s in steady
        if s.step_s > 0
    )  # fmt: skip
    p95 = ratios[round(0.95 * (len(ratios) - 1))] if ratios else None
    checks.append(
        Check(
            "phases.add_up",
            p95 is not None and (p95 <= ADD_UP_MAX or plan.dry_run),
            f"phases / step: median {statistics.median(ratios):.3f}, p95 {p95:.3f} "
            f"over {len(ratios)} steps"
            if ratios
            else "no steps received",
            {"median": statistics.median(ratios) if ratios else None, "p95": p95},
        )
    )
    syncs = [p["syncs"] - b["syncs"] for b, p in pairs]
    checks.append(
        Check(
            "phases.no_sync",
            all(n <= 0 for n in syncs),
            f"synchronisations the probe added per run: {syncs} (CUDA sync debug mode)"
            if not plan.dry_run
            else "no device to synchronise on the CPU",
        )
    )
    costs = [p["step_s_median"] / b["step_s_median"] - 1 for b, p in pairs]
    cost = statistics.median(costs)
    bare_ms = statistics.median(b["step_s_median"] for b, _ in pairs) * 1e3
    checks.append(
        Check(
            "phases.probe_cost",
            cost <= PROBE_COST_MAX or plan.dry_run,
            f"probe {cost * 100:+.2f}% of a {bare_ms:.2f} ms step (pairs: "
            + ", ".join(f"{x * 100:+.2f}%" for x in costs)
            + ")",
            {"pairs": [{"bare": b, "probe": p} for b, p in pairs]},
        )
    )
    return checks


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v * 1e3:.2f} ms"


# -- 3. verdicts on the GPU -----------------------------------------------------------------------


def audited(
    plan: Plan,
    name: str,
    command: Sequence[str],
    *,
    ray: bool = False,
    watch: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], Path]:
    """``auditor run --no-ray`` around ``command`` (with ``ray``: on its embedded Ray): its JSON
    report and its recording. ``watch`` is called in a thread with the auditor's PID while it
    runs (it is waited for before this returns)."""
    report = plan.workdir / f"{name}.report.json"
    record = plan.record_dir / f"{name}.jsonl"
    log = plan.workdir / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "auditor", "run", *([] if ray else ["--no-ray"]), "--quiet",
             "--device-source", plan.source_spec, "--report", str(report), "--record",
             str(record), "--job", name, "--", *command],
            env=plan.env, cwd=c.REPO, stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        watcher = threading.Thread(target=watch, args=(proc.pid,), daemon=True) if watch else None
        if watcher is not None:
            watcher.start()
        try:
            rc = proc.wait(timeout=plan.seconds * 3 + 90)
        except subprocess.TimeoutExpired:
            c.stop_tree(proc, grace_s=5)  # the auditor, torchrun and the ranks: nothing left
            rc = None
        if watcher is not None:
            watcher.join(timeout=60)
    if rc is None or not report.exists():
        print(c.tail(str(log), 3000), file=sys.stderr)
        raise RuntimeError(f"{name}: auditor run exited {rc} (its output above)")
    doc = json.loads(report.read_text())
    if rc != 0:
        # The verdict stands (it judged the steps the job ran); the exit is said, not hidden.
        tail = c.tail(str(log), 600)
        print(f"gpu_validate: {name}: the job exited {rc}: {tail}", file=sys.stderr)
        doc.setdefault("notes", []).append(f"the job exited {rc}")
    return doc, record


def _blamed(
    report: dict[str, Any], *, severities: tuple[str, ...] = ("warning", "critical")
) -> dict[str, list[int]]:
    return {
        f["kind"]: sorted(f["ranks"]) for f in report["findings"] if f["severity"] in severities
    }


def _gpu_map(record: Path) -> dict[int, tuple[str, ...]]:
    infos = read_recording(record).batch.infos
    return {i.rank: i.device_uuids for i in infos}


def check_verdicts(plan: Plan) -> list[Check]:
    job = [
        c.tool("torchrun"),
        "--standalone",
        "--nproc_per_node=2",
        JOBS,
        "verdict",
        "--seconds",
        f"{plan.seconds:g}",
    ]
    runs = {
        f: audited(plan, f"verdict_{f}", [*job, "--fault", f])
        for f in ("starve", "forward", "none")
    }
    checks: list[Check] = []

    starve, _ = runs["starve"]
    blamed = _blamed(starve)
    fixes = next((f["fixes"] for f in starve["findings"] if f["kind"] == "data_starvation"), {})
    fix = str(fixes.get("1", ""))
    advice = "num_workers" in fix and ("pin_memory" in fix or plan.dry_run)
    checks.append(
        Check(
            "verdict.starved",
            blamed.get("data_starvation") == [1] and advice and 0 not in _ranks(blamed),
            f"blamed {blamed}; rank 1's fix: {fix!r}",
            {"findings": starve["findings"]},
        )
    )
    slow, _ = runs["forward"]
    blamed = _blamed(slow)
    checks.append(
        Check(
            "verdict.forward_straggler",
            blamed.get("compute_straggler") == [1]
            and "data_starvation" not in blamed
            and 0 not in _ranks(blamed),
            f"blamed {blamed}; "
            + ", ".join(
                f"rank {r['rank']} forward {_ms(r['forward_s'])} wait {_ms(r['collective_wait_s'])}"
                for r in slow["ranks"]
            ),
            {"findings": slow["findings"], "ranks": slow["ranks"]},
        )
    )
    even, _ = runs["none"]
    blamed = _blamed(even)
    checks.append(
        Check(
            "verdict.balanced",
            not blamed,
            f"warnings: {blamed or 'none'}; step "
            + ", ".join(f"rank {r['rank']} {_ms(r['step_s'])}" for r in even["ranks"]),
            {"findings": even["findings"]},
        )
    )
    maps = {f: _gpu_map(rec) for f, (_, rec) in runs.items()}
    gpu_blame = {
        f: {
            k: v
            for k, v in _blamed(r, severities=("info", "warning", "critical")).items()
            if k in GPU_KINDS
        }
        for f, (r, _) in runs.items()
    }
    shared = all(
        len(m) == 2 and len({u for us in m.values() for u in us}) == 1 for m in maps.values()
    )
    # A fault on rank 1 may make rank 1's own share low (its finding); the shared GPU itself
    # must never make the balanced job imbalanced, nor blame rank 0.
    gpu_ok = not gpu_blame["none"] and 0 not in {r for b in gpu_blame.values() for r in _ranks(b)}
    checks.append(
        Check(
            "verdict.shared_gpu",
            (shared or plan.dry_run) and gpu_ok,
            f"rank -> GPU {maps['none']}; GPU findings: "
            + (
                str({k: v for k, v in gpu_blame.items() if v})
                if any(gpu_blame.values())
                else "none"
            ),
            {"maps": {f: {str(k): list(v) for k, v in m.items()} for f, m in maps.items()}},
        )
    )
    return checks


def _ranks(blamed: dict[str, list[int]]) -> set[int]:
    return {r for ranks in blamed.values() for r in ranks}


# -- 4. memory on the device ----------------------------------------------------------------------


def _memory_job(plan: Plan, batch: int, steps: int) -> dict[str, Any]:
    out = plan.workdir / f"memory_{batch}.json"
    cmd = [sys.executable, JOBS, "memory", "--batch", str(batch), "--steps", str(steps)]
    subprocess.run([*cmd, "--out", str(out)], env=plan.env, check=True, timeout=300)
    return dict(json.loads(out.read_text()))


def check_memory(plan: Plan) -> list[Check]:
    batch = 16384 if not plan.dry_run else 256
    exact_out = plan.workdir / "memory_probed.json"
    report, _ = audited(
        plan,
        "memory",
        [
            sys.executable,
            JOBS,
            "memory",
            "--batch",
            str(batch),
            "--steps",
            "15",
            "--out",
            str(exact_out),
        ],
    )
    exact = json.loads(exact_out.read_text())
    budget = (report["ranks"][0]["memory"] or {}).get("budget") or {}
    checks: list[Check] = []
    parts = [(k, budget.get(k), exact[k]) for k in ("param_bytes", "grad_bytes", "optimizer_bytes")]
    kinds = budget.get("optimizer_bytes_by_kind"), exact["optimizer_bytes_by_kind"]
    checks.append(
        Check(
            "memory.fixed_part",
            all(got == want for _, got, want in parts) and kinds[0] == kinds[1],
            ", ".join(
                f"{k.split('_')[0]} {_mib(got)} (exact {_mib(want)})" for k, got, want in parts
            )
            + f"; optimizer by kind {kinds[0]} (exact {kinds[1]})",
        )
    )
    per_sample = budget.get("activation_bytes_per_sample")
    peak = exact["peak_bytes"]
    fixed = sum(want for _, _, want in parts)
    if per_sample is not None and peak is not None:
        act, measured = per_sample * batch, peak - fixed
        err = act / measured - 1
        checks.append(
            Check(
                "memory.activations",
                abs(err) <= ACTIVATION_REL,
                f"{_mib(per_sample)}/sample x {batch} = {_mib(act)} against peak {_mib(peak)} "
                f"less fixed {_mib(fixed)} = {_mib(measured)} ({err * 100:+.1f}%)",
            )
        )
    else:
        checks.append(
            Check(
                "memory.activations",
                plan.dry_run and per_sample is not None,
                f"{_mib(per_sample)}/sample x {batch}"
                + ("; no device allocator peak on the CPU" if peak is None else ""),
            )
        )
    headroom = next((f for f in report["findings"] if f["kind"] == "memory_headroom"), None)
    row = ((headroom or {}).get("evidence") or {}).get("per_rank", {}).get("0", {})
    largest = row.get("largest_batch")
    if largest is None or plan.dry_run:
        checks.append(
            Check(
                "memory.headroom_fits",
                plan.dry_run and headroom is not None,
                f"largest batch {largest} (not run on the CPU)"
                if headroom
                else "no headroom finding",
            )
        )
        return checks
    try:
        ran = _memory_job(plan, int(largest), 2)
        total = ran["device_total_bytes"]
        checks.append(
            Check(
                "memory.headroom_fits",
                ran["peak_bytes"] <= total,
                f"advised batch {largest} ran: peak {_mib(ran['peak_bytes'])} of {_mib(total)} "
                f"({ran['peak_bytes'] / total:.0%}); the batch was {batch}",
                ran,
            )
        )
    except subprocess.CalledProcessError as exc:
        checks.append(
            Check("memory.headroom_fits", False, f"advised batch {largest} failed: {exc}")
        )
    return checks


def _mib(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v / 2**20:.1f} MiB" if abs(v) >= 2**20 else f"{v / 2**10:.1f} KiB"


# -- 5. the sampling loop's cost -------------------------------------------------------------------


def _thread_cpu(native_id: int) -> float:
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def check_sampling(plan: Plan, seconds: float = 10.0) -> list[Check]:
    node = socket.gethostname()
    live = make_source(plan.source_spec, node)
    fixture = read_recording(DRY_SOURCE)
    recorded = RecordedDeviceSource(fixture, fixture.batch.devices[0].node)
    arms: dict[str, list[GpuMonitorCore]] = {
        "live": [GpuMonitorCore(node=node, uuid=i.uuid, source=live) for i in live.devices()],
        "recorded": [
            GpuMonitorCore(node=node, uuid=i.uuid, source=recorded) for i in recorded.devices()
        ],
    }
    threads = {k: [m._thread.native_id for m in ms] for k, ms in arms.items()}
    start = {k: [_thread_cpu(t or 0) for t in ts] for k, ts in threads.items()}
    time.sleep(seconds)
    pct = {
        k: statistics.median(
            (_thread_cpu(t or 0) - s) / seconds * 100 for t, s in zip(ts, start[k], strict=True)
        )
        for k, ts in threads.items()
    }
    samples = {k: statistics.median(m.info()["samples"] for m in ms) for k, ms in arms.items()}
    for ms in arms.values():
        for m in ms:
            m.stop()
    return [
        Check(
            "sampling.cost",
            samples["live"] >= seconds - 1,
            f"{pct['live']:.3f}% of a core per GPU at 1 s ({plan.source_spec.split(':')[0]}), "
            f"recorded source {pct['recorded']:.3f}%; "
            f"{samples['live']:.0f} samples in {seconds:g} s",
            {"cpu_pct_per_gpu": pct, "samples": samples},
        )
    ]


# -- 6. over time: start-up, a leak, a slowdown ----------------------------------------------------


def _rank_out(plan: Plan, name: str, rank: int) -> dict[str, Any]:
    path = plan.workdir / f"{name}_{rank}.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _finding(report: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["kind"] == kind), None)


def check_over_time(plan: Plan) -> list[Check]:
    """Three runs of the verdict job judged over their whole run (``over_time``)."""
    job = [c.tool("torchrun"), "--standalone", "--nproc_per_node=2", JOBS, "verdict"]
    # The shortest runs that still leave no doubt: the start-up job trains as long as its
    # start-up lasts; the leak needs its warm-up skipped and a span of steps to fit; the
    # slowdown needs a few seconds either side of its change.
    lengths = {  # seconds of training (GPU: 10, 8, 12; dry run: 6, 8, 8)
        "startup": max(6.0, 0.5 * plan.seconds),
        "leak": max(8.0, 0.4 * plan.seconds),
        "slowdown": max(8.0, 0.6 * plan.seconds),
    }
    runs = {}
    for fault, seconds in lengths.items():
        out = str(plan.workdir / f"over_time_{fault}_{{rank}}.json")
        cmd = [*job, "--fault", fault, "--seconds", f"{seconds:g}", "--out", out]
        runs[fault], _ = audited(plan, f"over_time_{fault}", cmd)
    return [
        _startup_check(plan, runs["startup"]),
        _leak_check(plan, runs["leak"]),
        _slowdown_check(plan, runs["slowdown"]),
    ]


def _startup_check(plan: Plan, report: dict[str, Any]) -> Check:
    blamed = _blamed(report)
    idle = _finding(report, "idle_device")
    shares = [
        r["time"]["startup_s"] / r["time"]["wall_s"]
        for r in report["ranks"]
        if r.get("time") and r["time"].get("wall_s")
    ]
    share = min(shares) if shares else None
    return Check(
        "over_time.long_startup",
        not blamed and idle is None and share is not None and share >= STARTUP_SHARE,
        f"start-up {'n/a' if share is None else f'{share:.0%}'} of the run (each rank held "
        f"{_mib(_rank_out(plan, 'over_time_startup', 0).get('held_bytes'))} meanwhile); "
        f"idle_device: {'none' if idle is None else idle['severity']}; "
        f"warnings: {blamed or 'none'}",
        {"findings": report["findings"], "startup_shares": shares},
    )


def _leak_check(plan: Plan, report: dict[str, Any]) -> Check:
    own = _rank_out(plan, "over_time_leak", 1)
    growth = _finding(report, "memory_growth")
    row = ((growth or {}).get("evidence") or {}).get("per_rank", {}).get("1") or {}
    got, want, full = row.get("bytes_per_step"), own.get("bytes_per_step"), row.get("full_in_s")
    err = got / want - 1 if isinstance(got, (int, float)) and want else None
    larger = [
        a
        for f in report["findings"]
        for a in f.get("actions") or ()
        if a.get("rank") == 1 and a.get("lever") == "batch_size"
        and isinstance(a.get("proposed"), int) and a["proposed"] > (a.get("current") or 0)
    ]  # fmt: skip
    ranks = (growth or {}).get("ranks")
    figure = (
        f"memory_growth on {ranks} ({growth['severity']}): {_mib(got)}/step against the rank's "
        f"own {_mib(want)}/step ({own.get('measure', '?')})"
        + ("" if err is None else f" ({err * 100:+.1f}%)")
        + f", {_mib(row.get('bytes_per_minute'))}/min, full in "
        + ("n/a" if full is None else f"{full:.0f} s")
        + f"; larger batch advised to rank 1: {'yes' if larger else 'no'}"
        if growth
        else f"no memory_growth (the rank's own measure: {_mib(want)}/step); "
        f"findings {sorted(_blamed(report, severities=('info', 'warning', 'critical')))}"
    )
    return Check(
        "over_time.memory_growth",
        ranks == [1]
        and err is not None
        and abs(err) <= RATE_REL
        and isinstance(full, (int, float))
        and not larger,
        figure,
        {"finding": growth, "job": own},
    )


def _slowdown_check(plan: Plan, report: dict[str, Any]) -> Check:
    own = _rank_out(plan, "over_time_slowdown", 1)
    slow = _finding(report, "slowdown")
    ev = (slow or {}).get("evidence") or {}
    at, want, steps = ev.get("step"), own.get("slow_from_step"), own.get("steps")
    err = (
        (at - want) / steps
        if isinstance(at, int) and isinstance(want, int) and isinstance(steps, int) and steps
        else None
    )
    change = (ev.get("per_rank") or {}).get("1") or {}
    ranks = (slow or {}).get("ranks")
    figure = (
        f"slowdown on {ranks} ({slow['severity']}) at step {at} (the rank's own: {want} of "
        f"{steps}" + ("" if err is None else f", {err * 100:+.1f}% of its steps") + "); "
        f"{change.get('phase', '?')} {change.get('before_ms')} -> {change.get('after_ms')} ms, "
        f"the job {ev.get('slowdown')}x slower"
        if slow
        else f"no slowdown (rank 1 turned slow at step {want} of {steps}); findings "
        f"{sorted(_blamed(report, severities=('info', 'warning', 'critical')))}"
    )
    return Check(
        "over_time.slowdown",
        ranks == [1] and err is not None and abs(err) <= STEP_REL,
        figure,
        {"finding": slow, "job": own},
    )


# -- 7. work done: FLOPs and MFU -----------------------------------------------------------------


def _matmul(
    plan: Plan, name: str, dtype: str, seconds: float, starve: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The matmul job under ``auditor run``: its report and the job's own figures."""
    out = plan.workdir / f"{name}.json"
    cmd = [sys.executable, JOBS, "matmul", "--dtype", dtype, "--seconds", f"{seconds:g}"]
    cmd += ["--out", str(out), *(["--starve"] if starve else [])]
    report, _ = audited(plan, name, cmd)
    return report, dict(json.loads(out.read_text())) if out.exists() else {}


def _counted_check(name: str, report: dict[str, Any], job: dict[str, Any], dtype: str) -> Check:
    flops = report["ranks"][0].get("flops") or {}
    got, exact = flops.get("flops_per_step"), job.get("exact_flops")
    if got is None or not exact:
        return Check(name, False, f"no count in the report (exact {exact})")
    err = got / exact - 1
    share = (flops.get("by_dtype") or {}).get(dtype, 0.0) / got if got else 0.0
    return Check(
        name,
        abs(err) <= FLOPS_REL and share >= 0.98,
        f"{got:.4g} FLOPs a step counted against {exact:.4g} exact ({err * 100:+.2f}%), "
        f"{share:.0%} in {dtype}; counting cost {flops.get('count_cost_s')} s",
        {"counted": got, "exact": exact, "by_dtype": flops.get("by_dtype")},
    )


def _table_check(plan: Plan, runs: dict[str, dict[str, Any]]) -> Check:
    from auditor.analysis.peaks import peak_flops

    figures, ok = [], True
    for dtype, report in runs.items():
        f = report["ranks"][0].get("flops") or {}
        mfu, rate, name = f.get("mfu"), f.get("flops_per_s"), f.get("device_name")
        if plan.dry_run:  # a CPU: FLOP/s, and no MFU
            ok = ok and mfu is None and bool(rate)
            figures.append(f"{dtype} {rate:.3g} FLOP/s, MFU {mfu} on the CPU" if rate else dtype)
            continue
        peak = peak_flops(name, dtype)
        want = rate / peak if rate and peak else None
        good = mfu is not None and want is not None and abs(mfu / want - 1) <= 0.01 and mfu <= 1
        ok = ok and good
        figures.append(
            f"{dtype} MFU {mfu} = {rate:.4g} FLOP/s / {peak:.4g} ({name})"
            if rate and peak
            else f"{dtype} MFU {mfu} on {name} (no peak)"
        )
    return Check("mfu.against_table", ok, "; ".join(figures))


def _precision_check(plan: Plan, bf16: dict[str, Any], fp32: dict[str, Any]) -> Check:
    """The bf16 job does several times the fp32 job's work. Each MFU is against the peak of
    the dtype its FLOPs ran in (the contract's), so the two MFUs are both near the card's
    matmul efficiency; what bf16 multiplies is the FLOP/s, and the fp32 job's report says how
    much of its time bf16 would give back (``job.mfu.precision``, a share of the whole run).
    Half or more of its steps' time, that is: an 8 s job's start-up is half its run or more, and
    its length is the machine's, so the share of the whole run is judged over the steps (the run
    less its start-up and teardown shares, ``job.mfu.gap``)."""
    rb = (bf16["ranks"][0].get("flops") or {}).get("flops_per_s")
    rf = (fp32["ranks"][0].get("flops") or {}).get("flops_per_s")
    mb = (bf16["job"].get("mfu") or {}).get("mfu")
    work = fp32["job"].get("mfu") or {}
    mf, precision, gap = work.get("mfu"), work.get("precision") or 0.0, work.get("gap") or {}
    steps = 1.0 - gap.get("startup", 0.0) - gap.get("teardown", 0.0)
    of_steps = precision / steps if steps > 0 else 0.0
    low = any(f["kind"] == "low_mfu" for f in fp32["findings"])
    ratio = rb / rf if rb and rf else None
    holds = ratio is not None and ratio >= PRECISION_RATIO and of_steps >= 0.5 and low
    return Check(
        "mfu.bf16_over_fp32",
        holds or (plan.dry_run and ratio is not None),
        f"bf16 {rb:.4g} FLOP/s against fp32 {rf:.4g} ({ratio:.1f}x); MFU bf16 {mb}, fp32 {mf}; "
        f"the fp32 job's bf16 share to give back {precision:.3f} of its run, {of_steps:.3f} of "
        f"its steps ({steps:.3f} of the run); low_mfu on it: {low}"
        if ratio is not None
        else f"no FLOP/s: bf16 {rb}, fp32 {rf}",
    )


def _starved_check(
    plan: Plan, fed: dict[str, Any], starved: dict[str, Any], job: dict[str, Any]
) -> Check:
    work = starved["job"].get("mfu") or {}
    gap = work.get("gap") or {}
    mfu, fed_mfu = work.get("mfu"), (fed["job"].get("mfu") or {}).get("mfu")
    wait = starved["ranks"][0].get("data_wait_ratio")
    if plan.dry_run:  # no MFU on a CPU: the starvation itself, as the split will book it
        return Check(
            "mfu.starved_to_data_wait",
            wait is not None and wait >= 0.3,
            f"data wait {wait} of the step (read {job.get('read_s', 0):.3f} s a batch); no MFU "
            "on the CPU",
        )
    ratio = mfu / fed_mfu if mfu and fed_mfu else None
    # The gap is over the whole run: an 8 s job's start-up is half of it. The steps' own parts
    # are judged: the data wait the largest of them and 30% or more of the steps' time.
    steps = {k: v for k, v in gap.items() if k not in ("startup", "teardown")}
    steps_time = 1.0 - gap.get("startup", 0.0) - gap.get("teardown", 0.0)  # of the run
    in_steps = steps.get("data_wait", 0.0) / steps_time if steps_time > 0 else 0.0
    holds = (
        bool(steps)
        and max(steps, key=steps.__getitem__) == "data_wait"
        and in_steps >= 0.3
        and ratio is not None
        and 0.3 <= ratio <= 0.7
    )
    return Check(
        "mfu.starved_to_data_wait",
        holds,
        f"MFU {mfu} against the fed job's {fed_mfu} ({ratio}); the gap {gap}: data wait "
        f"{in_steps:.2f} of the steps' time; data wait {wait} of the step (read "
        f"{job.get('read_s', 0):.4f} s a batch)",
    )


def check_mfu(plan: Plan) -> list[Check]:
    """The matmul job of known FLOPs in bf16 and in fp32 (TF32 off), and bf16 half-starved."""
    seconds = max(4.0, 0.4 * plan.seconds)
    bf16, bf16_job = _matmul(plan, "mfu_bf16", "bf16", seconds)
    fp32, fp32_job = _matmul(plan, "mfu_fp32", "fp32", seconds)
    starved, starved_job = _matmul(plan, "mfu_starved", "bf16", seconds, starve=True)
    return [
        _counted_check("mfu.counted_bf16", bf16, bf16_job, "bf16"),
        _counted_check("mfu.counted_fp32", fp32, fp32_job, "fp32"),
        _table_check(plan, {"bf16": bf16, "fp32": fp32}),
        _precision_check(plan, bf16, fp32),
        _starved_check(plan, bf16, starved, starved_job),
    ]


# -- 8. the Ray path: the GPU monitor as a Ray actor ----------------------------------------------

RAY_LOOK_S = 4.0  # the window over which the monitor's sampling cost is read (two info() calls)
MONITOR_CLASS = "GpuMonitorCore"


def _gcs_address(pid: int, deadline: float) -> str | None:
    """The GCS address of the Ray that auditor run ``pid`` started (its raylet's argument)."""
    while time.monotonic() < deadline:
        try:
            kids = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            return None  # the auditor ended
        for kid in kids:
            try:
                cmd = kid.cmdline()
            except psutil.Error:
                continue
            for arg in cmd:
                for flag in ("--gcs-address=", "--gcs_address="):
                    if arg.startswith(flag):
                        return arg.removeprefix(flag)
        time.sleep(0.2)
    return None


def _cpu_s(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return float(t.user + t.system)


def _info(monitor: Any) -> dict[str, Any]:
    import ray

    got: Any = ray.get(monitor.info.remote(), timeout=10)
    return dict(got)


def ray_look(pid: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """Join the Ray of auditor run ``pid`` while its job runs and read its GPU monitors: each
    one's actor (class, name, required resources, process) from Ray's actor table and its own
    ``info()`` twice, ``RAY_LOOK_S`` apart (the sampling thread's CPU over that window). Runs in
    a process of its own (``--ray-look PID``): this one never joins a Ray."""
    import ray
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    deadline = time.monotonic() + timeout_s
    address = _gcs_address(pid, deadline)
    if address is None:
        return {"error": "no Ray under the auditor (no raylet with a GCS address)"}
    ray.init(address=address, namespace="auditor", log_to_driver=False, logging_level=40)
    try:
        actors: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            table = state._connect_and_get_accessor().get_actor_table(None, "ALIVE")
            rows = [gcs_pb2.ActorTableData.FromString(raw) for raw in table]  # type: ignore[attr-defined]
            actors = [
                {
                    "name": a.name,
                    "class": a.class_name,
                    "required_resources": dict(a.required_resources),
                    "pid": a.pid,
                    "node_id": a.address.node_id.hex(),
                }
                for a in rows
                if a.class_name.endswith(MONITOR_CLASS) and a.name and a.pid
            ]
            if actors:
                break
            time.sleep(0.2)
        joined = time.monotonic() - (deadline - timeout_s)
        handles = {a["name"]: ray.get_actor(a["name"]) for a in actors}
        first = {n: _info(h) for n, h in handles.items()}
        wall0 = time.monotonic()
        proc0 = {a["name"]: _cpu_s(a["pid"]) for a in actors}
        time.sleep(RAY_LOOK_S)
        wall = time.monotonic() - wall0
        for a in actors:
            n = a["name"]
            a["info"] = first[n]
            # Over the window; or, where the run ended first, since the monitor started.
            a["sampling_cpu_per_s"] = first[n].get("sampling_cpu_per_s")
            a["window"] = False
            p0, p1 = proc0[n], _cpu_s(a["pid"])
            a["process_cpu_per_s"] = (p1 - p0) / wall if p0 is not None and p1 is not None else None
            try:
                last = _info(handles[n])
            except Exception:
                continue
            cpu = last.get("sampling_cpu_s", 0.0) - first[n].get("sampling_cpu_s", 0.0)
            a.update(info=last, sampling_cpu_per_s=cpu / wall, window=True)
            a["samples_in_window"] = last["samples"] - first[n]["samples"]
        return {"address": address, "actors": actors, "window_s": wall, "joined_s": joined}
    finally:
        ray.shutdown()


def _watch_ray(plan: Plan, into: dict[str, Any]) -> Callable[[int], None]:
    def watch(pid: int) -> None:
        proc = subprocess.run(
            [sys.executable, __file__, "--ray-look", str(pid)],
            env=plan.env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        lines = proc.stdout.strip().splitlines()
        try:
            into.update(json.loads(lines[-1]))
        except (IndexError, ValueError):
            into["error"] = f"--ray-look exited {proc.returncode}: {proc.stderr.strip()[-800:]}"

    return watch


def _have_ray() -> bool:
    return importlib.util.find_spec("ray") is not None


def check_ray(plan: Plan) -> list[Check]:
    if not _have_ray():
        return [Check("ray", False, "no Ray here (bench/ray_bundle.py --print-install)")]
    import ray

    # Long enough for the watcher to join the run's Ray and read the monitors over its window.
    seconds = 12.0 if plan.dry_run else 15.0
    job = [c.tool("torchrun"), "--standalone", "--nproc_per_node=2", JOBS, "verdict",
           "--seconds", f"{seconds:g}", "--fault", "none"]  # fmt: skip
    looked: dict[str, Any] = {}
    t0 = time.time()
    report, record = audited(plan, "ray_monitor", job, ray=True, watch=_watch_ray(plan, looked))
    t1 = time.time()
    rec = read_recording(record)
    on_ray = not any("in-process" in str(n) for n in report.get("notes", []))
    actors = looked.get("actors", [])
    gpu0 = next((d for d in rec.batch.devices if d.index == 0), None)
    uuid = gpu0.uuid if gpu0 is not None else None
    samples = [d for d in rec.batch.devices if d.uuid == uuid]
    span = (max(d.time for d in samples) - min(d.time for d in samples)) if samples else 0.0
    mine = [a for a in actors if a["info"].get("uuid") == uuid]
    pinned = bool(mine) and all(
        a["info"].get("ray_node_id") == a["node_id"] and a["info"].get("index") == 0 for a in mine
    )
    spec = plan.source_spec.split(":")[0]
    checks = [
        Check(
            "ray.monitor_actor",
            on_ray
            and pinned
            # A recorded source repeats its one sample on a dry run: samples over time on a GPU.
            and (plan.dry_run or (len(samples) >= seconds / 2 and span >= seconds / 2)),
            f"Ray {ray.__version__} ({os.path.dirname(ray.__file__)}); "
            + (
                f"GPU 0 {uuid}: {len(samples)} samples over {span:.0f} s of a "
                f"{t1 - t0:.0f} s run, from "
                + (
                    ", ".join(f"actor {a['name']} (pid {a['pid']}, {spec})" for a in mine)
                    if mine
                    else f"no monitor actor seen ({looked.get('error', 'none alive')})"
                )
                if uuid
                else "no GPU in the recording"
            )
            + ("" if on_ray else f"; notes {report.get('notes')}"),
            {"looked": looked, "notes": report.get("notes", [])},
        )
    ]
    slots = {a["name"]: a["required_resources"] for a in actors}
    no_slot = bool(slots) and all(not r.get("GPU") and not r.get("CPU") for r in slots.values())
    ranks = _gpu_map(record)
    sees = len(ranks) == 2 and all(us == (uuid,) for us in ranks.values())
    stepped = all((r.get("steps") or 0) > 0 for r in report["ranks"]) and len(report["ranks"]) == 2
    checks.append(
        Check(
            "ray.no_gpu_slot",
            no_slot and stepped and (sees or plan.dry_run),
            f"monitor's required resources {slots or 'unknown'}; rank -> GPU {ranks}; "
            + ", ".join(f"rank {r['rank']} {r.get('steps')} steps" for r in report["ranks"]),
            {"required_resources": slots},
        )
    )
    costs = [a["sampling_cpu_per_s"] for a in mine if a.get("sampling_cpu_per_s") is not None]
    procs = [a["process_cpu_per_s"] for a in mine if a.get("process_cpu_per_s") is not None]
    windowed = bool(mine) and all(a["window"] for a in mine)
    how = f"over {looked.get('window_s', 0):.1f} s" if windowed else "since it started"
    checks.append(
        Check(
            "ray.sampling_cost",
            bool(costs) and len(costs) == len(mine),
            (
                f"sampling thread {max(costs) * 100:.3f}% of a core per GPU at "
                f"{mine[0]['info']['interval_s']:g} s ({spec}, {how}); the monitor actor's "
                "whole process "
                + (f"{max(procs) * 100:.2f}%" if procs else "n/a")
                + f" over {looked.get('window_s', 0):.1f} s"
                if costs
                else f"not measured ({looked.get('error', 'no monitor actor seen')})"
            ),
            {"sampling_cpu_per_s": costs, "process_cpu_per_s": procs, "windowed": windowed},
        )
    )
    return checks


# -- the plan -------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[Plan], list[Check]]] = {
    "nvml": check_nvml,
    "phases": check_phases,
    "verdict": check_verdicts,
    "memory": check_memory,
    "sampling": check_sampling,
    "over_time": check_over_time,
    "mfu": check_mfu,
    "ray": check_ray,
}


def _device() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"cuda": False, "torch": None}
    info: dict[str, Any] = {"cuda": torch.cuda.is_available(), "torch": torch.__version__}
    if info["cuda"]:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, total_bytes=p.total_memory, cuda=torch.version.cuda)
    return info


def dry_source(workdir: Path) -> Path:
    """The dry run's GPU: GPU 0 of the recorded fixture, as a GPU of this host (a recorded source
    serves the samples of its own node only)."""
    rec = read_recording(DRY_SOURCE)
    path = workdir / "dry_gpu.jsonl"
    w = RecordingWriter(path, job="dry_run", meta={"from": os.path.relpath(DRY_SOURCE, c.REPO)})
    for d in rec.batch.devices:
        if d.index == 0:
            w.write(Batch(devices=(replace(d, node=socket.gethostname()),)))
    w.close()
    return path


def gpu_folder(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100_live``."""
    m = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (m.group(1).lower() if m else "gpu") + "_live"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="the same plan on the CPU, recorded NVML")
    p.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CHECKS)}")
    p.add_argument("--record-dir", help="where the recordings go (default tests/data/<gpu>_live)")
    p.add_argument("--seconds", type=float, default=None, help="each job's training time")
    p.add_argument("--profile", action="store_true", help="also profile one probed phase arm")
    p.add_argument("--ray-look", type=int, help=argparse.SUPPRESS)  # the ray group's watcher
    args = p.parse_args(argv)
    if args.ray_look is not None:
        print(json.dumps(ray_look(args.ray_look)), flush=True)
        return 0
    only = [x for x in args.only.split(",") if x] or list(CHECKS)
    unknown = sorted(set(only) - set(CHECKS))
    if unknown:
        p.error(f"unknown check(s) {unknown}: choose from {', '.join(CHECKS)}")
    device = _device()
    if not device["cuda"] and not args.dry_run:
        print(
            "gpu_validate: no CUDA GPU here (torch sees none); --dry-run runs the plan on the CPU",
            file=sys.stderr,
        )
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="aud-gpuval-"))
    if args.record_dir:
        record_dir = Path(args.record_dir)
    elif args.dry_run:
        record_dir = workdir / "recordings"
    else:
        record_dir = Path(c.REPO, "tests", "data", gpu_folder(device["name"]))
    record_dir.mkdir(parents=True, exist_ok=True)
    # The repository first, then whatever was on the path (a Ray unpacked by ray_bundle.py).
    path = os.pathsep.join([c.REPO, *filter(None, [os.environ.get("PYTHONPATH")])])
    env = c.clean_env({"RAY_AUTH_MODE": c.RAY_AUTH_MODE, "PYTHONPATH": path})
    plan = Plan(
        dry_run=args.dry_run,
        source_spec=f"recorded:{dry_source(workdir)}" if args.dry_run else "nvml",
        record_dir=record_dir,
        workdir=workdir,
        env=env,
        seconds=args.seconds or (8.0 if args.dry_run else 20.0),
        steps=120 if args.dry_run else 200,
        device=device,
        profile=args.profile,
    )
    checks: list[Check] = []

    name = "gpu_validate" + ("_dry_run" if args.dry_run else "")
    # A run of some groups (--only) keeps the other groups' checks of the last full run.
    kept: list[dict[str, Any]] = []
    if args.only:
        try:
            with open(os.path.join(c.RESULTS, f"{name}.json")) as f:
                kept = [ch for ch in json.load(f)["checks"] if ch["name"].split(".")[0] not in only]
        except (OSError, ValueError, KeyError):
            kept = []

    def write() -> None:  # after every group: a run cut short keeps what it had
        c.write_result(
            name,
            {
                "dry_run": args.dry_run,
                "device": plan.device,
                "record_dir": str(record_dir),
                "checks": kept
                + [
                    {"name": ch.name, "holds": ch.holds, "figure": ch.figure, "detail": ch.detail}
                    for ch in checks
                ],
            },
        )

    for group in only:
        t = time.monotonic()
        try:
            got = CHECKS[group](plan)
        except Exception as exc:  # one group failing must not hide the others' results
            got = [Check(group, False, f"{type(exc).__name__}: {str(exc)[-1500:]}")]
        for ch in got:
            ch.detail.setdefault("seconds", round(time.monotonic() - t, 1))
            print(ch.line(), flush=True)
        checks += got
        write()
    held = sum(ch.holds for ch in checks)
    print(
        f"gpu_validate: {held}/{len(checks)} checks hold"
        + (" (dry run, CPU)" if args.dry_run else "")
    )
    return 0 if held == len(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
