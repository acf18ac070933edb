"""cpu_oversubscription in words: the host's load and workers against its free cores, the worker
count each blamed rank should drop to, and why no speed-up is predicted."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.cpu_oversubscription import NOT_PREDICTED, Facts
from auditor.wording import ranks_text

from .words import Phrase, phrase_facts, s_if_one

# The evidence's ``speedup_model`` in words.
SPEEDUP_MODEL = {NOT_PREDICTED: "not predicted: the same decoding work runs on fewer processes"}


@phrase_facts.register
def _(facts: Facts, finding: Finding) -> Phrase:
    summary = (
        f"{facts.host or 'host'} is {facts.busy_cores / facts.cores:.0%} busy and runs "
        f"{facts.workers} DataLoader workers for {facts.free_cores:.1f} free cores: "
        f"{ranks_text(finding.ranks)} start{s_if_one(finding.ranks)} more than the data needs"
    )
    fixes = {
        r: (
            f"num_workers {rank.workers} -> {rank.recommended} (its workers use "
            f"{rank.worker_cpu:.2f} cores together; {facts.free_cores:.1f} of {facts.cores:g} "
            f"cores are free on {facts.host or 'the host'})"
        )
        for r, rank in facts.ranks.items()
    }
    model = finding.evidence.get("speedup_model")
    notes = {"speedup_model": SPEEDUP_MODEL[model]} if model in SPEEDUP_MODEL else {}
    return Phrase(summary, fixes, notes)
