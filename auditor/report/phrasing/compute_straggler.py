"""compute_straggler in words: the slow phase against the peers' (or the loop's own code in no
phase), where the others wait."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.compute_straggler import OTHER, Facts, SlowRank
from auditor.wording import fmt_ms, ranks_text

from .words import (
    Phrase,
    expectation,
    it_or_them,
    ops_text,
    per_micro,
    phrase_facts,
    s_if_one,
)


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    first = facts.ranks[min(facts.ranks)]
    where = f"in {ops_text(facts.waiting_in)}" if facts.waiting_in else "at the all-reduce"
    queued = (
        f", waiting for a core {fmt_ms(first.core_wait_s)} a step vs "
        f"{fmt_ms(first.peer_core_wait_s or 0.0)} on peers"
        if first.core_wait_s is not None
        else ""
    )
    summary = (
        f"{ranks_text(facts.ranks)} compute{s_if_one(facts.ranks)} slower than peers "
        f"({_phase(first.phase)} {fmt_ms(first.phase_s)} vs {fmt_ms(first.peer_phase_s)}"
        f"{queued}); the others wait for {it_or_them(facts.ranks)} {where}"
    )
    fixes = {r: expectation(_fix(slow), finding) for r, slow in sorted(facts.ranks.items())}
    return Phrase(summary, fixes)


# The work in no phase, as the summary names it.
OTHER_TEXT = "its own code outside forward/backward/optimizer"


def _phase(phase: str) -> str:
    return OTHER_TEXT if phase == OTHER else phase


def _fix(slow: SlowRank) -> str:
    if slow.core_wait_s is not None:
        return (
            f"its process waited for a core {fmt_ms(slow.core_wait_s)} a step vs "
            f"{fmt_ms(slow.peer_core_wait_s or 0.0)} on peers, most of its extra time in "
            f"{_phase(slow.phase)} ({fmt_ms(slow.phase_s)} vs {fmt_ms(slow.peer_phase_s)}): "
            "its host's CPU is short, not its work; free cores there (other processes, fewer "
            "DataLoader workers) or give each rank cores of its own (taskset, cgroups)"
        )
    if slow.phase == OTHER:
        return (
            f"the loop's own code outside forward/backward/optimizer takes "
            f"{fmt_ms(slow.phase_s)} a step vs {fmt_ms(slow.peer_phase_s)} on peers: remove "
            "the work this rank alone does there (a metric, a debug check, a host-side "
            "transform between forward and backward or after the step), do it every N steps, "
            "or move it off the training loop"
        )
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
