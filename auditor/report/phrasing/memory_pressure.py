"""memory_pressure in words: a GPU filling up (how full, how fast, when full) or a CPU job's host
short of memory, and what each rank can change: a smaller batch, the measured levers, or the
usual remedies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from auditor.analysis.findings import Finding
from auditor.analysis.rules.memory_pressure import Filling, HostShort, RankRelief
from auditor.wording import MIB, fmt_bytes, fmt_gib

from .memory_headroom import budget_words
from .words import Phrase, levers_text, parts_text, per_micro, phrase_facts

SPEEDUP_NOTE = "not predicted: prevents an out-of-memory crash, does not change the step time"
# How each rank's suggested batch was sized (the evidence's ``basis`` codes), in words.
BASIS_TEXT = {
    "budget": "measured budget: fixed part + batch x activations per sample",
    "fit": "fitted memory = a + b * batch",
    "proportional": "memory assumed in proportion to the batch (overstates the saving)",
    "unknown_batch": "unknown batch",
}


@phrase_facts.register
def _filling(facts: Filling, finding: Finding) -> Phrase:
    ranks = finding.ranks
    summary = (
        f"{facts.gpu} is {facts.peak_ratio:.0%} full and still rising "
        f"({fmt_gib(facts.rise_bytes)} over {facts.span_s:.0f} s)"
        + (f" on rank {', '.join(str(r) for r in ranks)}" if ranks else "")
    )
    state = (
        f"{facts.gpu} peaks at {facts.peak_ratio:.0%} of {fmt_gib(facts.total_bytes)} and rises "
        f"{facts.recent_bytes_per_s * 60 / MIB:.0f} MiB/min "
        f"(full in about {facts.minutes_to_full:.0f} min)"
    )
    fixes = {
        r: f"{state}: {_rank_fix(rank, facts.target_ratio)}" for r, rank in facts.ranks.items()
    }
    notes: dict[str, object] = {"speedup_model": SPEEDUP_NOTE}
    rows = finding.evidence.get("per_rank")
    if isinstance(rows, Mapping):
        notes["per_rank"] = {r: _row_words(row) for r, row in rows.items()}
    # A GPU no rank owns: no rank's fix says it, so the evidence does.
    notes["fix"] = None if ranks else f"{state}: {_generic_fix()}"
    return Phrase(summary, fixes, notes)


def _row_words(row: Mapping[str, Any]) -> dict[str, Any]:
    """A rank's evidence row with its codes in words."""
    out = dict(row)
    basis = out.get("basis")
    if isinstance(basis, str) and basis in BASIS_TEXT:
        out["basis"] = BASIS_TEXT[basis]
    if isinstance(out.get("budget"), Mapping):
        out["budget"] = budget_words(out["budget"])
    return out


def _rank_fix(rank: RankRelief, target_ratio: float) -> str:
    leak = ""
    if rank.kept_across_steps:
        leak = (
            f"the batch stayed at {rank.batch} while memory rose, so something is kept across "
            "steps (a loss or metric summed as a tensor instead of .item(), outputs appended to "
            "a list, a growing cache); meanwhile "
        )
    options: list[str] = []
    if rank.smaller_batch is not None:
        options.append(
            f"batch_size {rank.batch} -> {rank.smaller_batch}{per_micro(rank.accumulated)} "
            f"(about {target_ratio:.0%} of the GPU)"
        )
    if rank.budget is not None and rank.budget.levers():
        options.append(f"{levers_text(rank.budget)} ({parts_text(rank.budget)})")
    else:
        options.append(_generic_fix())
    return leak + ", or ".join(options)


@phrase_facts.register
def _host_short(facts: HostShort, finding: Finding) -> Phrase:
    host = facts.host or "?"
    avail, total = fmt_bytes(facts.available_bytes), fmt_bytes(facts.total_bytes)
    summary = (
        f"host {host} is short of memory ({avail} of {total} available, "
        f"{facts.available_ratio:.0%}) on rank {', '.join(str(r) for r in finding.ranks)}"
    )
    fixes = {
        r: f"host {host} has {avail} of {total} available: "
        f"{levers_text(m) or _generic_fix()} ({parts_text(m)})"
        for r, m in facts.ranks.items()
    }
    notes: dict[str, object] = {"speedup_model": SPEEDUP_NOTE}
    rows = finding.evidence.get("per_rank")
    if isinstance(rows, Mapping):
        notes["per_rank"] = {r: budget_words(row) for r, row in rows.items()}
    return Phrase(summary, fixes, notes)


def _generic_fix() -> str:
    return (
        "gradient checkpointing (torch.utils.checkpoint on the largest blocks: activations "
        "shrink, commonly enough for a 4-10x larger batch, for about a third more compute), or "
        "mixed precision (torch.autocast(device_type='cuda', dtype=torch.bfloat16): activations "
        "about half)"
    )
