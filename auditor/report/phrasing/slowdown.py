"""slowdown in words: which rank turned slow, in which phase, from what to what, at which step
and time of day (local time), and how much slower the job runs since; the change that gives the
time back; where every rank slowed alike, that no rank is to blame; and where a batch per step
changed, that the work per step did, by design."""

from __future__ import annotations

import time

from auditor.analysis.findings import Finding
from auditor.analysis.rules.slowdown import DATA, OTHER, WAIT, Change, Facts
from auditor.wording import fmt_ms, fmt_speedup, ranks_text

from .words import Phrase, expectation, it_or_them, phrase_facts

PHASE_TEXT = {
    DATA: "data wait",
    "h2d": "host-to-device copy",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    OTHER: "time outside the phases (the loop's own code)",
    WAIT: "wait at the collectives",
}
SPEEDUP_NOTE = "not predicted: every rank slowed alike, so no rank waits for another"
BATCH_RANKS = 8  # ranks named one by one where their batch changed alike; more are counted
BATCH_NOTE = "not predicted: the batch per step changed, so the work per step did too"
BATCH_FIX = (
    "nothing to bring back: a step with more samples takes longer; judge the job by samples "
    "per second from here, and the steps since the change by the findings on them"
)


def clock(t: float) -> str:
    """A wall-clock time as the local time of day: ``14:02:11``."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def fmt_step_time(seconds: float) -> str:
    """``48 ms``; ``0.4 ms`` under 10 ms where whole milliseconds would lose it."""
    return f"{seconds * 1e3:.1f} ms" if seconds * 1e3 < 9.95 else fmt_ms(seconds)


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    when = f"at step {facts.step}, {clock(facts.time)}"
    since = (
        f"since then the job runs {fmt_speedup(facts.slowdown)} slower "
        f"({fmt_step_time(facts.before_s)} a step, now {fmt_step_time(facts.now_s)})"
    )
    if facts.batches:
        summary = (
            f"the batch per step changed {when} ({_batches(facts)}); {since}: more work per "
            "step by design, none is to blame"
        )
        return Phrase(summary, notes={"speedup_model": BATCH_NOTE, "fix": BATCH_FIX})
    every = facts.every_rank
    if every is not None and not facts.ranks:
        why = (
            "the collectives themselves slowed"
            if every.phase == WAIT
            else "no rank waits for another"
        )
        summary = (
            f"every rank slowed alike {when}: their {_moved(every)}; {since}; {why}, "
            "none is to blame"
        )
        return Phrase(summary, notes={"speedup_model": SPEEDUP_NOTE, "fix": _alike_fix(every)})
    parts = "; ".join(f"{ranks_text([r])}'s {_moved(c)}" for r, c in sorted(facts.ranks.items()))
    if len(facts.ranks) > 1:
        parts = f"{ranks_text(facts.ranks)} turned slow {when}: {parts}"
    else:
        parts = f"{parts} {when}"
    summary = f"{parts}; {since}: the others wait for {it_or_them(facts.ranks)} at the collectives"
    fixes = {r: expectation(_fix(c, facts), finding) for r, c in sorted(facts.ranks.items())}
    return Phrase(summary, fixes)


def _batches(facts: Facts) -> str:
    """``rank 1: 32 to 64``; ranks that changed alike together, counted past ``BATCH_RANKS``
    (a ramp on thousands of ranks)."""
    alike: dict[tuple[float, float], list[int]] = {}
    for r, ab in sorted(facts.batches.items()):
        alike.setdefault(ab, []).append(r)
    return "; ".join(
        f"{ranks_text(rs) if len(rs) <= BATCH_RANKS else f'{len(rs)} ranks'}: {a:g} to {b:g}"
        for (a, b), rs in alike.items()
    )


def _moved(c: Change) -> str:
    """``forward went from 9 ms to 48 ms``."""
    return (
        f"{PHASE_TEXT.get(c.phase, c.phase)} went from {fmt_step_time(c.before_s)} to "
        f"{fmt_step_time(c.after_s)}"
    )


def _fix(c: Change, facts: Facts) -> str:
    when = f"at step {facts.step} ({clock(facts.time)})"
    if c.phase == DATA:
        return (
            f"find what changed in this rank's loading {when}: its data wait went from "
            f"{fmt_step_time(c.before_s)} to {fmt_step_time(c.after_s)} a step (slower reads "
            "from its storage, heavier samples, a loader worker lost) and make its loading "
            "cheaper"
        )
    return (
        f"find what changed on this rank {when}: its {PHASE_TEXT.get(c.phase, c.phase)} went "
        f"from {fmt_step_time(c.before_s)} to {fmt_step_time(c.after_s)} a step (a throttled "
        "or shared device, another process on its host, larger inputs, work added to this "
        "rank alone) and bring it back to its earlier pace"
    )


def _alike_fix(c: Change) -> str:
    if c.phase == WAIT:
        return (
            "every rank waits longer at the collectives: look at the interconnect and at "
            "what else shares it"
        )
    return (
        f"every rank's {PHASE_TEXT.get(c.phase, c.phase)} slowed alike: look at what changed "
        "for the whole job (the data, the inputs' sizes, the machines' clocks or load)"
    )
