"""stall in words: what stalls (checkpoint, evaluation, logging or unnamed work), how often
(every N steps, or irregular), what one costs and what share of the window they take; the change
that gives the time back; and for a stall every rank has alike, that no rank is to blame."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.stall import CHECKPOINT, EVALUATION, LOGGING, Facts, Stall
from auditor.wording import fmt_ms, fmt_pct, ranks_text

from .words import Phrase, expectation, it_or_them, phrase_facts, s_if_one

WORK_TEXT = {
    CHECKPOINT: "a checkpoint save",
    EVALUATION: "an evaluation",
    LOGGING: "logging or metric gathering",
}
SPEEDUP_NOTE = "not predicted: every rank stalls alike, so no rank waits for another"


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    every = facts.every_rank
    if every is not None and not facts.ranks:
        summary = (
            f"every rank stalls alike in {_what(every)} {_how_often(every)} "
            f"({_cost(every)}); no rank waits for another, none is to blame"
        )
        return Phrase(summary, notes={"speedup_model": SPEEDUP_NOTE, "fix": _alike_fix(every)})
    first = facts.ranks[min(facts.ranks)]
    summary = (
        f"{ranks_text(facts.ranks)} stall{s_if_one(facts.ranks)} in {_what(first)} "
        f"{_how_often(first)} ({_cost(first)}); the others wait for {it_or_them(facts.ranks)} "
        "at the next collective"
    )
    fixes = {
        r: expectation(_fix(stall), finding) + _off_step(stall, finding, r)
        for r, stall in sorted(facts.ranks.items())
    }
    return Phrase(summary, fixes)


def _off_step(s: Stall, finding: Finding, rank: int) -> str:
    """Where the interval is the first lever, saving off the step as the alternative, with its
    own figure."""
    if s.work != CHECKPOINT or s.interval is None:
        return ""
    alone = next(
        (x.speedup for x in finding.fixes if x.rank == rank and x.lever == "checkpoint_async"),
        None,
    )
    figure = "" if alone is None else f" (about {alone:.1f}x on this host at best)"
    return (
        "; or save off the training step (torch.distributed.checkpoint.async_save, or a "
        "background thread): the save still takes its CPU from the host, and a thread of the "
        f"training process the interpreter's lock while it pickles{figure}"
    )


def _what(s: Stall) -> str:
    return WORK_TEXT.get(s.work or "", "unnamed work")


def _how_often(s: Stall) -> str:
    if s.period is None:
        return f"irregularly ({s.occurrences} times)"
    return f"every {s.period} steps"


def fmt_time(seconds: float) -> str:
    """``850 ms``, or ``1.25 s`` from a second up."""
    return f"{seconds:.2f} s" if seconds >= 1.0 else fmt_ms(seconds)


def _cost(s: Stall) -> str:
    return f"{fmt_time(s.cost_s)} each, {fmt_pct(s.share)} of the window"


def _fix(s: Stall) -> str:
    if s.work == CHECKPOINT:
        if s.interval is not None:
            return (
                f"save the checkpoint every {s.interval} steps instead of every {s.period}, "
                "so that saving costs a few percent of the run"
            )
        return (
            "save the checkpoint off the training step "
            "(torch.distributed.checkpoint.async_save, or a background thread)"
        )
    if s.work == EVALUATION:
        return (
            "run the evaluation on every rank, each on its shard (a DistributedSampler over "
            "the evaluation set), instead of on this rank alone"
        )
    if s.work == LOGGING:
        return (
            "take logging and metric gathering off the step: less often, or asynchronously "
            "(no .item() or gather on the training thread each step)"
        )
    return (
        f"find the work this rank does alone {_how_often(s)} ({fmt_time(s.cost_s)} each: "
        "a save, an evaluation, logging, a garbage-collection pause) and move it off the step "
        "or spread it over every rank"
    )


def _alike_fix(s: Stall) -> str:
    if s.work == CHECKPOINT:
        return (
            "save asynchronously (torch.distributed.checkpoint.async_save) or less often: "
            "every rank pays it alike"
        )
    return (
        f"{_what(s)} costs every rank alike {fmt_pct(s.share)} of the window: "
        "run it less often if that is too much"
    )
