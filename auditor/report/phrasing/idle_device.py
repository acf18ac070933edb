"""idle_device in words: who holds the idle GPU's memory, and how to free it (for a GPU no rank
owns, the evidence's ``fix`` is the only place the change is said), and why no speed-up is
predicted (the evidence's ``speedup_model``, where the JSON report has always carried it)."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.idle_device import Facts
from auditor.wording import fmt_gib, ranks_text

from .words import Phrase, phrase_facts, s_if_one

SPEEDUP_NOTE = "not predicted: nothing in the job waits for an idle GPU"


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    held = fmt_gib(facts.held_bytes)
    ranks = finding.ranks
    fix = _fix(facts, owned=bool(ranks))
    if not ranks:
        summary = f"{_holders(facts)} {held} on idle {facts.label} (no rank of this job)"
        return Phrase(summary, notes={"speedup_model": SPEEDUP_NOTE, "fix": fix})
    summary = f"{ranks_text(ranks)} hold{s_if_one(ranks)} {held} on idle {facts.label}"
    return Phrase(summary, {r: fix for r in ranks}, {"speedup_model": SPEEDUP_NOTE, "fix": fix})


def _holders(facts: Facts) -> str:
    """Who holds the GPU's memory where no rank of the job does: ``PID 31337 holds``."""
    if not facts.pids:  # NVML listed none (containers), or the figures came from Prometheus
        return "processes outside this job hold"
    pids = ", ".join(str(p) for p in facts.pids)
    return f"PID {pids} holds" if len(facts.pids) == 1 else f"PIDs {pids} hold"


def _fix(facts: Facts, *, owned: bool) -> str:
    """Free the GPU: from the rank that ``owned`` it, or from the processes outside the job."""
    busy = f"busy {facts.busy:.0%} over {facts.window_s:.0f} s" + (
        " of training" if facts.while_training else ""
    )
    if owned:
        return (
            f"free it: the process holds {fmt_gib(facts.held_bytes)} on {facts.label} ({busy}) "
            "and never computes there; if the rank should use this GPU check "
            "CUDA_VISIBLE_DEVICES and call torch.cuda.set_device(local_rank) first, otherwise "
            "stop allocating on it"
        )
    kill = " ".join(str(p) for p in facts.pids) or "<pid>"
    them = "it" if len(facts.pids) <= 1 else "them"
    return (
        f"free it: {_holders(facts)} {fmt_gib(facts.held_bytes)} on idle {facts.label} "
        f"({busy}), outside this job; stop {them} on {facts.node or 'the node'} (`kill {kill}`) "
        "or give the GPU to a job that uses it"
    )
