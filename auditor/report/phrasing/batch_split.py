"""batch_split in words: the uneven split, who holds the others back and whose samples count
more; the equal split as the fix (DataParallel: batches that divide by the GPU count); and the
evidence's codes in words (the gradient weighting, the epoch lengths, the speed-up model)."""

from __future__ import annotations

from collections.abc import Iterable

from auditor.analysis.findings import Finding
from auditor.analysis.rules.batch_split import (
    DISTRIBUTED_SAMPLER,
    EQUAL_PER_RANK,
    SAMPLES_PER_SECOND,
    DataParallelFacts,
    Facts,
)
from auditor.wording import ranks_text, speedup_worth_naming

from .words import Phrase, expectation, per_micro, phrase_facts, s_if_one


@phrase_facts.register
def _(facts: Facts, finding: Finding) -> Phrase:
    blamed = finding.ranks
    speedup = finding.predicted_speedup
    averaged = facts.averaged_by
    parts: list[str] = []
    if speedup_worth_naming(speedup) or not averaged:
        parts.append(f"{ranks_text(blamed)} hold{s_if_one(blamed)} the others back")
    if averaged:
        parts.append(
            f"each sample of {ranks_text(facts.small)} counts {facts.sample_weight:.1f}x one of "
            f"{ranks_text(facts.large)} in the averaged gradient"
        )
    listing = ", ".join(f"rank {r}: {round(b)}" for r, b in sorted(facts.batches.items()))
    summary = f"uneven per-rank batches ({listing}): " + ", and ".join(parts)
    fixes: dict[int, str] = {}
    notes = _notes(facts, finding)
    if facts.accumulated:
        for r in sorted(facts.batches):
            fix = _micro_fix(facts, r, r in blamed)
            if fix:
                fixes[r] = expectation(fix, finding)
        return Phrase(summary, fixes, notes)
    for r, b in sorted(facts.batches.items()):
        batch, equal = round(b), facts.equal[r]
        if batch == equal:
            continue
        note = "" if r in blamed else f" (keeps the global batch of {facts.global_batch})"
        fix = f"batch_size {batch} -> {equal}{note}"
        if r in blamed and averaged:
            fix += f" (the equal split: {averaged} weighs every rank's gradient equally)"
        if r in blamed and averaged and facts.speeds_differ:
            fix += (
                f", or keep {batch} for its speed and scale each rank's loss by its "
                f"batch x {len(facts.batches)} / {facts.global_batch} so every sample counts once"
            )
        fixes[r] = expectation(fix, finding)
    return Phrase(summary, fixes, notes)


def _notes(facts: Facts, finding: Finding) -> dict[str, object]:
    """The evidence's gradient weighting and epoch lengths in words, where it names them."""
    notes: dict[str, object] = {}
    small, large = facts.small, facts.large
    lo, hi = round(facts.batches[small[0]]), round(facts.batches[large[0]])
    if finding.evidence.get("gradient_weighting") == EQUAL_PER_RANK:
        notes["gradient_weighting"] = (
            f"{facts.averaged_by} averages gradients with equal weight per rank, so each sample "
            f"of {ranks_text(small)} (batch {lo}) counts {facts.sample_weight:.1f}x one of "
            f"{ranks_text(large)} (batch {hi})"
        )
    epoch = finding.evidence.get("epoch_length")
    if epoch is not None:
        steps = (
            f"{ranks_text(small)} (batch {lo}) take{s_if_one(small)} "
            f"{facts.sample_weight:.1f}x the steps of {ranks_text(large)} (batch {hi}) to go "
            "through it, so the ranks' epochs end at different steps"
        )
        notes["epoch_length"] = (
            f"DistributedSampler gives every rank the same samples per epoch: {steps}"
            if epoch == DISTRIBUTED_SAMPLER
            else "if every rank draws the same samples per epoch (as with DistributedSampler), "
            + steps
        )
    return notes


def _micro_fix(facts: Facts, r: int, is_blamed: bool) -> str:
    """A rank's fix under gradient accumulation, in micro-batch samples (the DataLoader's
    ``batch_size``); empty where its micro-batch is already the equal one."""
    batch, equal, n = round(facts.micro[r]), facts.micro_equal[r], facts.accumulated[r]
    if batch == equal:
        return ""
    averaged = facts.averaged_by
    notes = [f"per micro-batch; {n} accumulated per step"] if n > 1 else []
    if not is_blamed:
        notes.append(f"keeps the global batch of {facts.global_batch} per step")
    fix = f"batch_size {batch} -> {equal}" + (f" ({'; '.join(notes)})" if notes else "")
    if is_blamed and averaged:
        fix += f" (the equal split: {averaged} weighs every rank's gradient equally)"
    if is_blamed and averaged and facts.speeds_differ:
        fix += (
            f", or keep {batch} per micro-batch for its speed and scale each rank's loss by its "
            f"samples per step x {len(facts.batches)} / {facts.global_batch} so every sample "
            "counts once"
        )
    return fix


@phrase_facts.register
def _dataparallel(facts: DataParallelFacts, finding: Finding) -> Phrase:
    batch, n = facts.batch, facts.gpu_count
    short = ", ".join(f"GPU {g.index} gets {g.chunk or 'nothing'}" for g in facts.short)
    summary = (
        f"DataParallel rank {facts.rank} splits batch {batch} over {n} GPUs as "
        f"{_join(facts.chunks)}: {short} and idles while the others finish"
    )
    choices = " or ".join(f"{b} ({b // n} per GPU)" for b in facts.nearest)
    fix = (
        f"batch_size {batch} -> {choices}{per_micro(facts.accumulated)}: "
        f"torch.chunk splits {batch} over {n} GPUs as "
        f"{_join(facts.chunks)} ({short}); or keep {batch} with per-GPU chunk sizes "
        f"{_join(facts.even)} (a scatter with explicit chunk sizes)"
    )
    notes: dict[str, object] = {}
    if finding.evidence.get("speedup_model") == SAMPLES_PER_SECOND:
        notes["speedup_model"] = (
            "samples per second: compute paced by the largest chunk, the rest of the step unchanged"
        )
    return Phrase(summary, {facts.rank: expectation(fix, finding)}, notes)


def _join(values: Iterable[int]) -> str:
    return ", ".join(str(v) for v in values)
