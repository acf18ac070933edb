"""compute_straggler in words: the slow phase against the peers', where the others wait."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.compute_straggler import Facts, SlowRank
from auditor.wording import fmt_ms, ranks_text

from .words import (
    Phrase,
    it_or_them,
    ops_text,
    per_micro,
    phrase_facts,
    s_if_one,
    with_expectation,
)


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    first = facts.ranks[min(facts.ranks)]
    where = f"in {ops_text(facts.waiting_in)}" if facts.waiting_in else "at the all-reduce"
    summary = (
        f"{ranks_text(facts.ranks)} compute{s_if_one(facts.ranks)} slower than peers "
        f"({first.phase} {fmt_ms(first.phase_s)} vs {fmt_ms(first.peer_phase_s)}); "
        f"the others wait for {it_or_them(facts.ranks)} {where}"
    )
    fixes = {
        r: with_expectation(_fix(slow), finding.predicted_speedup)
        for r, slow in sorted(facts.ranks.items())
    }
    return Phrase(summary, fixes)


def _fix(slow: SlowRank) -> str:
    fix = (
        f"{slow.phase} takes {fmt_ms(slow.phase_s)} vs {fmt_ms(slow.peer_phase_s)} on peers: "
        f"remove the rank-specific work in {slow.phase}"
    )
    if slow.batch_share is not None:
        fix += (
            f", or if its device is simply slower, "
            f"batch_size {slow.batch_size} -> {slow.batch_share}{per_micro(slow.accumulated)}"
        )
    return fix
