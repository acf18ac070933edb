"""data_starvation in words: the worst wait against its step, who waits for the starved, the
loader change per starved rank (more workers, or cheaper loading where none fit), and the
evidence's codes in words (what capped the workers, what the loading costs, what one worker's
memory was read from, what the speed-up assumes, and what was not measured)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from auditor.analysis.findings import Finding
from auditor.analysis.loading import (
    IO,
    MAIN_THREAD_CPU,
    NO_DATA_WAIT,
    UNKNOWN,
    WORKERS_CPU,
    LoadingCost,
)
from auditor.analysis.rules.data_starvation import (
    CHEAPER_LOADING,
    NOT_PREDICTED,
    WORKERS_KEEP_UP,
    WORKERS_KEPT,
    Facts,
    PeersWait,
    StarvedRank,
)
from auditor.analysis.workers import (
    CORES,
    CORES_ASSUMED,
    MAIN_RSS,
    MAX_WORKERS,
    MEMORY,
    WORKERS_RSS,
)
from auditor.wording import fmt_expected, fmt_ms, fmt_pct, ranks_text, speedup_worth_naming

from .words import Phrase, expectation, it_or_them, ops_text, phrase_facts, s_if_one

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
    restarting = {r: k.restarts for r, k in facts.ranks.items() if k.restarts is not None}
    if restarting and len(restarting) == len(facts.ranks):
        # Each epoch's start, not a step's: the medians of a step say little.
        r, most = max(restarting.items(), key=lambda kv: kv[1].share)
        where = "" if len(starved) == 1 else f" on rank {r}"
        summary = (
            f"{ranks_text(starved)} wait{s_if_one(starved)} for data while "
            f"{'its' if len(starved) == 1 else 'their'} DataLoader workers start at every "
            f"epoch: {fmt_ms(most.each_s)} each time, {fmt_pct(most.share)} of the time{where}"
        )
    else:
        summary = (
            f"{ranks_text(starved)} wait{s_if_one(starved)} for data: "
            f"{fmt_ms(worst.data_wait_s)} of a {fmt_ms(worst.step_s)} step "
            f"({fmt_pct(worst.data_wait_ratio)}){where}"
        )
    if facts.peers is not None:
        summary += _peers(facts.peers, starved)
    fixes = {r: _fix(rank, finding, facts.cheaper_factor) for r, rank in facts.ranks.items()}
    return Phrase(summary, fixes, _notes(facts, finding))


def _peers(peers: PeersWait, starved: tuple[int, ...]) -> str:
    """``; rank 0 waits 104 ms a step for it in all_gather/ddp_allreduce``."""
    who = ranks_text(peers.ranks) if len(peers.ranks) <= 3 else "its peers"
    where = f" in {ops_text(peers.ops)}" if peers.ops else " at the collectives"
    return (
        f"; {who} wait{s_if_one(peers.ranks)} {fmt_ms(peers.wait_s)} a step "
        f"for {it_or_them(starved)}{where}"
    )


def _fix(rank: StarvedRank, finding: Finding, factor: float) -> str:
    speedup = finding.predicted_speedup
    parts: list[str] = []
    if rank.restarts is not None:
        n = rank.num_workers
        workers = f"its {n} DataLoader workers" if n else "its DataLoader workers"
        parts.append(
            f"{workers} start anew at every epoch ({fmt_ms(rank.restarts.each_s)} each time, "
            f"{fmt_pct(rank.restarts.share)} of its time): persistent_workers=True keeps them"
        )
        if rank.set_pin_memory:
            parts.append("pin_memory=True")
        return expectation(", ".join(parts), finding)
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
        return f"{text}; at {cost} expect {fmt_expected(speedup, finding.predicted_range)}"
    return expectation(text, finding)


# What was not measured, what capped the workers, what one worker's memory was read from, and
# what the speed-up assumes: the evidence's codes in words.
_MISSING = {
    MAIN_THREAD_CPU: "the main thread's CPU during the data wait",
    WORKERS_CPU: "the DataLoader workers' CPU",
    NO_DATA_WAIT: "no data wait to judge",
}
_LIMITED_BY = {CORES_ASSUMED: "cores (host not sampled: 1 assumed)"}
_MEMORY_BASIS = {
    WORKERS_RSS: "the workers' RSS",
    MAIN_RSS: "the main process's RSS (at most what a forked worker holds)",
}


def _notes(facts: Facts, finding: Finding) -> dict[str, object]:
    """The evidence with its codes in words, where the JSON report has always carried words:
    each starved rank's row, the speed-up model and what was not measured."""
    evidence = finding.evidence
    notes: dict[str, object] = {}
    rows = evidence.get("per_rank")
    if isinstance(rows, Mapping):
        notes["per_rank"] = {
            key: _row(row, facts.ranks.get(int(key)), facts.cheaper_factor)
            for key, row in rows.items()
        }
    if evidence.get("speedup_model") == NOT_PREDICTED and facts.at_most is not None:
        notes["speedup_model"] = f"not predicted; at most {facts.at_most:.2f}x"
    if evidence.get("not_measured"):
        notes["not_measured"] = _not_measured(facts, finding.ranks)
    return notes


