"""idle_device in words: who holds the idle GPU's memory; the owning ranks' fix is the one the
evidence records (a GPU no rank owns has its fix there alone)."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.idle_device import Facts, fix_note, holders_note
from auditor.wording import fmt_gib, ranks_text

from .words import Phrase, phrase_facts, s_if_one


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    held = fmt_gib(facts.held_bytes)
    ranks = finding.ranks
    if not ranks:
        return Phrase(f"{holders_note(facts)} {held} on idle {facts.label} (no rank of this job)")
    fix = fix_note(facts, owned=True)
    summary = f"{ranks_text(ranks)} hold{s_if_one(ranks)} {held} on idle {facts.label}"
    return Phrase(summary, {r: fix for r in ranks})
