"""cpu_oversubscription in words: the host's load and workers against its free cores, and the
worker count each blamed rank should drop to."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.cpu_oversubscription import Facts
from auditor.wording import ranks_text

from .words import Phrase, phrase_facts, s_if_one


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
    return Phrase(summary, fixes)
