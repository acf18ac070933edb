"""memory_pressure in words: a GPU filling up (how full, how fast, when full) or a CPU job's host
short of memory, and what each rank can change: a smaller batch, the measured levers, or the
usual remedies."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.memory_pressure import Filling, HostShort, RankRelief
from auditor.wording import MIB, fmt_bytes, fmt_gib

from .words import Phrase, levers_text, parts_text, per_micro, phrase_facts


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
    # A GPU no rank owns: no rank's fix says it, so the evidence does.
    return Phrase(summary, fixes, {"fix": None if ranks else f"{state}: {_generic_fix()}"})


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
    return Phrase(summary, fixes)


def _generic_fix() -> str:
    return (
        "gradient checkpointing (torch.utils.checkpoint on the largest blocks: activations "
        "shrink, commonly enough for a 4-10x larger batch, for about a third more compute), or "
        "mixed precision (torch.autocast(device_type='cuda', dtype=torch.bfloat16): activations "
        "about half)"
    )
