"""memory_pressure: a GPU close to full whose memory is still rising: an out-of-memory ahead.

Metric, per GPU (NVML): the peak memory in use over the window as a share of the total, the
least-squares rise of used memory over the window and its slope over the later half.

Decision: the peak is at least ``min_ratio`` of the total, the fitted rise over the window is at
least ``min_rise_bytes`` and memory still rises in the later half of the window. A job that sits
at 95% on purpose is not flagged: PyTorch's caching allocator keeps what it reserved, so a full
but flat GPU is normal; so is a rise during warm-up that has levelled off. ``warning``, and
``critical`` from ``critical_ratio`` on. While ranks report steps, one needs ``min_steps`` in the
window (memory rising while the model loads is not pressure).

Blamed: the ranks on the GPU (:func:`auditor.analysis.devices.gpu_owners`); a GPU no rank owns
is named with ``ranks=()``; the report gives its fix under ``evidence["fix"]``.

Fix, with numbers: the batch that brings the peak to ``target_ratio`` of the total, from the
rank's fitted ``memory = a + b * batch`` (:mod:`.memory_headroom`) where its batch varied, else
assuming memory in proportion to the batch (which overstates the saving when the model part is
large: the evidence says which); gradient checkpointing; mixed precision. Where the batch did not
change while memory rose, something is kept across steps (a loss summed as a tensor, outputs
appended to a list): said first. The time to full is the headroom over the recent slope.

Measured budget (where the probe sent one, :mod:`auditor.analysis.budget`): the suggested batch
comes from the measured ``fixed + batch x activations per sample`` (no fit, no batch variation
needed), and each fix lists what the levers free per rank, in bytes. A CPU job has no GPU to
fill: its ranks are judged on the host, where the finding is raised only when memory is actually
short (available below ``host_short`` of the host's total; ``critical`` below
``host_critical``).

Fixes (:class:`~auditor.analysis.fixes.Fix`), per rank (or, on a GPU no rank owns, on the GPU):
``retained_tensors`` where memory rose at a steady batch, ``batch_size`` current -> smaller, and
the measured levers (:meth:`~auditor.analysis.budget.BudgetModel.fixes`) or else
``gradient_checkpointing`` and ``autocast_bf16``. Evidence codes (the report words them): each
rank's ``basis`` (``budget``, ``fit``, ``proportional`` or ``unknown_batch``), a budget's
``source`` and ``capacity_source``, ``speedup_model`` ``not_predicted``.

Speed-up: not predicted: this prevents a crash, it does not change the step time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from auditor.samples import MemoryBudget

from ..budget import BudgetModel, model_for
from ..findings import Finding
from ..fixes import Fix
from ..measures import NOT_PREDICTED, MemoryFit, latest_micro_batch, rank_memory_fits
from ..rule import Explained, Rule
from ..snapshot import RankView, Snapshot

KIND = "memory_pressure"
MIB = 1024**2
# How a rank's suggested batch was sized (evidence ``basis``; the report words it).
BASIS_BUDGET = "budget"  # the measured fixed part + batch x activations per sample
BASIS_FIT = "fit"  # the fitted memory = a + b * batch
BASIS_PROPORTIONAL = "proportional"  # memory assumed in proportion to the batch
BASIS_UNKNOWN = "unknown_batch"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: while ranks report steps, one needs this many in the window first.
    min_samples: NVML samples a GPU needs in the window before it is judged.
    min_ratio: peak memory share of the total that counts as nearly full (warning).
    critical_ratio: peak memory share from which the finding is critical.
    min_rise_bytes: least fitted rise of used memory over the window.
    target_ratio: share of the total the suggested batch should peak at.
    min_r2: least goodness of a rank's memory fit used to size the batch.
    host_short: a CPU job's host with available memory below this share of its total is
        short of memory (warning).
    host_critical: below this share, critical.
    """

    min_steps: int = 8
    min_samples: int = 5
    min_ratio: float = 0.90
    critical_ratio: float = 0.97
    min_rise_bytes: int = 256 * MIB
    target_ratio: float = 0.85
    min_r2: float = 0.8
    host_short: float = 0.05
    host_critical: float = 0.02


