"""What every rule's wording shares: :func:`phrase`, the :class:`Phrase` it returns, and the
phrases that recur across rules (the expected speed-up after a fix, the collectives others wait
in, a measured memory budget's parts and levers).

:func:`phrase_facts` dispatches on the type of a finding's facts; each ``phrasing/<rule>.py``
registers the wording of its rule's facts (``@phrase_facts.register``), and the package imports
them all, so a symptom's wording may word its cause's finding through :func:`phrase`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sized
from dataclasses import dataclass, field
from functools import singledispatch

from auditor.analysis.budget import CHECKPOINT_FACTOR, BudgetModel
from auditor.analysis.findings import Finding
from auditor.wording import fmt_bytes, fmt_expected, speedup_worth_naming


@dataclass(frozen=True)
class Phrase:
    """What a finding says: one summary line, and the change to make on each blamed rank."""

    summary: str = ""
    fixes: Mapping[int, str] = field(default_factory=dict)
    # Words the report adds to the finding's evidence, where the JSON report has always carried
    # them: ``fix``, the change to make on a GPU no rank owns (so no rank's fix says it).
    notes: Mapping[str, object] = field(default_factory=dict)


@singledispatch
def phrase_facts(facts: object, finding: Finding) -> Phrase:
    """The words of ``finding`` from its ``facts``: registered per facts type by each rule's
    phrasing module."""
    raise TypeError(f"no wording for {type(facts).__name__} ({finding.kind})")


def phrase(finding: Finding) -> Phrase:
    """``finding``'s words, from its facts."""
    if finding.facts is None:  # built without facts (a test's): nothing to say
        return Phrase()
    return phrase_facts(finding.facts, finding)


def with_expectation(
    fix: str, speedup: float | None, span: tuple[float, float] | None = None
) -> str:
    """``fix`` and the speed-up to expect from it, where it is worth naming (2% or more), with
    the range the prediction is sure of where it has one (``span``)."""
    if not speedup_worth_naming(speedup):
        return fix
    return f"{fix}; expect {fmt_expected(speedup, span)}"


def expectation(fix: str, finding: Finding) -> str:
    """:func:`with_expectation` with ``finding``'s predicted speed-up and range."""
    return with_expectation(fix, finding.predicted_speedup, finding.predicted_range)


def per_micro(accumulated: int) -> str:
    """After a batch size in micro-batch units under gradient accumulation:
    ``" (per micro-batch; 4 accumulated per step)"``; nothing without accumulation."""
    if accumulated <= 1:
        return ""
    return f" (per micro-batch; {accumulated} accumulated per step)"


def batch_noun(accumulated: int) -> str:
    """``micro-batch`` under gradient accumulation, ``batch`` without."""
    return "micro-batch" if accumulated > 1 else "batch"


def ops_text(ops: Iterable[str]) -> str:
    """Collective operations as one name: ``all_gather/ddp_allreduce``."""
    return "/".join(ops)


def s_if_one(items: Sized | int) -> str:
    """The verb's ``s`` for one subject: ``rank 1 waits`` but ``ranks 1, 2 wait``."""
    return "s" if _count(items) == 1 else ""


def it_or_them(items: Sized | int) -> str:
    """``it`` for one rank, ``them`` for several."""
    return "it" if _count(items) == 1 else "them"


def _count(items: Sized | int) -> int:
    return items if isinstance(items, int) else len(items)


# What each lever of a measured memory budget is (:meth:`BudgetModel.levers`), in words.
LEVER_TEXT = {
    "checkpointing": "gradient checkpointing (torch.utils.checkpoint on the largest blocks: "
    f"activations about {CHECKPOINT_FACTOR:.0f}x smaller for about a third more compute)",
    "autocast_bf16": "bf16 autocast (torch.autocast(device_type=..., dtype=torch.bfloat16): "
    "activations halved)",
    "bf16_params": "bf16 parameters and gradients (FSDP MixedPrecisionPolicy, or the model in "
    "bf16 with fp32 master weights in the optimizer)",
    "sgd_momentum": "an optimizer with one state per parameter (SGD with momentum: x3 the "
    "parameters instead of Adam's x4)",
    "sgd": "plain SGD (no state: x2 the parameters)",
    "shard": "sharding parameters, gradients and optimizer state over the ranks (FSDP "
    "fully_shard / ZeRO-3)",
}


def levers_text(model: BudgetModel, limit: int = 3) -> str:
    """A measured budget's levers, largest saving first, in words with their bytes and
    batches."""
    levers = sorted(model.levers().values(), key=lambda lv: -lv.frees_bytes)[:limit]
    parts = []
    for lv in levers:
        noun = batch_noun(model.accumulated)
        batch = "" if lv.largest_batch is None else f", {noun} up to {lv.largest_batch}"
        parts.append(f"{LEVER_TEXT[lv.name]} frees {fmt_bytes(lv.frees_bytes)}{batch}")
    return "; ".join(parts)


def parts_text(model: BudgetModel) -> str:
    """A measured budget's fixed part in words: parameters + gradients + optimizer state +
    buffers (+ copies), and the activations per sample."""
    b = model.budget
    opt = f" ({b.optimizer})" if b.optimizer else ""
    text = (
        f"fixed part {fmt_bytes(model.fixed_bytes)} = parameters {fmt_bytes(b.param_bytes)} + "
        f"gradients {fmt_bytes(b.grad_bytes)} + optimizer state {fmt_bytes(b.optimizer_bytes)}"
        f"{opt} + buffers {fmt_bytes(b.buffer_bytes)}"
    )
    if b.other_module_bytes:
        text += f" + modules outside the model {fmt_bytes(b.other_module_bytes)}"
    per = model.per_sample_bytes
    if per is not None:
        text += f"; activations {fmt_bytes(per)} per sample"
    return text
