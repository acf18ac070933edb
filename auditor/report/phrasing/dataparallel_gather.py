"""dataparallel_gather in words: the primary GPU's memory and busy share against the others';
the torchrun command to move to DDP, or a scatter that gives the primary a smaller chunk. Also
the words of the ``memory_imbalance`` finding the rule emits on the primary GPU."""

from __future__ import annotations

from collections.abc import Sequence

from auditor.analysis.findings import Finding
from auditor.analysis.rules.dataparallel_gather import Facts, PrimaryMemory
from auditor.wording import fmt_gib

from .memory_imbalance import SPEEDUP_NOTE as MEMORY_SPEEDUP_NOTE
from .words import Phrase, phrase_facts

SPEEDUP_NOTE = (
    "not predicted: one process drives every GPU, so per-GPU step times are not measured; DDP "
    "also removes the per-step model replication and the GIL contention between replicas"
)
SCRIPT_NOTE = (
    "placeholder: the snapshot does not carry the job's command; set the rule's `script` "
    "threshold to name it"
)


@phrase_facts.register
def _(facts: Facts, finding: Finding) -> Phrase:
    parts = []
    if facts.mem_ratio is not None:
        parts.append(
            f"{facts.mem_ratio:.2f}x the memory ({fmt_gib(facts.mem_bytes)} vs "
            f"{fmt_gib(facts.others_mem_bytes)})"
        )
    if facts.busy_ratio is not None:
        parts.append(f"busy {(facts.busy or 0.0):.0%} vs {(facts.others_busy or 0.0):.0%}")
    summary = (
        f"nn.DataParallel gathers every output on {facts.gpu}: {', '.join(parts)} of the other GPUs"
    )
    fix = (
        f"move to DistributedDataParallel, one process per GPU: `{facts.command}` with the model "
        "wrapped in DistributedDataParallel(model.to(local_rank), device_ids=[local_rank]) and "
        "a DistributedSampler"
    )
    if facts.batch:
        n = facts.gpu_count
        per = facts.per_process or 1
        if facts.accumulated > 1:
            fix += (
                f", batch_size {facts.batch} -> {per} per process (per micro-batch; "
                f"{facts.accumulated} accumulated per step: global batch "
                f"{per * n * facts.accumulated} per step)"
            )
        else:
            fix += f", batch_size {facts.batch} -> {per} per process (global batch {per * n})"
    if facts.balanced:
        fix += (
            f"; or keep DataParallel with a scatter that gives {facts.gpu} a smaller chunk: "
            f"{_chunks_text(facts.balanced)} instead of {_chunks_text(facts.chunks)}"
        )
    notes: dict[str, object] = {"speedup_model": SPEEDUP_NOTE}
    if facts.placeholder:
        notes["script_note"] = SCRIPT_NOTE
    return Phrase(summary, {facts.rank: fix}, notes)


@phrase_facts.register
def _memory(memory: PrimaryMemory, finding: Finding) -> Phrase:
    facts = memory.gather
    summary = (
        f"{facts.gpu} holds {facts.mem_ratio:.2f}x the memory of the other GPUs of "
        f"DataParallel rank {facts.rank} ({fmt_gib(facts.mem_bytes)} vs "
        f"{fmt_gib(facts.others_mem_bytes)}): it gathers their outputs"
    )
    fix = (
        f"give {facts.gpu} a smaller chunk: {_chunks_text(facts.balanced)} for batch "
        f"{facts.batch} over {facts.gpu_count} GPUs, or move to DDP: `{facts.command}`"
        if facts.balanced
        else f"move to DDP so no GPU gathers the others' outputs: `{facts.command}`"
    )
    return Phrase(summary, {facts.rank: fix}, {"speedup_model": MEMORY_SPEEDUP_NOTE})


def _chunks_text(chunks: Sequence[int] | None) -> str:
    return "n/a" if not chunks else ", ".join(str(c) for c in chunks)
