"""memory_headroom in words: how large a batch fits, or why the current one does not, from the
fitted memory or the measured budget."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from auditor.analysis.budget import (
    DEVICE_LESS_OUTSIDE,
    DEVICE_TOTAL,
    HOST_SHARE,
    UNKNOWN,
    BudgetModel,
)
from auditor.analysis.findings import Finding
from auditor.analysis.rules.memory_headroom import (
    HELD_BY_GROWTH,
    BudgetFacts,
    FitFacts,
    FitRank,
    FitTerms,
    HeldFacts,
    HeldRank,
)
from auditor.wording import fmt_bytes, fmt_gib, ranks_text

from .words import (
    Phrase,
    batch_noun,
    levers_text,
    parts_text,
    per_micro,
    phrase_facts,
    s_if_one,
)

SPEEDUP_NOTE = "not predicted: a larger batch is faster only while the GPU is not saturated"
# A measured budget's evidence codes (:meth:`BudgetModel.evidence`), as the JSON report words
# them.
BUDGET_SOURCE_TEXT = {"budget": "measured budget (probe)"}
CAPACITY_TEXT = {
    DEVICE_TOTAL: "device total (its CUDA context not measured)",
    DEVICE_LESS_OUTSIDE: "device total less what the CUDA context and other processes hold",
    HOST_SHARE: "host memory available per rank",
    UNKNOWN: "unknown",
}


def budget_words(row: Mapping[str, Any]) -> dict[str, Any]:
    """A measured budget's evidence (:meth:`BudgetModel.evidence`) with its codes in words."""
    out = dict(row)
    source, cap = out.get("source"), out.get("capacity_source")
    if isinstance(source, str) and source in BUDGET_SOURCE_TEXT:
        out["source"] = BUDGET_SOURCE_TEXT[source]
    if isinstance(cap, str) and cap in CAPACITY_TEXT:
        out["capacity_source"] = CAPACITY_TEXT[cap]
    return out


def _rows_in_words(finding: Finding, budgets: bool) -> dict[str, object]:
    """The notes: the speed-up model and, for measured budgets, each rank's codes in words."""
    notes: dict[str, object] = {"speedup_model": SPEEDUP_NOTE}
    per_rank = finding.evidence.get("per_rank")
    if budgets and isinstance(per_rank, Mapping):
        notes["per_rank"] = {r: budget_words(row) for r, row in per_rank.items()}
    return notes


@phrase_facts.register
def _fitted(facts: FitFacts, finding: Finding) -> Phrase:
    rows = facts.ranks
    first = rows[min(rows)]
    margin = facts.margin
    if facts.verdict == "roomy":
        summary = (
            f"{ranks_text(rows)} use{s_if_one(rows)} at most "
            f"{fmt_gib(first.peak_bytes)} of {fmt_gib(first.total_bytes)} on "
            f"{first.gpu}: a {batch_noun(first.accumulated)} of up to {first.largest_batch} "
            f"fits (now {first.batch}{_accumulated(first.accumulated)})"
        )
        fixes = {r: _roomy_fit_fix(row, margin) for r, row in rows.items()}
        return Phrase(summary, fixes, _rows_in_words(finding, False))
    summary = (
        f"{ranks_text(rows)}: {batch_noun(first.accumulated)} {first.batch} does not fit "
        f"{first.gpu} with a {margin:.0%} margin{_accumulated(first.accumulated, ',')} "
        f"({fmt_gib(first.predicted_bytes)} of {fmt_gib(first.total_bytes)})"
    )
    fixes = {r: _tight_fit_fix(row) for r, row in rows.items()}
    return Phrase(summary, fixes, _rows_in_words(finding, False))


def _fit_text(fit: FitTerms) -> str:
    return (
        f"memory = {fmt_gib(fit.fixed_bytes)} + {fit.per_sample_bytes / 1024**2:.0f} MiB "
        "per sample "
        f"(r2 {fit.r2:.2f} over batches {', '.join(str(b) for b in fit.batch_sizes)})"
    )


def _roomy_fit_fix(row: FitRank, margin: float) -> str:
    return (
        f"batch_size {row.batch} -> up to {row.largest_batch}{per_micro(row.accumulated)} fits "
        f"{row.gpu} with a {margin:.0%} margin ({_fit_text(row.fit)}); raise it only while "
        "throughput still grows (the GPU is not yet saturated) and scale the learning rate "
        "with it"
    )


def _tight_fit_fix(row: FitRank) -> str:
    noun = batch_noun(row.accumulated)
    parts = [
        f"{noun} {row.batch}{_accumulated(row.accumulated, ',')} needs about "
        f"{fmt_gib(row.predicted_bytes)} of {fmt_gib(row.budget_bytes)} "
        f"usable on {row.gpu} ({_fit_text(row.fit)})"
    ]
    if row.model_is_lever:
        parts.append(
            f"the model part alone is {fmt_gib(row.model_bytes)}: the batch is not the lever; use "
            "an optimizer with less state (Adam keeps 4x the parameters, SGD with momentum 3x) "
            "or shard parameters, gradients and optimizer state (FSDP / ZeRO)"
        )
    else:
        parts.append(
            f"gradient checkpointing (torch.utils.checkpoint on the largest blocks, about a "
            f"third more compute) fits up to {noun} {row.largest_batch_checkpointing}; "
            "mixed precision (torch.autocast(device_type='cuda', dtype=torch.bfloat16)) fits "
            f"up to {row.largest_batch_mixed_precision}; or batch_size "
            f"{row.batch} -> {row.largest_batch}{per_micro(row.accumulated)}"
        )
    return "; ".join(parts)


