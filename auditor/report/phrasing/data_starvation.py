"""data_starvation in words: the worst wait against its step, who waits for the starved, and the
loader change per starved rank (more workers, or cheaper loading where none fit)."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.loading import IO, UNKNOWN
from auditor.analysis.rules.data_starvation import (
    CORES,
    MAX_WORKERS,
    MEMORY,
    Facts,
    PeersWait,
    StarvedRank,
)
from auditor.wording import fmt_ms, fmt_pct, ranks_text, speedup_worth_naming

from .words import Phrase, it_or_them, ops_text, phrase_facts, s_if_one, with_expectation

_CHEAPER_CPU = (
    "make loading cheaper (cache decoded samples, lighter transforms, decode on the device)"
)
_CHEAPER_IO = (
    "make reads faster (overlap them inside the dataset with threads or async I/O, read larger "
    "chunks, cache the data on local disk)"
)


@phrase_facts.register
def _(facts: Facts, finding: Finding) -> Phrase:
    starved = finding.ranks
    worst = facts.worst
    where = "" if len(starved) == 1 else f" on rank {worst.rank}"
    summary = (
        f"{ranks_text(starved)} wait{s_if_one(starved)} for data: "
        f"{fmt_ms(worst.data_wait_s)} of a {fmt_ms(worst.step_s)} step "
        f"({fmt_pct(worst.data_wait_ratio)}){where}"
    )
    if facts.peers is not None:
        summary += _peers(facts.peers, starved)
    fixes = {
        r: _fix(rank, finding.predicted_speedup, facts.cheaper_factor)
        for r, rank in facts.ranks.items()
    }
    return Phrase(summary, fixes)


def _peers(peers: PeersWait, starved: tuple[int, ...]) -> str:
    """``; rank 0 waits 104 ms a step for it in all_gather/ddp_allreduce``."""
    who = ranks_text(peers.ranks) if len(peers.ranks) <= 3 else "its peers"
    where = f" in {ops_text(peers.ops)}" if peers.ops else " at the collectives"
    return (
        f"; {who} wait{s_if_one(peers.ranks)} {fmt_ms(peers.wait_s)} a step "
        f"for {it_or_them(starved)}{where}"
    )


def _fix(rank: StarvedRank, speedup: float | None, factor: float) -> str:
    parts: list[str] = []
    if rank.workers is None:
        if rank.loading == IO:
            head = "no memory on this host for more DataLoader workers: " + _CHEAPER_IO
        else:
            head = "no free CPU on this host for more DataLoader workers"
            if rank.loading != UNKNOWN:
                head += (
                    f" and loading is CPU-bound ({rank.loading_cores or 0.0:.2f} cores "
                    "while it loads)"
                )
            head += ": " + _CHEAPER_CPU
        parts.append(head)
    else:
        current = "?" if rank.num_workers is None else rank.num_workers
        change = f"num_workers {current} -> {rank.workers}"
        if rank.limited_by == CORES:
            change += " (as many as the free cores allow)"
        elif rank.limited_by == MEMORY:
            change += " (as many as the host's available memory allows)"
        elif rank.limited_by == MAX_WORKERS:
            change += f" (capped at {rank.workers}; for more, {_CHEAPER_IO.split(' (')[0]})"
        elif rank.loading == IO:
            change += " (loading waits on I/O: the workers need memory, not free cores)"
        parts.append(change)
    if rank.set_pin_memory:
        parts.append("pin_memory=True")
    if rank.set_persistent_workers:
        parts.append("persistent_workers=True")
    text = ", ".join(parts)
    if rank.workers is None:
        if not speedup_worth_naming(speedup):
            return text
        cost = "half the loading time" if factor == 2 else f"1/{factor:g} of the loading time"
        return f"{text}; at {cost} expect about {speedup:.1f}x"
    return with_expectation(text, speedup)
