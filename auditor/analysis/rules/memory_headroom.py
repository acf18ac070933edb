"""memory_headroom: how large a batch fits, measured instead of guessed.

Model (DOMAIN.md): memory in use = a fixed part (parameters, gradients, optimizer state) plus the
batch size times a per-sample part (the activations kept for backward). Fitted per rank by least
squares, ``mem = a + b * batch``, from the steps of the window whose batch size varied (a batch
ramp, a last partial batch, variable-length inputs), with at least two distinct batch sizes and
``r2 >= min_r2``. Memory per step is, in order of preference: the probe's per-step peak
(``torch.cuda.max_memory_allocated``), its allocated memory, or the NVML memory of the rank's GPU
matched by time to the batch in progress. NVML sees the caching allocator's reserved memory,
which does not shrink when the batch does; the probe's figures are therefore preferred, and the
gap between NVML's peak and the fitted allocator peak (CUDA context, allocator cache and
fragmentation) is added back as an overhead. The budget is the GPU's total less a safety
``margin``; the largest batch that fits is ``floor((budget - a - overhead) / b)``.

Decisions, per rank whose GPU's total memory is known:

* underused (``info``): the peak in the window is below ``underused`` of the total; the evidence
  names the largest batch that fits. A larger batch raises throughput only while the GPU is not
  yet saturated, halves the optimizer steps per epoch when doubled, and usually wants a larger
  learning rate: the fix says so.
* tight (``warning``): even the current batch does not fit within the budget, so a slightly
  larger input runs out of memory; suggested: gradient checkpointing (activations cut by the
  conservative end of the usual 4-10x, here 4x) and mixed precision (activations about halved),
  with the batch each allows; where the fixed part alone takes half the budget, the batch is not
  the lever: optimizer state (Adam keeps 4x the parameters, SGD 2-3x) and sharding are.
  Ranks an earlier ``memory_pressure`` finding already blamed are left to it.

Measured budget (preferred where the probe sent one, :mod:`auditor.analysis.budget`): no fit
and no batch variation needed. The fixed part (parameters, gradients, optimizer state, buffers,
modules outside the model) and the activations per sample are measured; the capacity is the
GPU's total less the margin, or on a CPU job the rank's share of the host's available memory.
Under gradient accumulation the batch is the micro-batch (the DataLoader's batch): one
micro-batch's activations are alive at a time, so memory is fitted and advised against it.
The same two verdicts follow from ``fixed + batch x per_sample`` against the capacity, and the
evidence carries what each lever frees per rank (:meth:`~auditor.analysis.budget.BudgetModel.
levers`) and which one is the lever (fixed part or activations). On a CPU job both stay ``info``
unless the host is short of memory (available below ``host_short`` of its total).

Fixes (:class:`~auditor.analysis.fixes.Fix`), per rank: underused on a GPU, ``batch_size``
current -> the largest that fits (none on a CPU job: its batch is sized by throughput); tight,
by the fit, ``gradient_checkpointing``, ``autocast_bf16`` and ``batch_size`` current -> the
largest that fits, or where the model part is the lever ``optimizer`` and ``sharding``; tight,
by the budget, its largest levers (:meth:`~auditor.analysis.budget.BudgetModel.fixes`).
Evidence codes (the report words them): a budget's ``source`` and ``capacity_source``,
``speedup_model`` ``not_predicted``.

Held back: a rank whose memory climbs (a ``memory_growth`` finding names it) gets neither verdict.
Its memory today says nothing about the batch it can afford (the climb takes the room a larger
batch would use, and a leak skews the fit), so no batch is proposed there; where a verdict
would have been given, an ``info`` finding (:class:`HeldFacts`) names the rank with the reason
code :data:`HELD_BY_GROWTH` and what the verdict would have been, and proposes nothing.

Speed-up: not predicted: whether a larger batch is faster depends on the GPU's saturation.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from auditor.samples import MemoryBudget

from ..budget import BudgetModel, host_short, model_for
from ..findings import Finding
from ..fixes import Fix
from ..measures import NOT_PREDICTED, MemoryFit, latest_micro_batch, rank_memory_fits
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "memory_headroom"
# Gradient checkpointing commonly allows 4-10x larger batches; the conservative end is used.
CHECKPOINT_FACTOR = 4.0
MIXED_PRECISION_FACTOR = 2.0

# roomy: a larger batch fits (info); tight: the current batch does not fit the budget.
Verdict = Literal["roomy", "tight"]
# Why a rank's verdict is held back (the report words it): its memory climbs (memory_growth).
HELD_BY_GROWTH = "memory_growth"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_samples: NVML samples a GPU needs in the window before it is judged.
    min_r2: least goodness of the ``a + b * batch`` fit that is trusted.
    margin: share of the GPU's total kept free as a safety margin (0.10 = 10%).
    underused: peak memory below this share of the total counts as underused.
    host_short: on a CPU job, host memory available below this share of its total is
        short (findings then warn; otherwise they stay ``info``).
    """

    min_steps: int = 8
    min_samples: int = 5
    min_r2: float = 0.8
    margin: float = 0.10
    underused: float = 0.60
    host_short: float = 0.05


