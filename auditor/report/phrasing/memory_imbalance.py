"""memory_imbalance in words: the heavy GPU (or rank) against its peers, and what to look for on
it: tensors outside the model, one rank's extra copies, other ranks allocating on it. (The
finding ``dataparallel_gather`` emits on a DataParallel job's primary GPU is worded with that
rule: :mod:`auditor.report.phrasing.dataparallel_gather`.)"""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.memory_imbalance import (
    HeavyBudget,
    HeavyDataParallelGpu,
    HeavyGpu,
    HeavyPeak,
)
from auditor.wording import fmt_bytes, fmt_gib

from .words import Phrase, phrase_facts

SPEEDUP_NOTE = (
    "not predicted: memory does not set the step time; it caps the batch every rank can use"
)
# The evidence's ``source`` codes, as the JSON report words them.
SOURCE_TEXT = {
    "probe_peak": "probe: torch.cuda.max_memory_allocated per step",
    "budget": "measured budget (probe)",
}

PART_NAMES = {
    "param_bytes": "parameters",
    "grad_bytes": "gradients",
    "optimizer_bytes": "optimizer state",
    "buffer_bytes": "buffers",
    "activation_bytes": "activations",
    "other_module_bytes": "modules outside the model",
}


@phrase_facts.register
def _dataparallel(facts: HeavyDataParallelGpu, finding: Finding) -> Phrase:
    mine, peer = fmt_gib(facts.mem_bytes), fmt_gib(facts.peer_bytes)
    summary = (
        f"{facts.gpu} holds {facts.ratio:.1f}x the memory of the other GPUs of "
        f"rank {facts.rank} ({mine} vs {peer})"
    )
    fix = (
        f"{facts.gpu} holds {mine} against {peer} on the "
        "other GPUs of this DataParallel process: look for tensors created on "
        f"cuda:{facts.index} outside the model (targets, metrics, a loss computed there)"
    )
    return Phrase(summary, {facts.rank: fix}, _notes(finding))


@phrase_facts.register
def _gpu(facts: HeavyGpu, finding: Finding) -> Phrase:
    r, gpu = facts.rank, facts.gpu
    mine, peer = fmt_gib(facts.mem_bytes), fmt_gib(facts.peer_bytes)
    if facts.strays:
        summary = (
            f"{gpu} (rank {r}) holds {facts.ratio:.1f}x its peers' memory ({mine} vs {peer}): "
            f"ranks {', '.join(str(q) for q in facts.strays)} also allocate on it"
        )
        fixes = {
            q: (
                f"rank {q} holds {'memory' if used is None else fmt_gib(used)} on {gpu}, "
                f"which is rank {r}'s: call torch.cuda.set_device(local_rank) before any CUDA "
                "work and load checkpoints with torch.load(..., "
                "map_location=f'cuda:{local_rank}')"
            )
            for q, used in facts.strays.items()
        }
        return Phrase(summary, fixes, _notes(finding))
    summary = f"rank {r} holds {facts.ratio:.1f}x its peers' GPU memory on {gpu} ({mine} vs {peer})"
    fix = (
        f"rank {r} holds {fmt_gib(facts.mem_bytes - facts.peer_bytes)} more than its peers on "
        f"{gpu}: find what only this rank keeps on the GPU (evaluation or metric tensors, an EMA "
        "or checkpoint copy of the model, `if rank == 0:` branches) and move it to the CPU or "
        "share it across ranks; every rank can then use the batch the heaviest one allows"
    )
    return Phrase(summary, {r: fix}, _notes(finding))


@phrase_facts.register
def _peak(facts: HeavyPeak, finding: Finding) -> Phrase:
    r = facts.rank
    summary = (
        f"rank {r} peaks at {facts.ratio:.1f}x its peers' allocated GPU memory "
        f"({fmt_gib(facts.peak_bytes)} vs {fmt_gib(facts.peer_bytes)})"
    )
    fix = (
        f"rank {r} allocates {fmt_gib(facts.peak_bytes - facts.peer_bytes)} more than its peers "
        "at its peak: find what only this rank keeps on the GPU (evaluation or metric tensors, "
        "an EMA or checkpoint copy, `if rank == 0:` branches)"
    )
    return Phrase(summary, {r: fix}, _notes(finding))


@phrase_facts.register
def _budget(facts: HeavyBudget, finding: Finding) -> Phrase:
    r, excess = facts.rank, facts.extra_bytes
    # The parts worth naming: 1% of the excess or more, largest first.
    what = ", ".join(
        f"{PART_NAMES[p]} +{fmt_bytes(v)}"
        for p, v in sorted(facts.extra_by_part.items(), key=lambda kv: -kv[1])
        if v >= 0.01 * excess
    )
    summary = f"rank {r} holds {fmt_bytes(excess)} more than its peers' measured memory ({what})"
    if facts.main_part == "other_module_bytes":
        fix = (
            f"rank {r} keeps {fmt_bytes(facts.extra_by_part[facts.main_part])} in modules "
            "outside the model (an EMA or evaluation copy made with deepcopy): keep it on the "
            "CPU, update it every few steps, or keep it on every rank alike (or shard it); every "
            "rank can then use the batch the heaviest one allows"
        )
    else:
        fix = (
            f"rank {r} holds {fmt_bytes(excess)} more than its peers ({what}): find what "
            "only this rank keeps (a larger batch, extra parameters or optimizer state, "
            "`if rank == 0:` branches)"
        )
    return Phrase(summary, {r: fix}, _notes(finding))


def _notes(finding: Finding) -> dict[str, object]:
    """The evidence's codes in words, where the JSON report has always carried words."""
    notes: dict[str, object] = {"speedup_model": SPEEDUP_NOTE}
    source = finding.evidence.get("source")
    if source in SOURCE_TEXT:
        notes["source"] = SOURCE_TEXT[source]
    return notes