@dataclass(frozen=True)
class Inputs:
    """Per GPU with ``min_samples`` or more and a known total, in node and index order: its
    label and reference, peak share of the total, total and peak bytes, fitted rise over the
    window, slope over the window and over its later half, the window's span and its owners.
    Per rank on a GPU at least ``min_ratio`` full, and per rank of a CPU job (a measured budget,
    no device total): its latest batch (per micro-batch; None where no step had one), whether
    every step had that batch, its micro-batches per step, its measured budget (where the probe
    sent one), its host, and its memory fit (ready ranks with one). The job's world size."""

    label: Mapping[str, str]
    ref: Mapping[str, Mapping[str, Any]]
    peak_ratio: Mapping[str, float | None]
    total: Mapping[str, int]
    peak: Mapping[str, int | None]
    rise: Mapping[str, float | None]
    trend: Mapping[str, float | None]
    recent: Mapping[str, float | None]
    span_s: Mapping[str, float]
    owners: Mapping[str, tuple[int, ...]]
    batch: Mapping[int, int | None]
    steady: Mapping[int, bool]
    accumulated: Mapping[int, int]
    memory: Mapping[int, MemoryBudget]
    host: Mapping[int, str]
    fit: Mapping[int, MemoryFit]
    world_size: int


@dataclass(frozen=True)
class RankRelief:
    """What a rank on a filling GPU can change: its batch, a smaller one that peaks at the
    target share (None where none is smaller), whether memory rose while its batch stayed the
    same (something kept across steps), and its measured budget where the probe sent one."""

    batch: int | None
    smaller_batch: int | None
    kept_across_steps: bool
    budget: BudgetModel | None
    # Micro-batches per step (gradient accumulation): the batches above are then per
    # micro-batch, the one whose activations are alive at a time.
    accumulated: int = 1
    # How the suggested batch was sized: BASIS_BUDGET, BASIS_FIT, BASIS_PROPORTIONAL or
    # BASIS_UNKNOWN.
    basis: str = BASIS_UNKNOWN


@dataclass(frozen=True)
class Filling:
    """A GPU nearly full and still filling: its peak share of the total, the rise over the
    window, the recent slope and the minutes left until full at that slope."""

    gpu: str
    peak_ratio: float
    total_bytes: int
    rise_bytes: float
    span_s: float
    recent_bytes_per_s: float
    minutes_to_full: float
    target_ratio: float
    ranks: Mapping[int, RankRelief]