@dataclass(frozen=True)
class Inputs:
    """Per rank with a measured budget whose activations were sampled: that budget, its
    latest micro-batch (None where no step had a batch) and micro-batches per step. Per ready
    rank with a memory fit: the fit, its (heaviest) GPU (None: none measured), its latest
    micro-batch and micro-batches per step. Per GPU of those: its label, reference, total and
    peak memory. The job's world size."""

    budget: Mapping[int, MemoryBudget]
    budget_batch: Mapping[int, int | None]
    budget_accumulated: Mapping[int, int]
    fit: Mapping[int, MemoryFit]
    fit_gpu: Mapping[int, str | None]
    batch: Mapping[int, int | None]
    accumulated: Mapping[int, int]
    label: Mapping[str, str]
    ref: Mapping[str, Mapping[str, Any]]
    total: Mapping[str, int | None]
    peak: Mapping[str, int | None]
    world_size: int


@dataclass(frozen=True)
class FitTerms:
    """A rank's fitted ``memory = fixed + per_sample x batch`` as its evidence rounds it, the
    fit's r2 and the batch sizes it was fitted over."""

    fixed_bytes: int
    per_sample_bytes: int
    r2: float
    batch_sizes: tuple[int, ...]


@dataclass(frozen=True)
class FitRank:
    """A rank judged by its fit on its GPU: its batch and what fits. Where the batch does not
    fit, the model part (fixed part and overhead), whether it rather than the batch is the
    lever (half the budget or more), and the batch each activation lever allows."""

    gpu: str
    batch: int
    largest_batch: int | None
    peak_bytes: float
    total_bytes: int
    budget_bytes: int
    predicted_bytes: int
    fit: FitTerms
    model_bytes: int = 0
    model_is_lever: bool = False
    largest_batch_checkpointing: int | None = None
    largest_batch_mixed_precision: int | None = None
    # Micro-batches per step: the batches above are then per micro-batch.
    accumulated: int = 1


@dataclass(frozen=True)
class FitFacts:
    """The verdict on ranks judged by their fitted memory, and the share of the GPU kept free."""

    verdict: Verdict
    margin: float
    ranks: Mapping[int, FitRank]


@dataclass(frozen=True)
class HeldRank:
    """A rank whose verdict is held back: the verdict it would have had, its batch and the
    largest batch its memory today would fit (None where unknown), and why (a code:
    :data:`HELD_BY_GROWTH`); whether it is on a GPU (on a CPU job the batch is sized by
    throughput, not memory)."""

    verdict: Verdict
    batch: int | None
    largest_batch: int | None
    reason: str = HELD_BY_GROWTH
    accumulated: int = 1
    on_gpu: bool = True


