"""utilization_imbalance in words: the spread, its cause, who the others wait for; the blamed
ranks' fixes are their cause's. The evidence's words the JSON report has always carried (the
ranks whose wait was not measured, what NVML counts as busy) are put back here."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.utilization_imbalance import Facts
from auditor.wording import fmt_pct, ranks_text

from .words import Phrase, ops_text, phrase, phrase_facts

GPU_NOTE = "NVML counts a rank waiting in an all-reduce as busy"


@phrase_facts.register
def _(facts: Facts, finding: Finding) -> Phrase:
    blamed = finding.ranks
    spread = facts.spread
    what = (
        f"{'GPU ' if spread.gpus else ''}busy time spread {fmt_pct(spread.high_busy)} "
        f"({_name(spread.high)}) against {fmt_pct(spread.low_busy)} ({_name(spread.low)})"
    )
    if facts.run:
        what += " over the run's steps"
    because = f" because of {facts.cause.kind}" if facts.cause else ""
    if facts.peers:
        wait_for = f"the others wait for {ranks_text(blamed)}"
        if facts.waiting_in:
            wait_for += f" in {ops_text(facts.waiting_in)}"
    else:
        wait_for = f"{ranks_text(blamed)} drives every GPU"
    if facts.cause is not None:
        fixes = {r: fx for r, fx in phrase(facts.cause).fixes.items() if r in blamed}
    else:
        fixes = {
            r: f"profile rank {r}: it is busy {fmt_pct(b)} of each step while its peers wait for it"
            for r, b in facts.busy.items()
        }
    return Phrase(f"{what}{because}: {wait_for}", fixes, _notes(facts))


def _name(who: int | str) -> str:
    """A rank (``rank 2``) or a GPU's label, as the spread names it."""
    return f"rank {who}" if isinstance(who, int) else who


def _notes(facts: Facts) -> dict[str, object]:
    """The evidence's words: the ranks whose collective wait was not measured, and what NVML
    counts as busy where GPU busy time was measured."""
    notes: dict[str, object] = {}
    if facts.unmeasured:
        whose = "its" if len(facts.unmeasured) == 1 else "their"
        notes["not_measured"] = [
            f"collective wait on {ranks_text(facts.unmeasured)}: "
            f"{whose} waiting may read as busy time"
        ]
    if facts.gpu_busy:
        notes["gpu_note"] = GPU_NOTE
    return notes
