"""hardware_straggler in words: the slow GPU and why, the change its cause calls for, and the
way around it (move the rank, or give it a smaller batch); the evidence's reasons (codes in the
finding) and its speed-up model as the JSON report has always worded them."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.hardware_straggler import (
    Facts,
    LowClock,
    Slowdown,
    SlowGpu,
    Throttled,
)
from auditor.wording import fmt_ms, ranks_text

from .words import Phrase, expectation, it_or_them, per_micro, phrase_facts


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    first = facts.ranks[min(facts.ranks)]
    runs = "runs" if len(facts.ranks) == 1 else "run"
    summary = (
        f"{ranks_text(facts.ranks)} {runs} on a slow GPU "
        f"({first.label}: {', '.join(slowdown_note(x) for x in first.slowdowns)}); the others "
        f"wait for {it_or_them(facts.ranks)} at the all-reduce (compute {fmt_ms(first.compute_s)})"
    )
    fixes = {
        r: expectation(f"{_fix(gpu)}; {_around(r, gpu)}", finding)
        for r, gpu in sorted(facts.ranks.items())
    }
    return Phrase(summary, fixes, _notes(facts, finding))


def slowdown_note(slowdown: Slowdown) -> str:
    """A slowdown as the report's evidence words it (``per_rank.<rank>.reasons``), and as the
    summary quotes it."""
    if isinstance(slowdown, Throttled):
        return f"throttled ({', '.join(slowdown.reasons)}) in {slowdown.share:.0%} of samples"
    if isinstance(slowdown, LowClock):
        mhz = "" if slowdown.mhz is None else f" ({slowdown.mhz:.0f} MHz)"
        return (
            f"SM clock at {slowdown.ratio:.0%} of its maximum{mhz} against "
            f"{slowdown.peer_ratio:.0%} on its peers"
        )
    return f"PCIe link at {slowdown.pcie} (current/max)"


def _notes(facts: Facts, finding: Finding) -> dict[str, object]:
    """The evidence's words: each blamed rank's reasons (the finding holds their codes) and the
    speed-up model (none for a finding without evidence: one a test built)."""
    notes: dict[str, object] = {}
    if not finding.evidence:
        return notes
    per_rank = finding.evidence.get("per_rank")
    if isinstance(per_rank, dict):
        notes["per_rank"] = {
            key: (
                {**row, "reasons": [slowdown_note(x) for x in facts.ranks[int(key)].slowdowns]}
                if isinstance(row, dict) and int(key) in facts.ranks
                else row
            )
            for key, row in per_rank.items()
        }
    notes["speedup_model"] = (
        "barrier model: the blamed ranks' own work at their peers' median"
        if facts.waits_measured
        else "not predicted: the collective wait was not measured, so local times are unknown"
    )
    return notes


def _fix(gpu: SlowGpu) -> str:
    """The change the GPU's cause calls for: cooling, power, clocks, its link."""
    parts: list[str] = []
    if gpu.thermal:
        temp = "" if gpu.temperature_c is None else f" at {gpu.temperature_c:.0f} C"
        parts.append(
            f"{gpu.label} slows down for heat{temp}: check its cooling (fans, airflow, blanking "
            "panels) and reseat it"
        )
    if gpu.power:
        if gpu.power_limit is not None:
            limit = gpu.power_limit
            parts.append(
                f"{gpu.label}'s power limit is {limit.watts:.0f} W against "
                f"{limit.peer_watts:.0f} W on its peers: "
                f"`nvidia-smi -i {gpu.index} -pl {limit.peer_watts:.0f}` on {gpu.node}"
            )
        else:
            parts.append(f"{gpu.label} hits its power cap: check its power supply and cabling")
    if gpu.hw_slowdown and not (gpu.thermal or gpu.power):
        parts.append(
            f"{gpu.label} reports HW slowdown (power brake or overheating): check its power "
            "cabling and cooling, and reseat it"
        )
    if not parts and any(isinstance(x, LowClock) for x in gpu.slowdowns):
        parts.append(
            f"{gpu.label} runs low clocks without a throttle reason: reset locked clocks with "
            f"`nvidia-smi -i {gpu.index} -rgc` on {gpu.node} and check application clocks"
        )
    if gpu.pcie_degraded:
        parts.append(
            f"{gpu.label}'s PCIe link is {gpu.pcie}: reseat the card, check the riser and the "
            "slot's link setting in the BIOS"
        )
    if not parts:
        reasons = "; ".join(slowdown_note(x) for x in gpu.slowdowns)
        parts.append(f"{gpu.label} is slower than its peers ({reasons})")
    return "; ".join(parts)


def _around(rank: int, gpu: SlowGpu) -> str:
    """The way around the GPU: move the rank off it, or give it a batch that fits its pace."""
    alt = f"or move rank {rank} off {gpu.label} ({gpu.uuid})"
    if gpu.batch_share is not None:
        alt += (
            f", or give it a smaller batch share: batch_size {gpu.batch_size} -> "
            f"{gpu.batch_share}{per_micro(gpu.accumulated)}"
        )
    return alt