@dataclass(frozen=True)
class HeldFacts:
    """The ranks whose verdict is held back, and why."""

    ranks: Mapping[int, HeldRank]


@dataclass(frozen=True)
class BudgetFacts:
    """The verdict on ranks judged by their measured budget, and the safety margin."""

    verdict: Verdict
    margin: float
    ranks: Mapping[int, BudgetModel]


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    measured = [
        v
        for v in snapshot.ranks
        if v.memory is not None and v.memory.activations_per_sample is not None
    ]
    latest = {v.info.rank: latest_micro_batch(v) for v in measured}
    fits = rank_memory_fits(snapshot, min_steps=t.min_steps, min_samples=t.min_samples)
    view_of = snapshot.view_of if fits else {}
    fitted = {r: latest_micro_batch(view_of.get(r)) for r in fits}
    gpus = {g.uuid: g for _, g in fits.values() if g is not None}
    if not measured and not fits:
        return None
    return Inputs(
        budget={v.info.rank: v.memory for v in measured if v.memory is not None},
        budget_batch={r: m for r, (m, _) in latest.items()},
        budget_accumulated={r: a for r, (_, a) in latest.items()},
        fit={r: f for r, (f, _) in fits.items()},
        fit_gpu={r: None if g is None else g.uuid for r, (_, g) in fits.items()},
        batch={r: m for r, (m, _) in fitted.items()},
        accumulated={r: a for r, (_, a) in fitted.items()},
        label={u: g.label for u, g in gpus.items()},
        ref={u: g.ref for u, g in gpus.items()},
        total={u: g.mem_total_bytes for u, g in gpus.items()},
        peak={u: g.mem_used_max_bytes for u, g in gpus.items()},
        world_size=snapshot.world_size,
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Say how large a batch fits, where memory is underused or too tight. Ranks an explaining
    ``memory_pressure`` finding blames are left to it where their batch does not fit; ranks a
    ``memory_growth`` finding names are held back (no batch proposed, the reason said)."""
    pressured = {r for f in explained.findings if f.kind == "memory_pressure" for r in f.ranks}
    growing = {r for f in explained.findings if f.kind == "memory_growth" for r in f.ranks}
    held: dict[int, HeldRank] = {}
    margin = t.margin
    budgeted = budget_models(i, margin=margin)
    findings: list[Finding] = _from_budgets(
        {r: m for r, m in budgeted.items() if r not in growing},
        pressured,
        margin=margin,
        underused=t.underused,
        short_ratio=t.host_short,
    )
    for r in sorted(growing & set(budgeted)):
        m = budgeted[r]
        would = _budget_verdict(m, pressured, t.underused)
        if would is not None:
            held[r] = HeldRank(
                would,
                m.batch,
                m.largest_batch(),
                accumulated=m.accumulated,
                on_gpu=bool(m.budget.device_total_bytes),
            )
    roomy: dict[int, dict[str, Any]] = {}
    tight: dict[int, dict[str, Any]] = {}
    gpus: dict[int, str] = {}
    for r, fit in sorted(i.fit.items()):
        current, accumulated = i.batch[r], i.accumulated[r]
        if r in budgeted:
            continue  # measured: the budget's verdict stands
        uuid = i.fit_gpu[r]
        if uuid is None or not i.total[uuid] or current is None:
            continue
        if fit.per_sample_bytes <= 0 or fit.r2 < t.min_r2:
            continue
        total = i.total[uuid] or 0
        budget = (1.0 - margin) * total
        peak = i.peak[uuid]
        if peak is None:
            peak = round(fit.predict(max(fit.batches)))
        row: dict[str, Any] = {
            **fit.evidence(),
            "gpu": i.ref[uuid],
            "current_batch": current,
            **({"micro_batches": accumulated} if accumulated > 1 else {}),
            "peak_bytes": peak,
            "total_bytes": total,
            "budget_bytes": round(budget),
            "predicted_at_current_bytes": round(fit.predict(current)),
        }
        largest = fit.largest_batch(budget)
        row["largest_batch"] = largest
        verdict: Verdict | None = None
        if peak < t.underused * total and largest is not None and largest > current:
            verdict = "roomy"
        elif fit.predict(current) > budget and r not in pressured:
            verdict = "tight"
        if verdict is None:
            continue
        if r in growing:
            held[r] = HeldRank(verdict, current, largest, accumulated=accumulated)
            continue
        if verdict == "roomy":
            roomy[r] = row
        else:
            row["largest_batch_checkpointing"] = fit.largest_batch(budget, CHECKPOINT_FACTOR)
            row["largest_batch_mixed_precision"] = fit.largest_batch(budget, MIXED_PRECISION_FACTOR)
            tight[r] = row
        gpus[r] = uuid
    if roomy:
        findings.append(_finding(i, "roomy", roomy, gpus, margin))
    if tight:
        findings.append(_finding(i, "tight", tight, gpus, margin))
    if held:
        findings.append(_held_finding(held))
    return findings


def _budget_verdict(m: BudgetModel, pressured: Collection[int], underused: float) -> Verdict | None:
    """The verdict :func:`_from_budgets` would give this rank (None: none)."""
    current, cap, largest = m.current_bytes, m.capacity_bytes, m.largest_batch()
    if current is None or cap is None or m.batch is None:
        return None
    if current > cap:
        return None if m.rank in pressured else "tight"
    if current < underused * cap and largest is not None and largest > m.batch:
        return "roomy"
    return None


def _held_finding(held: Mapping[int, HeldRank]) -> Finding:
    """Ranks whose verdict is held back: named, with the reason, proposing nothing."""
    return Finding(
        kind=KIND,
        severity="info",
        ranks=tuple(sorted(held)),
        facts=HeldFacts(dict(sorted(held.items()))),
        evidence={
            "held_back": {
                str(r): {
                    "reason": h.reason,
                    "verdict": h.verdict,
                    "current_batch": h.batch,
                    "largest_batch": h.largest_batch,
                }
                for r, h in sorted(held.items())
            },
            "speedup_model": NOT_PREDICTED,
        },
        predicted_speedup=None,
    )


def _fit_rank(row: dict[str, Any], gpu: str, verdict: Verdict) -> FitRank:
    """A rank's facts from its evidence row, so the words say the figures the record holds."""
    fit = FitTerms(
        row["fixed_bytes"], row["per_sample_bytes"], row["r2"], tuple(row["batch_sizes"])
    )
    model = row["fixed_bytes"] + row["overhead_bytes"]
    return FitRank(
        gpu=gpu,
        batch=row["current_batch"],
        largest_batch=row["largest_batch"],
        peak_bytes=row["peak_bytes"],
        total_bytes=row["total_bytes"],
        budget_bytes=row["budget_bytes"],
        predicted_bytes=row["predicted_at_current_bytes"],
        fit=fit,
        model_bytes=model,
        model_is_lever=verdict == "tight" and model >= 0.5 * row["budget_bytes"],
        largest_batch_checkpointing=row.get("largest_batch_checkpointing"),
        largest_batch_mixed_precision=row.get("largest_batch_mixed_precision"),
        accumulated=row.get("micro_batches", 1),
    )


def _fit_fixes(r: int, rank: FitRank, verdict: Verdict, gpu: str) -> list[Fix]:
    """What the report says to change on a rank judged by its fit."""
    answers = (KIND,)
    if verdict == "roomy":
        return [Fix("batch_size", r, rank.batch, rank.largest_batch, None, answers, gpu)]
    if rank.model_is_lever:
        return [
            Fix("optimizer", r, None, None, None, answers, gpu),
            Fix("sharding", r, None, True, None, answers, gpu),
        ]
    return [
        Fix("gradient_checkpointing", r, None, True, None, answers, gpu),
        Fix("autocast_bf16", r, None, True, None, answers, gpu),
        Fix("batch_size", r, rank.batch, rank.largest_batch, None, answers, gpu),
    ]


def _finding(
    i: Inputs,
    verdict: Verdict,
    rows: dict[int, dict[str, Any]],
    gpus: dict[int, str],
    margin: float,
) -> Finding:
    """Both verdicts carry the same evidence: the fit per rank, its GPU and the margin."""
    ranks = {r: _fit_rank(row, i.label[gpus[r]], verdict) for r, row in rows.items()}
    fixes = [fx for r in sorted(rows) for fx in _fit_fixes(r, ranks[r], verdict, gpus[r])]
    return Finding(
        kind=KIND,
        severity="info" if verdict == "roomy" else "warning",
        ranks=tuple(sorted(rows)),
        facts=FitFacts(verdict, margin, ranks),
        evidence={
            "gpus": [i.ref[gpus[r]] for r in sorted(rows)],
            "per_rank": {str(r): row for r, row in sorted(rows.items())},
            "margin": margin,
            "speedup_model": NOT_PREDICTED,
        },
        predicted_speedup=None,
        fixes=tuple(fixes),
        gpus=tuple(dict.fromkeys(gpus[r] for r in sorted(rows))),
    )


def budget_models(i: Inputs, *, margin: float) -> dict[int, BudgetModel]:
    """Each rank's measured budget against its capacity, where the probe measured the
    activations (the per-sample part) and the capacity is known."""
    out: dict[int, BudgetModel] = {}
    for r, b in i.budget.items():
        micro, accumulated = i.budget_batch[r], i.budget_accumulated[r]
        batch = micro or b.activation_batch
        model = model_for(
            b, batch=batch, margin=margin, world_size=i.world_size, accumulated=accumulated
        )
        if model.capacity_bytes is not None and batch:
            out[r] = model
    return out


def _from_budgets(
    models: dict[int, BudgetModel],
    pressured: Collection[int],
    *,
    margin: float,
    underused: float,
    short_ratio: float,
) -> list[Finding]:
    """The two verdicts from the measured budgets."""
    roomy: dict[int, BudgetModel] = {}
    tight: dict[int, BudgetModel] = {}
    for r, m in sorted(models.items()):
        verdict = _budget_verdict(m, pressured, underused)
        if verdict == "tight":
            tight[r] = m
        elif verdict == "roomy":
            roomy[r] = m
    out: list[Finding] = []
    if roomy:
        out.append(_budget_finding("roomy", "info", roomy, margin))
    if tight:
        gpu = any(m.budget.device_total_bytes for m in tight.values())
        short = any(host_short(m.budget, short_ratio) for m in tight.values())
        out.append(_budget_finding("tight", "warning" if gpu or short else "info", tight, margin))
    return out


def _budget_fixes(verdict: Verdict, models: Mapping[int, BudgetModel]) -> list[Fix]:
    """Roomy on a GPU: the largest batch that fits (on a CPU job nothing: its batch is sized by
    throughput); tight: the largest levers."""
    fixes: list[Fix] = []
    for r, m in sorted(models.items()):
        if verdict == "tight":
            fixes.extend(m.fixes(r, (KIND,)))
        elif m.budget.device_total_bytes:
            fixes.append(Fix("batch_size", r, m.batch, m.largest_batch(), None, (KIND,)))
    return fixes


def _budget_finding(
    verdict: Verdict, severity: str, models: dict[int, BudgetModel], margin: float
) -> Finding:
    return Finding(
        kind=KIND,
        severity=severity,
        ranks=tuple(sorted(models)),
        facts=BudgetFacts(verdict, margin, dict(models)),
        evidence={
            "gpus": [],
            "per_rank": {str(r): m.evidence() for r, m in sorted(models.items())},
            "margin": margin,
            "speedup_model": NOT_PREDICTED,
        },
        predicted_speedup=None,
        fixes=tuple(_budget_fixes(verdict, models)),
    )


RULE = Rule(
    kind=KIND,
    place=90,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=("memory_pressure", "memory_growth"),
)
