"""memory_growth in words: whose memory climbs, how fast (a step, a minute), since when, how full
it is and when it is full at that rate; what climbs (allocated: tensors kept; reserved alone:
the allocator's cache) and the usual causes, as the change to make on each rank."""

from __future__ import annotations

from collections.abc import Iterable

from auditor.analysis.findings import Finding
from auditor.analysis.rules.memory_growth import (
    ALLOCATED,
    ALLOCATOR_CACHE,
    DEVICE_LESS_OUTSIDE,
    EXPANDABLE_SEGMENTS,
    FRAGMENTATION,
    GROWING_CACHE,
    HOST,
    HOST_AVAILABLE,
    LOSS_KEPT,
    NVML_TOTAL_LESS_OTHERS,
    OUTPUTS_KEPT,
    RESERVED,
    RETAIN_GRAPH,
    RSS,
    UNKNOWN,
    Facts,
    Growth,
)
from auditor.wording import fmt_bytes, ranks_text

from .words import Phrase, phrase_facts

SPEEDUP_NOTE = "not predicted: this prevents a crash, it does not change the step time"
CAPACITY_TEXT = {
    DEVICE_LESS_OUTSIDE: "device total less what the CUDA context and other processes hold",
    NVML_TOTAL_LESS_OTHERS: "GPU total (NVML) less what other processes and the context hold",
    HOST_AVAILABLE: "the rank's memory plus the host's available memory (measured budget)",
    UNKNOWN: "unknown",
}
FIGURE_TEXT = {
    ALLOCATED: "GPU memory (allocated)",
    RESERVED: "GPU memory (reserved by the allocator)",
    RSS: "host memory",
}
CAUSE_TEXT = {
    LOSS_KEPT: "a loss summed or appended as a tensor (keep loss.item() or loss.detach())",
    OUTPUTS_KEPT: "outputs or predictions collected in a list (append .detach().cpu() copies, "
    "or reduce them as you go)",
    RETAIN_GRAPH: "backward(retain_graph=True) (drop it unless the graph is used again)",
    GROWING_CACHE: "a cache, dict or list filled every step and never emptied",
    FRAGMENTATION: "batches whose shapes vary step to step (pad them to a few fixed shapes)",
}
# How many ranks a summary names one by one before it counts the rest.
LISTED = 3


def fmt_time_left(seconds: float) -> str:
    """``under a minute``, ``41 min``, ``3.5 h``, ``2.1 days``."""
    if seconds < 60:
        return "under a minute"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _what(g: Growth) -> str:
    return "the host" if g.where == HOST else (g.gpu or "the GPU")


def _rate(g: Growth) -> str:
    """``2.0 MiB a step (120.0 MiB/min)``; the minute left out where the step rate is unknown."""
    per_min = g.bytes_per_minute
    minute = "" if per_min is None else f" ({fmt_bytes(per_min)}/min)"
    return f"{fmt_bytes(g.bytes_per_step)} a step{minute}"


def _level(g: Growth) -> str:
    cap = "" if g.capacity_bytes is None else f" of {fmt_bytes(g.capacity_bytes)}"
    return f"{fmt_bytes(g.level_bytes)}{cap} now"


def full_text(g: Growth) -> str:
    """When the rank's GPU or host is full at this rate, in words."""
    if g.full_in_s is not None:
        together = f" (with {ranks_text(g.shared_with)} climbing too)" if g.shared_with else ""
        early = (
            f", if it keeps climbing (seen for {g.seen_s:.0f} s: too early to tell a leak from "
            "memory that levels off)"
            if g.early and g.seen_s is not None
            else ""
        )
        return f"at that rate {_what(g)} is full in {fmt_time_left(g.full_in_s)}{together}{early}"
    if g.capacity_bytes is None:
        return f"{_what(g)}'s capacity is unknown: no time to full projected"
    return "the step rate is unknown: no time to full projected"


def climbing(findings: Iterable[Finding]) -> dict[int, Growth]:
    """Rank -> its climb, for the ranks a memory_growth finding names (the live view's)."""
    return {r: g for f in findings if isinstance(f.facts, Facts) for r, g in f.facts.ranks.items()}


def soonest_climb(finding: Finding) -> str:
    """The live tag of a memory_growth finding's soonest-full rank; empty for any other."""
    facts = finding.facts
    if not isinstance(facts, Facts) or not facts.ranks:
        return ""
    return live_tag(facts.ranks[facts.order[0]])


def live_tag(g: Growth) -> str:
    """The live panel's short form: ``memory +2.0 MiB/step, full in 41 min``."""
    full = "" if g.full_in_s is None else f", full in {fmt_time_left(g.full_in_s)}"
    return f"memory +{fmt_bytes(g.bytes_per_step)}/step{full}"


def _one(g: Growth) -> str:
    return (
        f"{FIGURE_TEXT[g.figure]} climbs {_rate(g)} since step {g.since_step}: {_level(g)}; "
        f"{full_text(g)}"
    )


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    order = facts.order
    if len(order) == 1:
        summary = f"rank {order[0]}'s {_one(facts.ranks[order[0]])}"
    else:
        listed = "; ".join(f"rank {r}'s {_one(facts.ranks[r])}" for r in order[:LISTED])
        more = len(order) - LISTED
        rest = f"; and {more} more" if more > 0 else ""
        summary = f"{ranks_text(order)}: {listed}{rest}"
    fixes = {r: _fix(g) for r, g in sorted(facts.ranks.items())}
    notes: dict[str, object] = {
        "speedup_model": SPEEDUP_NOTE,
        "capacity_source": {
            str(r): CAPACITY_TEXT.get(g.capacity_source, g.capacity_source)
            for r, g in sorted(facts.ranks.items())
        },
    }
    return Phrase(summary, fixes, notes)


def _fix(g: Growth) -> str:
    when = full_text(g)
    if g.cause == ALLOCATOR_CACHE:
        causes = "; ".join(CAUSE_TEXT[c] for c in g.causes)
        return (
            "reserved memory grows while allocated memory stays flat: the caching allocator "
            "keeps blocks it cannot reuse (fragmentation); launch with "
            f"PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE_SEGMENTS} and look for {causes}; {when}"
        )
    kept = (
        "allocated memory grows: tensors are kept alive across steps"
        if ALLOCATED in g.climbing
        else "its memory grows: something is kept from every step"
    )
    causes = "; ".join(CAUSE_TEXT[c] for c in g.causes)
    until = "until it is fixed, " if g.full_in_s is not None else ""
    return (
        f"{kept} ({fmt_bytes(g.bytes_per_step)} a step); find what this rank keeps: {causes}; "
        f"{until}{when}"
    )