@dataclass(frozen=True)
class HostShort:
    """A CPU job's host short of memory (available bytes and share), and each of its ranks'
    measured budget."""

    host: str
    available_bytes: int
    total_bytes: int
    available_ratio: float
    ranks: Mapping[int, BudgetModel]


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    if snapshot.ranks and snapshot.most_steps < t.min_steps:
        return None
    gpus = [
        d
        for _, d in snapshot.gpus_in_place
        if not d.lost and d.samples >= t.min_samples and d.mem_total_bytes
    ]
    owners = snapshot.owners
    full = {d.uuid for d in gpus if (d.mem_ratio_max or 0.0) >= t.min_ratio}
    on_full = {r for u in full for r in owners.get(u, ())}
    views = [
        v
        for v in snapshot.ranks
        if v.info.rank in on_full
        or (
            v.memory is not None
            and not v.memory.device_total_bytes
            and v.memory.host_available_bytes is not None
        )
    ]
    batches = {v.info.rank: _batches(v) for v in views}
    fits = rank_memory_fits(snapshot, min_steps=t.min_steps, min_samples=t.min_samples)
    return Inputs(
        label={d.uuid: d.label for d in gpus},
        ref={d.uuid: d.ref for d in gpus},
        peak_ratio={d.uuid: d.mem_ratio_max for d in gpus},
        total={d.uuid: d.mem_total_bytes or 0 for d in gpus},
        peak={d.uuid: d.mem_used_max_bytes for d in gpus},
        rise={d.uuid: d.mem_rise_bytes for d in gpus},
        trend={d.uuid: d.mem_trend_bytes_per_s for d in gpus},
        recent={d.uuid: d.mem_recent_trend_bytes_per_s for d in gpus},
        span_s={d.uuid: d.span_s for d in gpus},
        owners={d.uuid: tuple(owners.get(d.uuid, ())) for d in gpus},
        batch={r: b[-1] if b else None for r, b in batches.items()},
        steady={r: len(set(b)) == 1 for r, b in batches.items()},
        accumulated={v.info.rank: latest_micro_batch(v)[1] for v in views},
        memory={v.info.rank: v.memory for v in views if v.memory is not None},
        host={v.info.rank: v.info.host for v in views},
        fit={r: fits[r][0] for r in on_full if r in fits},
        world_size=snapshot.world_size,
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find GPUs that are nearly full and still filling, and CPU jobs' hosts short of memory."""
    findings: list[Finding] = _host_short(i, t)
    for uuid in i.label:
        ratio = i.peak_ratio[uuid]
        rise = i.rise[uuid]
        recent = i.recent[uuid]
        if ratio is None or ratio < t.min_ratio or rise is None or rise < t.min_rise_bytes:
            continue
        if recent is None or recent <= 0:
            continue
        ranks = i.owners[uuid]
        headroom = i.total[uuid] - (i.peak[uuid] or 0)
        minutes = headroom / recent / 60.0
        per_rank: dict[str, Any] = {}
        relief: dict[int, RankRelief] = {}
        fixes: list[Fix] = []
        for r in ranks:
            fit: MemoryFit | None = i.fit.get(r)
            if fit is not None and (fit.r2 < t.min_r2 or fit.per_sample_bytes <= 0):
                fit = None
            memory = i.memory.get(r)
            budget = None
            if memory is not None and memory.activation_batch:
                batch = i.batch.get(r)
                budget = model_for(
                    memory,
                    batch=memory.activation_batch if batch is None else batch,
                    margin=1.0 - t.target_ratio,
                    world_size=i.world_size,
                    accumulated=i.accumulated.get(r, 1),
                )
            relief[r], per_rank[str(r)] = _rank_relief(i, r, uuid, fit, t.target_ratio, budget)
            fixes.extend(_rank_fixes(r, relief[r]))
        if not ranks:
            fixes = [*_generic_fixes(None, uuid)]
        findings.append(
            Finding(
                kind=KIND,
                severity="critical" if ratio >= t.critical_ratio else "warning",
                ranks=ranks,
                facts=Filling(
                    gpu=i.label[uuid],
                    peak_ratio=ratio,
                    total_bytes=i.total[uuid],
                    rise_bytes=rise,
                    span_s=i.span_s[uuid],
                    recent_bytes_per_s=recent,
                    minutes_to_full=minutes,
                    target_ratio=t.target_ratio,
                    ranks=relief,
                ),
                evidence={
                    "gpus": [i.ref[uuid]],
                    "mem_used_max_bytes": i.peak[uuid],
                    "mem_total_bytes": i.total[uuid],
                    "mem_ratio_max": round(ratio, 4),
                    "mem_trend_bytes_per_s": round(i.trend[uuid] or 0.0),
                    "mem_recent_trend_bytes_per_s": round(recent),
                    "rise_bytes": round(rise),
                    "minutes_to_full": round(minutes, 2),
                    "per_rank": per_rank,
                    "speedup_model": NOT_PREDICTED,
                },
                predicted_speedup=None,
                fixes=tuple(fixes),
                gpus=(uuid,),
            )
        )
    return findings


def _batches(view: RankView | None) -> list[int]:
    """The rank's batches, step by step, per micro-batch (the unit memory grows with)."""
    if view is None:
        return []
    return [round(s.micro_batch_size or 0) for s in view.steps if s.batch_size]


def _rank_relief(
    i: Inputs,
    r: int,
    uuid: str,
    fit: MemoryFit | None,
    target_ratio: float,
    budget: BudgetModel | None = None,
) -> tuple[RankRelief, dict[str, Any]]:
    current = i.batch.get(r)
    total = i.total[uuid]
    target_bytes = target_ratio * total
    peak = i.peak[uuid] or 0
    suggested: int | None = None
    basis = BASIS_UNKNOWN
    if current is not None and budget is not None and budget.per_sample_bytes:
        suggested = budget.largest_batch(budget.usable(target_bytes))
        basis = BASIS_BUDGET
    elif current is not None and fit is not None:
        suggested = fit.largest_batch(target_bytes)
        basis = BASIS_FIT
    elif current is not None and peak > 0:
        suggested = math.floor(current * target_bytes / peak)
        basis = BASIS_PROPORTIONAL
    smaller = (
        suggested
        if current is not None and suggested is not None and 0 < suggested < current
        else None
    )
    kept = current is not None and i.steady.get(r, False)
    accumulated = i.accumulated.get(r, 1)
    row: dict[str, Any] = {
        "current_batch": current,
        **({"micro_batches": accumulated} if accumulated > 1 else {}),
        "suggested_batch": suggested,
        "basis": basis,
        "target_bytes": round(target_bytes),
    }
    if budget is not None:
        row["budget"] = budget.evidence()
    return RankRelief(current, smaller, kept, budget, accumulated, basis), row


def _rank_fixes(r: int, relief: RankRelief) -> list[Fix]:
    """What the report says to change on rank ``r``: what is kept across steps, a smaller
    batch, the measured levers or else the usual ones."""
    fixes: list[Fix] = []
    if relief.kept_across_steps:
        fixes.append(Fix("retained_tensors", r, answers=(KIND,)))
    if relief.smaller_batch is not None:
        fixes.append(Fix("batch_size", r, relief.batch, relief.smaller_batch, None, (KIND,)))
    if relief.budget is not None and relief.budget.levers():
        fixes.extend(relief.budget.fixes(r, (KIND,)))
    else:
        fixes.extend(_generic_fixes(r))
    return fixes


def _generic_fixes(r: int | None, gpu: str | None = None) -> list[Fix]:
    """Gradient checkpointing and bf16 autocast, where no measured budget says more."""
    return [
        Fix("gradient_checkpointing", r, None, True, None, (KIND,), gpu),
        Fix("autocast_bf16", r, None, True, None, (KIND,), gpu),
    ]


def _host_short(i: Inputs, t: Thresholds) -> list[Finding]:
    """CPU ranks (a measured budget, no GPU) on a host whose available memory is short."""
    by_host: dict[str, list[int]] = {}
    for r, b in i.memory.items():
        if b.device_total_bytes or b.host_available_bytes is None:
            continue
        if not b.host_total_bytes or b.host_available_bytes >= t.host_short * b.host_total_bytes:
            continue
        by_host.setdefault(i.host[r], []).append(r)
    out: list[Finding] = []
    for host, ranks in sorted(by_host.items()):
        latest = max((i.memory[r] for r in ranks), key=lambda b: b.time)
        total = latest.host_total_bytes or 0
        avail = latest.host_available_bytes or 0
        ratio = avail / total if total else 0.0
        models: dict[int, BudgetModel] = {}
        per_rank: dict[str, Any] = {}
        fixes: list[Fix] = []
        for r in sorted(ranks):
            memory = i.memory[r]
            batch = i.batch.get(r)
            m = model_for(
                memory,
                batch=batch if batch is not None else memory.activation_batch,
                margin=1.0 - t.target_ratio,
                world_size=i.world_size,
                accumulated=i.accumulated.get(r, 1),
            )
            models[r] = m
            per_rank[str(r)] = m.evidence()
            fixes.extend(m.fixes(r, (KIND,)) or _generic_fixes(r))
        out.append(
            Finding(
                kind=KIND,
                severity="critical" if ratio < t.host_critical else "warning",
                ranks=tuple(sorted(ranks)),
                facts=HostShort(host, avail, total, ratio, models),
                evidence={
                    "gpus": [],
                    "host": host,
                    "host_total_bytes": total,
                    "host_available_bytes": avail,
                    "per_rank": per_rank,
                    "speedup_model": NOT_PREDICTED,
                },
                predicted_speedup=None,
                fixes=tuple(fixes),
            )
        )
    return out


RULE = Rule(
    kind=KIND,
    place=80,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=(),
)