@phrase_facts.register
def _budgeted(facts: BudgetFacts, finding: Finding) -> Phrase:
    models = facts.ranks
    first = models[min(models)]
    margin = facts.margin
    if facts.verdict == "roomy":
        room = (
            f"a {batch_noun(first.accumulated)} of up to {first.largest_batch()} fits "
            f"(now {first.batch}{_accumulated(first.accumulated)})"
            if first.budget.device_total_bytes
            else "memory does not limit the batch"
        )
        summary = (
            f"{ranks_text(models)} hold{s_if_one(models)} "
            f"{fmt_bytes(first.current_bytes)} of {fmt_bytes(first.capacity_bytes)} usable: {room}"
        )
        fixes = {r: _roomy_budget_fix(m, margin) for r, m in models.items()}
        return Phrase(summary, fixes, _rows_in_words(finding, True))
    summary = (
        f"{ranks_text(models)}: {batch_noun(first.accumulated)} {first.batch} does not fit "
        f"with a {margin:.0%} margin{_accumulated(first.accumulated, ',')} "
        f"({fmt_bytes(first.current_bytes)} of {fmt_bytes(first.capacity_bytes)} usable)"
    )
    fixes = {r: _tight_budget_fix(m) for r, m in models.items()}
    return Phrase(summary, fixes, _rows_in_words(finding, True))


def _where(model: BudgetModel) -> str:
    if model.budget.device_total_bytes:
        return f"the GPU's {fmt_bytes(model.budget.device_total_bytes)}"
    return "this rank's share of the host's available memory"


def _roomy_budget_fix(m: BudgetModel, margin: float) -> str:
    """On a GPU, the largest batch that fits; on a CPU job only what the rank holds: the host's
    memory would "fit" an absurd batch (millions of samples), and on a CPU the batch is sized
    by throughput, not memory. The evidence keeps the figure either way."""
    if not m.budget.device_total_bytes:
        return (
            f"nothing to change for memory: {batch_noun(m.accumulated)} {m.batch}"
            f"{_accumulated(m.accumulated, ',')} holds {fmt_bytes(m.current_bytes)} "
            f"({parts_text(m)}) of {fmt_bytes(m.capacity_bytes)} usable; on a CPU the batch is "
            "sized by throughput, not memory"
        )
    return (
        f"batch_size {m.batch} -> up to {m.largest_batch()}{per_micro(m.accumulated)} fits "
        f"{_where(m)} with a "
        f"{margin:.0%} margin ({parts_text(m)}); raise it only while throughput still grows and "
        "scale the learning rate with it"
    )


def _tight_budget_fix(m: BudgetModel) -> str:
    lever = "the fixed part" if m.main_lever == "fixed" else "the activations"
    return (
        f"{batch_noun(m.accumulated)} {m.batch}{_accumulated(m.accumulated, ',')} needs "
        f"about {fmt_bytes(m.current_bytes)} of "
        f"{fmt_bytes(m.capacity_bytes)} usable ({_where(m)}; {parts_text(m)}); the lever "
        f"is {lever}: {levers_text(m)}"
    )


# Why a rank's verdict is held back, in words.
HELD_TEXT = {
    HELD_BY_GROWTH: "its memory climbs (memory_growth)",
}


@phrase_facts.register
def _held(facts: HeldFacts, finding: Finding) -> Phrase:
    rows = facts.ranks
    first = rows[min(rows)]
    why = HELD_TEXT.get(first.reason, first.reason)
    summary = (
        f"{ranks_text(rows)}: no batch advice while {why}: memory measured now says nothing "
        "about the batch the rank can afford"
    )
    fixes = {r: _held_fix(row) for r, row in rows.items()}
    return Phrase(summary, fixes, {"speedup_model": SPEEDUP_NOTE})


def _held_fix(row: HeldRank) -> str:
    why = HELD_TEXT.get(row.reason, row.reason)
    noun = batch_noun(row.accumulated)
    keep = f"keep {noun} {row.batch}" if row.batch is not None else f"keep the {noun}"
    if row.verdict == "roomy":
        room = (
            f"; today's level would fit up to {row.largest_batch}, but the climb is using up "
            "that room"
            if row.largest_batch is not None and row.on_gpu
            else ""
        )
        return f"{keep}: no larger {noun} while {why}{room}; fix the climb first"
    return (
        f"no advice on {noun} {row.batch} while {why}: the level it is judged at keeps rising; "
        f"fix the climb first, then size the {noun} again"
    )


def _accumulated(accumulated: int, sep: str = ";") -> str:
    """``"; 4 accumulated per step"`` after a micro-batch under gradient accumulation (one
    micro-batch's activations are alive at a time); nothing without."""
    return f"{sep} {accumulated} accumulated per step" if accumulated > 1 else ""
