"""utilization_imbalance in words: the spread, its cause, who the others wait for; the blamed
ranks' fixes are their cause's."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.utilization_imbalance import Facts
from auditor.wording import fmt_pct, ranks_text

from .words import Phrase, ops_text, phrase, phrase_facts


@phrase_facts.register
def _(facts: Facts, finding: Finding) -> Phrase:
    blamed = finding.ranks
    spread = facts.spread
    what = (
        f"{'GPU ' if spread.gpus else ''}busy time spread {fmt_pct(spread.high_busy)} "
        f"({spread.high}) against {fmt_pct(spread.low_busy)} ({spread.low})"
    )
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
    return Phrase(f"{what}{because}: {wait_for}", fixes)