def _row(row: Any, rank: StarvedRank | None, factor: float) -> Any:
    """A starved rank's evidence row in words: what capped its workers, its loading's verdict,
    its memory's basis and what its speed-up assumes."""
    if not isinstance(row, Mapping):
        return row
    out = dict(row)
    limited = out.get("limited_by")
    out["limited_by"] = _LIMITED_BY.get(limited, limited) if isinstance(limited, str) else limited
    loading = out.get("loading")
    if isinstance(loading, Mapping) and rank is not None and rank.cost is not None:
        out["loading"] = {**loading, "why": loading_why(rank.cost)}
    memory = out.get("memory")
    if isinstance(memory, Mapping):
        kept = memory.get("per_worker_basis")
        words = _MEMORY_BASIS.get(kept, kept) if isinstance(kept, str) else kept
        out["memory"] = {**memory, "per_worker_basis": words}
    basis = out.get("speedup_basis")
    if basis == WORKERS_KEEP_UP:
        out["speedup_basis"] = "workers keep up"
    elif basis == CHEAPER_LOADING:
        out["speedup_basis"] = f"loading {factor:g}x cheaper (an assumption: the fix sets how much)"
    elif basis == WORKERS_KEPT:
        out["speedup_basis"] = "the workers' starts gone (each epoch's first batch still loads)"
    return out


def _not_measured(facts: Facts, starved: tuple[int, ...]) -> list[str]:
    """What could not be measured, and what the finding did without it."""
    out: list[str] = []
    blind = facts.blind
    if blind:
        out.append(
            f"collective wait on {ranks_text(blind)}: {'its' if len(blind) == 1 else 'their'} "
            f"waiting for {ranks_text(starved)} counts as work, so no speed-up is predicted "
            f"(at most {facts.at_most or 1.0:.1f}x with the data wait removed)"
        )
    for r, rank in sorted(facts.ranks.items()):
        if rank.restarts is not None:
            continue  # its fix keeps its workers: nothing it sizes went unmeasured
        if rank.loading == UNKNOWN:
            missing = "" if rank.cost is None else _MISSING.get(rank.cost.missing, "")
            sized = "workers sized by the free cores" if rank.workers else "no workers added"
            out.append(f"loading CPU of rank {r} ({missing}): {sized}")
        if not rank.memory_measured and rank.workers is not None:
            out.append(
                f"available memory on {rank.host or 'the host'} of rank {r}: "
                "workers not bounded by memory"
            )
    return out


def loading_why(cost: LoadingCost) -> str:
    """The loading's verdict with its figures: ``I/O-bound: the main process used 0.03 cores
    while loading (...)``, or what was not measured."""
    if cost.kind == UNKNOWN:
        return (
            f"not known whether loading waits on I/O or the CPU: {_MISSING.get(cost.missing, '')}"
        )
    who = "the main process" if cost.workers == 0 else f"each of {cost.workers} workers"
    used = (
        f"{who} used {cost.cores or 0.0:.2f} cores while loading "
        f"({(cost.cpu_s or 0.0) * 1e3:.0f} ms CPU per {cost.load_s * 1e3:.0f} ms batch load), "
        f"{(cost.share_used or 0.0) * 100:.0f}% of the {cost.fair_share:.2f} core a "
        "CPU-bound loader gets on this host"
    )
    if cost.wait_s is not None:
        used += f", and waited {cost.wait_s * 1e3:.0f} ms a batch for a core"
    if cost.kind == IO:
        return f"I/O-bound: {used}; more workers cost memory, not cores"
    if cost.short_of_cores:
        return (
            f"CPU-bound, short of cores: {used}; more workers would queue for the same cores: "
            "free cores on this host or make loading cheaper"
        )
    return f"CPU-bound: {used}"
