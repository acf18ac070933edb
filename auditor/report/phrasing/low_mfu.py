"""low_mfu in words: how much of what its GPUs can do the job does (MFU, FLOP/s, the card and
dtype) against what its model class reaches, where the rest of the time goes (largest first),
and what closes the gap first: the rank rules' fixes named by kind, bf16 autocast or TF32, a
larger micro-batch. Every rank alike is said as the job's, never as one rank's."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules.low_mfu import (
    LARGE,
    LEVER_SHARE,
    MEDIUM,
    NO_LEVER,
    NOT_PREDICTED,
    PRECISION,
    SMALL,
    SMALL_BATCH,
    Facts,
    Part,
)
from auditor.wording import fmt_flops, fmt_pct, ranks_text

from .words import Phrase, phrase_facts, with_expectation

# The gap's parts (``JobMfu.gap``) and the precision lever, in words.
PART_TEXT = {
    "startup": "start-up before the first step",
    "data_wait": "waiting for data",
    "h2d": "copying batches to the GPU",
    "collective_wait": "waiting at the collectives",
    "stalls": "work between the steps (checkpoints, evaluation, logging)",
    "host_overhead": "host overhead (the loop's own Python, nothing queued on the GPU)",
    SMALL_BATCH: "micro-batches too small to fill the GPU",
    "device": "kernels below peak (memory-bound and element-wise work, attention)",
    "teardown": "teardown after the last step",
    PRECISION: "fp32 matmuls that bf16 would run on the tensor cores",
}
CLASS_TEXT = {
    LARGE: "a large model",
    MEDIUM: "a mid-sized model",
    SMALL: "a small model",
}
BASIS_TEXT = {"run": "over the whole run", "step": "over a step at each rank's pace"}
SPEEDUP_MODEL = {
    LEVER_SHARE: "the leading lever's share of the time: 1 / (1 - share)",
    NOT_PREDICTED: "not predicted: a larger batch makes each step longer; samples per second "
    "gain as far as the GPU is not yet saturated",
    NO_LEVER: "not predicted: no lever to pull",
}
AUTOCAST = "torch.autocast(device_type='cuda', dtype=torch.bfloat16) around forward and loss"
AUTOCAST_FP16 = (
    "torch.autocast(device_type='cuda', dtype=torch.float16) around forward and loss, with "
    "torch.amp.GradScaler('cuda') scaling the loss"
)
TF32 = (
    "torch.backends.cuda.matmul.allow_tf32 = True (or torch.set_float32_matmul_precision('high'))"
)


@phrase_facts.register
def phrase(facts: Facts, finding: Finding) -> Phrase:
    summary = f"{_where(facts)}, where {_reach(facts)}"
    precision = next((p for p in facts.parts if p.name == PRECISION), None)
    if precision is not None:
        summary += (
            f"; its {facts.dtype if facts.dtype in ('fp32', 'tf32') else 'fp32'} matmuls run at "
            f"a fraction of the tensor cores' rate: bf16 would give back about "
            f"{fmt_pct(precision.share)} of the time"
        )
    listed = _parts_text(facts)
    if listed:
        summary += f"; the time lost: {listed}"
    notes: dict[str, object] = {"fix": _fix(facts, finding)}
    model = finding.evidence.get("speedup_model")
    if model in SPEEDUP_MODEL:
        notes["speedup_model"] = SPEEDUP_MODEL[model]
    return Phrase(summary, {}, notes)


def fmt_mfu(mfu: float | None) -> str:
    """An MFU as a percentage: whole from 10% up, one decimal below (``4.2%``, ``0.3%``,
    ``<0.1%``)."""
    if mfu is None:
        return "-"
    if mfu < 0.001:
        return "<0.1%"
    return fmt_pct(mfu) if mfu >= 0.1 else f"{mfu * 100:.1f}%"


def mfu_text(
    mfu: float | None, flops_per_s: float | None, device: str | None, *, gpu: bool = True
) -> str:
    """``12% MFU (37 TFLOP/s on NVIDIA H100 80GB HBM3)``, ``3.1 GFLOP/s (no MFU on a CPU)``: a
    job's or a rank's work as the report says it everywhere (``gpu``: its FLOPs ran on GPUs)."""
    rate = fmt_flops(flops_per_s, "FLOP/s")
    if mfu is not None:
        where = f" on {device}" if device else ""
        return f"{fmt_mfu(mfu)} MFU ({rate}{where})"
    if not gpu:
        return f"{rate} (no MFU on a CPU)"
    if device:
        return f"{rate} (no MFU: no peak figure for {device})"
    return f"{rate} (no MFU: no GPU sample named the card)"


def _where(f: Facts) -> str:
    dtype = f" in {f.dtype}" if f.dtype else ""
    basis = BASIS_TEXT.get(f.basis)
    return f"the job reaches {mfu_text(f.mfu, f.flops_per_s, f.device_name)}{dtype}" + (
        f" {basis}" if basis else ""
    )


def _reach(f: Facts) -> str:
    per = fmt_flops(f.flops_per_sample, "FLOPs")
    if f.model_class in CLASS_TEXT:
        who = f"{CLASS_TEXT[f.model_class]} ({per} a sample)"
    else:
        who = "a model of this size"
    return f"{who} reaches about {fmt_pct(f.reach)}"


def _parts_text(f: Facts) -> str:
    texts = []
    for p in f.parts:
        if p.name == PRECISION:
            continue
        text = f"{PART_TEXT.get(p.name, p.name)} {fmt_pct(p.share)}"
        if p.by is not None:
            who = f" on {ranks_text(p.ranks)}" if p.ranks else ""
            text += f" ({p.by}{who}, above)"
        texts.append(text)
    return ", ".join(texts)


def _fix(f: Facts, finding: Finding) -> str:
    if f.lead is None:
        return "no lever the auditor can name for these parts: see where the time goes above"
    steps = [_lever_text(p, f, finding) for p in f.parts if p.lever is not None]
    first, *rest = steps
    if not rest:
        return first
    return f"first, {first}; then " + "; then ".join(rest)


def _lever_text(p: Part, f: Facts, finding: Finding) -> str:
    if p.by is not None:
        return f"the fix {p.by} gives for {PART_TEXT.get(p.name, p.name)} ({fmt_pct(p.share)})"
    if p.name == PRECISION:
        fix = next((x for x in finding.fixes if x.lever == "autocast_bf16"), None)
        gain = None if fix is None else fix.speedup
        if fix is not None and fix.proposed == "fp16":  # a card without bf16
            text = with_expectation(f"run the model in fp16: {AUTOCAST_FP16}", gain)
        else:
            text = with_expectation(f"run the model in bf16: {AUTOCAST}", gain)
        if f.tf32 > 0:
            tf32 = next((x.speedup for x in finding.fixes if x.lever == "tf32"), None)
            text += "; at the least " + with_expectation(f"allow TF32: {TF32}", tf32)
        return text
    if p.name == SMALL_BATCH:
        groups: dict[tuple[float, int], list[int]] = {}
        for r, pair in sorted(f.batch.items()):
            groups.setdefault(pair, []).append(r)
        moves = "; ".join(
            f"{ranks_text(rs)}: {cur:g} -> {new}" for (cur, new), rs in groups.items()
        )
        return (
            f"a larger micro-batch, {moves} (the DataLoader's batch_size; scale the learning "
            "rate with it)"
        )
    return PART_TEXT.get(p.name, p.name)
