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

Speed-up: not predicted: this prevents a crash, it does not change the step time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..budget import BudgetModel, model_for
from ..devices import DeviceStats
from ..findings import Finding
from ..measures import MemoryFit, latest_micro_batch, rank_memory_fits
from ..snapshot import RankView, Snapshot

MIB = 1024**2
SPEEDUP_NOTE = "not predicted: prevents an out-of-memory crash, does not change the step time"


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


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_samples: int = 5,
    min_ratio: float = 0.90,
    critical_ratio: float = 0.97,
    min_rise_bytes: int = 256 * MIB,
    target_ratio: float = 0.85,
    min_r2: float = 0.8,
    host_short: float = 0.05,
    host_critical: float = 0.02,
) -> list[Finding]:
    """Find GPUs that are nearly full and still filling.

    Args:
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
    if snapshot.ranks and snapshot.most_steps < min_steps:
        return []
    owners = snapshot.owners
    fits = rank_memory_fits(snapshot, min_steps=min_steps, min_samples=min_samples)
    views = snapshot.view_of
    findings: list[Finding] = _host_short(
        snapshot, short=host_short, critical=host_critical, target_ratio=target_ratio
    )
    for uuid, d in snapshot.gpus_in_place:
        if d.lost or d.samples < min_samples or not d.mem_total_bytes:
            continue
        ratio = d.mem_ratio_max
        rise = d.mem_rise_bytes
        recent = d.mem_recent_trend_bytes_per_s
        if ratio is None or ratio < min_ratio or rise is None or rise < min_rise_bytes:
            continue
        if recent is None or recent <= 0:
            continue
        ranks = tuple(owners.get(uuid, ()))
        headroom = d.mem_total_bytes - (d.mem_used_max_bytes or 0)
        minutes = headroom / recent / 60.0
        per_rank: dict[str, Any] = {}
        relief: dict[int, RankRelief] = {}
        for r in ranks:
            fit: MemoryFit | None = fits[r][0] if r in fits else None
            if fit is not None and (fit.r2 < min_r2 or fit.per_sample_bytes <= 0):
                fit = None
            view = views.get(r)
            budget = None
            if view is not None and view.memory is not None and view.memory.activation_batch:
                budget = model_for(
                    view.memory,
                    batch=(_batches(view) or [view.memory.activation_batch])[-1],
                    margin=1.0 - target_ratio,
                    world_size=snapshot.world_size,
                    accumulated=latest_micro_batch(view)[1],
                )
            relief[r], per_rank[str(r)] = _rank_relief(view, d, fit, target_ratio, budget)
        findings.append(
            Finding(
                kind="memory_pressure",
                severity="critical" if ratio >= critical_ratio else "warning",
                ranks=ranks,
                facts=Filling(
                    gpu=d.label,
                    peak_ratio=ratio,
                    total_bytes=d.mem_total_bytes,
                    rise_bytes=rise,
                    span_s=d.span_s,
                    recent_bytes_per_s=recent,
                    minutes_to_full=minutes,
                    target_ratio=target_ratio,
                    ranks=relief,
                ),
                evidence={
                    "gpus": [d.ref],
                    "mem_used_max_bytes": d.mem_used_max_bytes,
                    "mem_total_bytes": d.mem_total_bytes,
                    "mem_ratio_max": round(ratio, 4),
                    "mem_trend_bytes_per_s": round(d.mem_trend_bytes_per_s or 0.0),
                    "mem_recent_trend_bytes_per_s": round(recent),
                    "rise_bytes": round(rise),
                    "minutes_to_full": round(minutes, 2),
                    "per_rank": per_rank,
                    "speedup_model": SPEEDUP_NOTE,
                },
                predicted_speedup=None,
            )
        )
    return findings


def _batches(view: RankView | None) -> list[int]:
    """The rank's batches, step by step, per micro-batch (the unit memory grows with)."""
    if view is None:
        return []
    return [round(s.micro_batch_size or 0) for s in view.steps if s.batch_size]


def _rank_relief(
    view: RankView | None,
    d: DeviceStats,
    fit: MemoryFit | None,
    target_ratio: float,
    budget: BudgetModel | None = None,
) -> tuple[RankRelief, dict[str, Any]]:
    batches = _batches(view)
    current = batches[-1] if batches else None
    total = d.mem_total_bytes or 0
    target_bytes = target_ratio * total
    peak = d.mem_used_max_bytes or 0
    suggested: int | None = None
    basis = "unknown batch"
    if current is not None and budget is not None and budget.per_sample_bytes:
        suggested = budget.largest_batch(budget.usable(target_bytes))
        basis = "measured budget: fixed part + batch x activations per sample"
    elif current is not None and fit is not None:
        suggested = fit.largest_batch(target_bytes)
        basis = "fitted memory = a + b * batch"
    elif current is not None and peak > 0:
        suggested = math.floor(current * target_bytes / peak)
        basis = "memory assumed in proportion to the batch (overstates the saving)"
    smaller = (
        suggested
        if current is not None and suggested is not None and 0 < suggested < current
        else None
    )
    kept = current is not None and len(set(batches)) == 1
    accumulated = latest_micro_batch(view)[1]
    row: dict[str, Any] = {
        "current_batch": current,
        **({"micro_batches": accumulated} if accumulated > 1 else {}),
        "suggested_batch": suggested,
        "basis": basis,
        "target_bytes": round(target_bytes),
    }
    if budget is not None:
        row["budget"] = budget.evidence()
    return RankRelief(current, smaller, kept, budget, accumulated), row


def _host_short(
    snapshot: Snapshot, *, short: float, critical: float, target_ratio: float
) -> list[Finding]:
    """CPU ranks (a measured budget, no GPU) on a host whose available memory is short."""
    by_host: dict[str, list[RankView]] = {}
    for v in snapshot.ranks:
        b = v.memory
        if b is None or b.device_total_bytes or b.host_available_bytes is None:
            continue
        if not b.host_total_bytes or b.host_available_bytes >= short * b.host_total_bytes:
            continue
        by_host.setdefault(v.info.host, []).append(v)
    out: list[Finding] = []
    for host, views in sorted(by_host.items()):
        latest = max((v.memory for v in views if v.memory is not None), key=lambda b: b.time)
        total = latest.host_total_bytes or 0
        avail = latest.host_available_bytes or 0
        ratio = avail / total if total else 0.0
        models: dict[int, BudgetModel] = {}
        per_rank: dict[str, Any] = {}
        for v in sorted(views, key=lambda v: v.info.rank):
            assert v.memory is not None
            batches = _batches(v)
            m = model_for(
                v.memory,
                batch=batches[-1] if batches else v.memory.activation_batch,
                margin=1.0 - target_ratio,
                world_size=snapshot.world_size,
                accumulated=latest_micro_batch(v)[1],
            )
            models[v.info.rank] = m
            per_rank[str(v.info.rank)] = m.evidence()
        ranks = tuple(sorted(v.info.rank for v in views))
        out.append(
            Finding(
                kind="memory_pressure",
                severity="critical" if ratio < critical else "warning",
                ranks=ranks,
                facts=HostShort(host, avail, total, ratio, models),
                evidence={
                    "gpus": [],
                    "host": host,
                    "host_total_bytes": total,
                    "host_available_bytes": avail,
                    "per_rank": per_rank,
                    "speedup_model": SPEEDUP_NOTE,
                },
                predicted_speedup=None,
            )
        )
    return out
