"""The JSON report: one document per run, the input of the verdict, the HTML page and CI checks.

Schema ``auditor.report/v2``::

    {"schema": "auditor.report/v2",
     "generated_at": "2024-05-01T12:00:00Z",
     "job": {"name", "command", "exit_code", "world_size", "parallel_mode", "duration_s",
             "interrupted", "hosts"},
     "ranks": [{"rank", "host", "local_rank", "pid", "device", "parallel_mode", "steps",
                "window_steps", "step_s", "data_wait_s", "h2d_s", "forward_s", "backward_s",
                "optimizer_s", "collective_wait_s", "collective_ops", "compute_s",
                "data_wait_ratio", "busy_ratio", "batch_size", "samples_per_s", "main_cpu",
                "worker_cpu", "workers", "loader",
                "memory": {"rss_bytes", "allocated_bytes", "peak_bytes", "budget"},
                "flops": {"flops_per_step", "flops_per_s", "mfu", "peak_flops_per_s",
                          "dtype", "by_dtype", "device", "device_name", "counted_step",
                          "count_cost_s", "micro_batches", "samples"},
                "unmeasured", "off_thread_collectives", "ended",
                "time": {"wall_s", "startup_s", "steps", "data_wait_s", "h2d_s", "forward_s",
                         "backward_s", "optimizer_s", "collective_wait_s", "outside",
                         "other_s", "gaps_s", "teardown_s", "started", "ended",
                         "startup_gpu_bytes", "teardown_gpu_bytes"},
                "applied": [{"lever", "from", "to"}],
                "not_applied": [{"lever", "value", "reason"}]}],
     "findings": [{"kind", "severity", "ranks", "summary", "evidence", "fixes",
                   "predicted_speedup", "predicted_range", "cause",
                   "actions": [{"rank", "gpu", "lever", "how", "current", "proposed",
                                "expected_speedup", "answers"}]}],
     "notes": [str, ...]}

``job.mfu`` (only where a rank counted its FLOPs; :mod:`auditor.analysis.mfu`): ``{"flops_per_s",
"mfu", "gap", "basis", "precision", "tf32", "device_name", "dtype", "gpu", "ranks"}``: the job's
FLOP/s (every counted rank's added up), its MFU (null on a CPU or a card the peak table does
not know) and ``gap``, the MFU gap split into the time account's parts and the device's own
inefficiency (``startup``, ``data_wait``, ``h2d``, ``collective_wait``, ``stalls``,
``host_overhead``, ``small_batch``, ``device``, ``teardown``: shares of the time, adding up to
``1 - mfu``), over the ranks' whole runs (``basis`` ``run``) or a step at their pace
(``step``); ``precision``/``tf32``: the share of the time bf16, or TF32 alone, would give back
from the fp32 matmuls. Per rank, ``flops`` is its count (null where it sent none): FLOPs of one
step (forward and backward of every micro-batch) and ``by_dtype``, FLOP/s at its pace, its MFU
against ``peak_flops_per_s`` (the dense peak of its dtype mix on ``device_name``, its share
where ranks share a GPU), the step it was counted on and what counting cost it
(``count_cost_s``).

``job.apply`` (only on a run made with ``auditor run --apply``): ``{"sources", "levers",
"not_applied"}``, the plan: where it came from, the loader levers per rank, and the fixes it left
to the user (``{"rank", "lever", "current", "proposed"}``). Per rank, ``applied`` lists the
levers its probe moved on the training DataLoader and ``not_applied`` those it did not, with a
reason code (``iterable_dataset``, ``needs_workers``, ``already``, ``refused``, ``no_loader``;
:mod:`auditor.report.applied`); both empty on other runs.

A finding's ``predicted_speedup`` is the job's step time now over the step time once its fixes
are in (:mod:`auditor.analysis.advisor`); ``predicted_range`` (``[low, high]``, null where not
judged) is the least and the most the rules predicted for the same finding over the whole
window and over each of its parts (quarters, or halves of a shorter run:
:mod:`auditor.analysis.spread`): how much the prediction moves with what was measured.

A finding's ``fixes`` are its changes in words, per rank; ``actions`` the same changes as data
(:class:`~auditor.analysis.fixes.Fix`): the ``lever`` (``num_workers``, ``pin_memory``,
``batch_size``, ``gradient_checkpointing``, ... :data:`~auditor.analysis.fixes.LEVERS`), ``how``
it is moved (``loader``: a DataLoader argument, applicable without editing the script;
``code``; ``hardware``), its ``current`` and ``proposed`` values where known (null otherwise),
the job's ``expected_speedup`` once the finding's fixes are applied, and the finding kinds it
``answers``. Version 1 documents (no ``actions``) are still read.

Conventions follow :mod:`auditor.samples`: seconds, bytes, cores, ratios in 0..1, and ``null``
for anything not measured (never 0). ``job.hosts`` maps each host name to its ranks.
Per-step timings are medians over the snapshot's window (``window_steps`` steps); ``steps``
counts every step seen over the whole run. ``collective_ops`` is the collective wait by
operation (``{"ddp_allreduce": 0.031, "all_gather_object": 0.002}``: each op's median seconds per
step, a step without the op counting 0; null where the probe named none). ``unmeasured`` lists
what the probe could not time on the rank (a phase, or ``"collectives off the training
thread"``: calls from another thread, ``off_thread_collectives`` of them).
``memory.budget`` is the rank's measured budget (``auditor.probe.memory``; null where the probe
sent none): ``param_bytes`` (and
``param_bytes_by_dtype``), ``grad_bytes``, ``optimizer_bytes`` (and ``optimizer_bytes_by_kind``),
``buffer_bytes``, ``fixed_bytes`` (their sum), ``other_module_bytes`` (modules outside the
model), ``activation_bytes_per_step`` and ``activation_bytes_per_sample`` (one sampled forward),
``device_total_bytes``, ``host_total_bytes``, ``host_available_bytes`` and ``local_ranks``.
``time`` is where the rank's whole run went (:mod:`auditor.analysis.accounting`), every second
once, in seconds summed over the run (not medians): ``startup_s`` (process start to the first
step), the steps' phases, ``outside`` (named work in the steps, by name: ``checkpoint``,
``evaluation``), ``other_s`` (the steps' unnamed rest), ``gaps_s`` (between steps) and
``teardown_s`` (last step to process end); they add up to ``wall_s``. ``started``/``ended``:
whether the process start and end were reported (else no start-up or teardown is booked).
``startup_gpu_bytes``/``teardown_gpu_bytes`` (only where measured): the most GPU memory the
rank's process held while it started up and while it ended (NVML, its PID): a GPU holding
memory then is starting up or ending, not idle. null where no account could be made (and in
reports from before it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from auditor.analysis.accounting import Account
from auditor.analysis.findings import Finding
from auditor.analysis.mfu import JobMfu, RankFlops, job_mfu, rank_flops
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.analysis.stats import RankStats
from auditor.files import write_text_atomic
from auditor.report.model import JOB_KEYS as JOB_KEYS
from auditor.report.model import MEMORY_KEYS as MEMORY_KEYS
from auditor.report.model import RANK_KEYS as RANK_KEYS
from auditor.report.model import SCHEMA as SCHEMA
from auditor.report.model import TOP_KEYS as TOP_KEYS
from auditor.report.model import (
    DeadRank,
    JobSummary,
    MfuEntry,
    NodeEntry,
    RankEntry,
    Report,
    ReportFinding,
    jsonable,
)
from auditor.report.model import validate_report as validate_report


def make_report(
    *,
    command: Sequence[str],
    exit_code: int | None,
    duration_s: float,
    snapshot: Snapshot,
    findings: Sequence[Finding],
    job: str = "",
    notes: Sequence[str] = (),
    interrupted: bool = False,
    generated_at: datetime | None = None,
    nodes: Sequence[Mapping[str, Any]] | None = None,
    dead_ranks: Sequence[DeadRank] | None = None,
) -> Report:
    """The report of one run.

    ``job`` names the job (defaults to the snapshot's job name); ``generated_at`` defaults to
    now (UTC). Works for an empty snapshot: a job that ended before any step has no ranks.
    ``nodes`` (the job view's node states) and ``dead_ranks`` are written where given.
    """
    when = generated_at or datetime.now(timezone.utc)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    stats = snapshot.paced
    views = sorted(snapshot.ranks, key=lambda v: v.info.rank)
    counted = rank_flops(snapshot)
    ranks = tuple(
        RankEntry.from_dict(
            jsonable(
                _rank_entry(
                    view,
                    stats[view.info.rank],
                    snapshot.total_steps.get(view.info.rank, 0),
                    snapshot.accounts.get(view.info.rank),
                    counted.get(view.info.rank),
                )
            )
        )
        for view in views
    )
    work = job_mfu(snapshot, flops=counted) if counted else None
    world_size = max(snapshot.world_size, len(views))
    return Report(
        generated_at=when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        job=JobSummary(
            name=str(job or snapshot.job),
            command=tuple(str(c) for c in command),
            exit_code=None if exit_code is None else int(exit_code),
            world_size=world_size or None,
            parallel_mode=snapshot.parallel_mode,
            duration_s=_round(duration_s, 3),
            interrupted=bool(interrupted),
            hosts={
                str(host): tuple(int(r) for r in sorted(rs))
                for host, rs in sorted(snapshot.hosts().items())
            },
            nodes=(
                tuple(NodeEntry.from_dict(jsonable(n)) for n in nodes)
                if nodes is not None
                else None
            ),
            dead_ranks=tuple(dead_ranks) if dead_ranks is not None else None,
            mfu=None if work is None else MfuEntry.from_dict(jsonable(mfu_entry(work))),
        ),
        ranks=ranks,
        findings=tuple(ReportFinding.of(f) for f in findings),
        notes=tuple(str(n) for n in notes),
    )


def build_report(
    *,
    command: Sequence[str],
    exit_code: int | None,
    duration_s: float,
    snapshot: Snapshot,
    findings: Sequence[Finding],
    job: str = "",
    notes: Sequence[str] = (),
    interrupted: bool = False,
    generated_at: datetime | None = None,
) -> dict[str, Any]:
    """The report document for one run (a plain dict of JSON types): :func:`make_report`'s
    :meth:`Report.to_dict`."""
    return make_report(
        command=command,
        exit_code=exit_code,
        duration_s=duration_s,
        snapshot=snapshot,
        findings=findings,
        job=job,
        notes=notes,
        interrupted=interrupted,
        generated_at=generated_at,
    ).to_dict()


def write_report(path: str | Path, report: Report | Mapping[str, Any]) -> None:
    """Write ``report`` to ``path`` atomically (temp file in the same folder, then rename)."""
    doc = report.to_dict() if isinstance(report, Report) else report
    write_text_atomic(path, json.dumps(doc, indent=2, allow_nan=False) + "\n")


def read_report(path: str | Path) -> Report:
    """The report a file written by :func:`write_report` holds (errors as :func:`load_report`)."""
    return Report.from_dict(load_report(path), source=str(path))


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a report written by :func:`write_report`.

    Raises ``ValueError`` naming the file when it is not JSON, not an ``auditor.report`` (v1 or v2)
    document, or lacks a required section. A missing file raises ``FileNotFoundError``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p}: not an auditor report (not UTF-8 text: {exc})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}: not an auditor report (invalid JSON: {exc})") from exc
    validate_report(data, source=str(p))
    assert isinstance(data, dict)
    return data


def _rank_entry(
    view: RankView,
    s: RankStats,
    total_steps: int,
    account: Account | None = None,
    flops: RankFlops | None = None,
) -> dict[str, Any]:
    info = view.info
    n = len(view.steps)
    timed = n > 0 and s.step_s > 0

    def secs(value: float | None) -> float | None:
        return _round(value, 6) if timed else None

    measured_cpu = len(view.cpu) > 0
    return {
        "rank": info.rank,
        "host": info.host,
        "local_rank": info.local_rank,
        "pid": info.pid or (view.cpu[-1].pid if view.cpu else None) or None,
        "device": info.device,
        "parallel_mode": info.parallel_mode,
        "steps": max(total_steps, n),
        "window_steps": n,
        "step_s": secs(s.step_s),
        "data_wait_s": secs(s.data_wait_s),
        "h2d_s": secs(s.h2d_s),
        "forward_s": secs(s.forward_s),
        "backward_s": secs(s.backward_s),
        "optimizer_s": secs(s.optimizer_s),
        "collective_wait_s": secs(s.collective_wait_s),
        "collective_ops": (
            {op: secs(w) for op, w in sorted(s.collective_ops.items())}
            if timed and s.collective_ops is not None
            else None
        ),
        "compute_s": secs(s.compute_s),
        "data_wait_ratio": _round(s.data_wait_ratio, 4) if timed else None,
        "busy_ratio": _round(s.busy_ratio, 4) if timed else None,
        "batch_size": _batch(s.batch_size) if n else None,
        "samples_per_s": _round(s.samples_per_s, 2) if timed else None,
        "main_cpu": _round(s.main_cpu, 3),
        "worker_cpu": _round(s.worker_cpu, 3),
        "workers": s.workers if measured_cpu else None,
        "loader": asdict(info.loader) if info.loader is not None else None,
        "memory": {
            "rss_bytes": _int(s.rss_bytes if s.rss_bytes is not None else _latest_rss(view)),
            "allocated_bytes": _int(s.mem_allocated_bytes),
            # The peak over the window, not a median: a peak is a maximum by nature.
            "peak_bytes": _int(
                max(
                    (st.mem_peak_bytes for st in view.steps if st.mem_peak_bytes is not None),
                    default=None,
                )
            ),
            "budget": _budget(view),
        },
        "flops": None if flops is None else flops_entry(flops),
        "unmeasured": list(info.unmeasured),
        "off_thread_collectives": info.off_thread_collectives,
        "ended": bool(view.ended),
        "time": account.rounded().to_dict() if account is not None else None,
        "applied": [{"lever": k, "from": a, "to": b} for k, a, b in info.applied],
        "not_applied": [{"lever": k, "reason": why} for k, why in info.apply_kept],
    }


def flops_entry(f: RankFlops) -> dict[str, Any]:
    """A rank's counted work as the report writes it (``ranks[].flops``)."""
    return {
        "flops_per_step": _sig(f.flops_per_step),
        "flops_per_s": _sig(f.flops_per_s),
        "mfu": _round(f.mfu, 4),
        "peak_flops_per_s": _sig(f.peak_flops_per_s),
        "dtype": f.dtype,
        "by_dtype": {d: _sig(v) for d, v in sorted(f.by_dtype.items())},
        "device": f.device,
        "device_name": f.device_name,
        "counted_step": f.counted_step,
        "count_cost_s": _round(f.count_cost_s, 6),
        "micro_batches": f.micro_batches,
        "samples": f.samples,
    }


def mfu_entry(job: JobMfu) -> dict[str, Any]:
    """The job's work as the report writes it (``job.mfu``)."""
    return {
        "flops_per_s": _sig(job.flops_per_s),
        "mfu": _round(job.mfu, 4),
        "gap": {k: _round(v, 4) for k, v in job.gap.items()},
        "basis": job.basis,
        "precision": _round(job.precision, 4) if job.gpu else None,
        "tf32": _round(job.tf32, 4) if job.gpu else None,
        "device_name": job.device_name,
        "dtype": job.dtype,
        "gpu": job.gpu,
        "ranks": list(job.ranks),
    }


def _sig(value: float | None, digits: int = 5) -> float | None:
    """A figure of any size to ``digits`` significant digits (FLOPs run to 1e15 and more)."""
    if value is None or not math.isfinite(float(value)):
        return None
    return float(f"{float(value):.{digits}g}")


def _budget(view: RankView) -> dict[str, Any] | None:
    """The rank's measured memory budget, parts first, then what it runs on."""
    b = view.memory
    if b is None:
        return None
    per = b.activations_per_sample
    return {
        "measured_at_step": b.step,
        "optimizer": b.optimizer,
        "param_count": b.param_count,
        "param_bytes": b.param_bytes,
        "param_bytes_by_dtype": dict(b.param_bytes_by_dtype),
        "grad_bytes": b.grad_bytes,
        "optimizer_bytes": b.optimizer_bytes,
        "optimizer_bytes_by_kind": dict(b.optimizer_bytes_by_kind),
        "buffer_bytes": b.buffer_bytes,
        "fixed_bytes": b.fixed_bytes,
        "other_module_bytes": b.other_module_bytes,
        "activation_bytes_per_step": b.activation_bytes,
        "activation_batch": b.activation_batch,
        "activation_bytes_per_sample": None if per is None else round(per, 1),
        "activations_every": b.activations_every,
        "sharded": b.sharded,
        "per_device": dict(b.per_device),
        "device_total_bytes": b.device_total_bytes,
        "host_total_bytes": b.host_total_bytes,
        "host_available_bytes": b.host_available_bytes,
        "local_ranks": b.local_ranks,
    }


def _latest_rss(view: RankView) -> int | None:
    for c in reversed(view.cpu):
        if c.rss_bytes is not None:
            return c.rss_bytes
    return None


def _round(value: float | None, digits: int) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not math.isfinite(v):
        return None
    return round(v, digits)


def _int(value: float | None) -> int | None:
    if value is None or not math.isfinite(float(value)):
        return None
    return round(float(value))


def _batch(value: float | None) -> int | float | None:
    """A median batch size: an int when whole (it usually is), else two decimals."""
    if value is None or not math.isfinite(value):
        return None
    return int(value) if float(value).is_integer() else round(value, 2)
