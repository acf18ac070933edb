"""memory_headroom: how large a batch fits, measured instead of guessed.

Model (DOMAIN.md): memory in use = a fixed part (parameters, gradients, optimizer state) plus the
batch size times a per-sample part (the activations kept for backward). Fitted per rank by least
squares, ``mem = a + b * batch``, from the steps of the window whose batch size varied (a batch
ramp, a last partial batch, variable-length inputs), with at least two distinct batch sizes and
``r2 >= min_r2``. Memory per step is, in order of preference: the probe's per-step peak
(``torch.cuda.max_memory_allocated``), its allocated memory, or the NVML memory of the rank's GPU
matched by time to the batch in progress. NVML sees the caching allocator's reserved memory,
which does not shrink when the batch does; the probe's figures are therefore preferred, and the
gap between NVML's peak and the fitted allocator peak (CUDA context, allocator cache and
fragmentation) is added back as an overhead. The budget is the GPU's total less a safety
``margin``; the largest batch that fits is ``floor((budget - a - overhead) / b)``.

Decisions, per rank whose GPU's total memory is known:

* underused (``info``): the peak in the window is below ``underused`` of the total; the evidence
  names the largest batch that fits. A larger batch raises throughput only while the GPU is not
  yet saturated, halves the optimizer steps per epoch when doubled, and usually wants a larger
  learning rate: the fix says so.
* tight (``warning``): even the current batch does not fit within the budget, so a slightly
  larger input runs out of memory; suggested: gradient checkpointing (activations cut by the
  conservative end of the usual 4-10x, here 4x) and mixed precision (activations about halved),
  with the batch each allows; where the fixed part alone takes half the budget, the batch is not
  the lever: optimizer state (Adam keeps 4x the parameters, SGD 2-3x) and sharding are.
  Ranks an earlier ``memory_pressure`` finding already blamed are left to it.

Measured budget (preferred where the probe sent one, :mod:`auditor.analysis.budget`): no fit
and no batch variation needed. The fixed part (parameters, gradients, optimizer state, buffers,
modules outside the model) and the activations per sample are measured; the capacity is the
GPU's total less the margin, or on a CPU job the rank's share of the host's available memory.
The same two verdicts follow from ``fixed + batch x per_sample`` against the capacity, and the
evidence carries what each lever frees per rank (:meth:`~auditor.analysis.budget.BudgetModel.
levers`) and which one is the lever (fixed part or activations). On a CPU job both stay ``info``
unless the host is short of memory (available below ``host_short`` of its total).

Speed-up: not predicted: whether a larger batch is faster depends on the GPU's saturation.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..budget import BudgetModel, fmt_bytes, host_short, levers_text, model_for, parts_text
from ..devices import (
    DeviceStats,
    fmt_gib,
)
from ..findings import Finding
from ..measures import rank_memory_fits, ranks_text
from ..snapshot import RankView, Snapshot

SPEEDUP_NOTE = "not predicted: a larger batch is faster only while the GPU is not saturated"
# Gradient checkpointing commonly allows 4-10x larger batches; the conservative end is used.
CHECKPOINT_FACTOR = 4.0
MIXED_PRECISION_FACTOR = 2.0


def detect(
    snapshot: Snapshot,
    *,
    pressured: Collection[int] = (),
    min_steps: int = 8,
    min_samples: int = 5,
    min_r2: float = 0.8,
    margin: float = 0.10,
    underused: float = 0.60,
    host_short: float = 0.05,
) -> list[Finding]:
    """Say how large a batch fits, where memory is underused or too tight.

    Args:
        pressured: ranks memory_pressure blamed, left to it (the engine passes them,
            :mod:`auditor.analysis.causes`).
        min_steps: steps a rank needs in the window before it is judged.
        min_samples: NVML samples a GPU needs in the window before it is judged.
        min_r2: least goodness of the ``a + b * batch`` fit that is trusted.
        margin: share of the GPU's total kept free as a safety margin (0.10 = 10%).
        underused: peak memory below this share of the total counts as underused.
        host_short: on a CPU job, host memory available below this share of its total is
            short (findings then warn; otherwise they stay ``info``).
    """
    latest = {v.info.rank: _latest_batch(v) for v in snapshot.ranks}
    budgeted = budget_models(snapshot, margin=margin)
    findings: list[Finding] = _from_budgets(
        budgeted, pressured, margin=margin, underused=underused, short_ratio=host_short
    )
    roomy: dict[int, dict[str, Any]] = {}
    tight: dict[int, dict[str, Any]] = {}
    gpus: dict[int, DeviceStats] = {}
    for r, (fit, gpu) in sorted(
        rank_memory_fits(snapshot, min_steps=min_steps, min_samples=min_samples).items()
    ):
        current = latest.get(r)
        if r in budgeted:
            continue  # measured: the budget's verdict stands
        if gpu is None or not gpu.mem_total_bytes or current is None:
            continue
        if fit.per_sample_bytes <= 0 or fit.r2 < min_r2:
            continue
        total = gpu.mem_total_bytes
        budget = (1.0 - margin) * total
        peak = gpu.mem_used_max_bytes
        if peak is None:
            peak = round(fit.predict(max(fit.batches)))
        row: dict[str, Any] = {
            **fit.evidence(),
            "gpu": gpu.ref,
            "current_batch": current,
            "peak_bytes": peak,
            "total_bytes": total,
            "budget_bytes": round(budget),
            "predicted_at_current_bytes": round(fit.predict(current)),
        }
        largest = fit.largest_batch(budget)
        row["largest_batch"] = largest
        if peak < underused * total and largest is not None and largest > current:
            roomy[r] = row
            gpus[r] = gpu
        elif fit.predict(current) > budget and r not in pressured:
            row["largest_batch_checkpointing"] = fit.largest_batch(budget, CHECKPOINT_FACTOR)
            row["largest_batch_mixed_precision"] = fit.largest_batch(budget, MIXED_PRECISION_FACTOR)
            tight[r] = row
            gpus[r] = gpu
    if roomy:
        findings.append(_roomy(roomy, gpus, margin))
    if tight:
        findings.append(_tight(tight, gpus, margin))
    return findings


def _latest_batch(view: RankView) -> int | None:
    for s in reversed(view.steps):
        if s.batch_size:
            return int(s.batch_size)
    return None


def _fit_text(row: dict[str, Any]) -> str:
    return (
        f"memory = {fmt_gib(row['fixed_bytes'])} + {row['per_sample_bytes'] / 1024**2:.0f} MiB "
        "per sample "
        f"(r2 {row['r2']:.2f} over batches {', '.join(str(b) for b in row['batch_sizes'])})"
    )


def _roomy(rows: dict[int, dict[str, Any]], gpus: dict[int, DeviceStats], margin: float) -> Finding:
    fixes = {}
    for r, row in rows.items():
        fixes[r] = (
            f"batch_size {row['current_batch']} -> up to {row['largest_batch']} fits "
            f"{gpus[r].label} with a {margin:.0%} margin ({_fit_text(row)}); raise it only while "
            "throughput still grows (the GPU is not yet saturated) and scale the learning rate "
            "with it"
        )
    first = min(rows)
    row = rows[first]
    summary = (
        f"{ranks_text(rows)} use{'s' if len(rows) == 1 else ''} at most "
        f"{fmt_gib(row['peak_bytes'])} of {fmt_gib(row['total_bytes'])} on "
        f"{gpus[first].label}: a batch of up to {row['largest_batch']} fits "
        f"(now {row['current_batch']})"
    )
    return _finding("info", rows, gpus, margin, summary, fixes)


def _tight(rows: dict[int, dict[str, Any]], gpus: dict[int, DeviceStats], margin: float) -> Finding:
    fixes = {}
    for r, row in rows.items():
        fixed = row["fixed_bytes"] + row["overhead_bytes"]
        parts = [
            f"batch {row['current_batch']} needs about "
            f"{fmt_gib(row['predicted_at_current_bytes'])} of {fmt_gib(row['budget_bytes'])} "
            f"usable on {gpus[r].label} ({_fit_text(row)})"
        ]
        if fixed >= 0.5 * row["budget_bytes"]:
            parts.append(
                f"the model part alone is {fmt_gib(fixed)}: the batch is not the lever; use an "
                "optimizer with less state (Adam keeps 4x the parameters, SGD with momentum 3x) "
                "or shard parameters, gradients and optimizer state (FSDP / ZeRO)"
            )
        else:
            parts.append(
                f"gradient checkpointing (torch.utils.checkpoint on the largest blocks, about a "
                f"third more compute) fits up to batch {row['largest_batch_checkpointing']}; "
                "mixed precision (torch.autocast(device_type='cuda', dtype=torch.bfloat16)) fits "
                f"up to {row['largest_batch_mixed_precision']}; or batch_size "
                f"{row['current_batch']} -> {row['largest_batch']}"
            )
        fixes[r] = "; ".join(parts)
    first = min(rows)
    summary = (
        f"{ranks_text(rows)}: batch {rows[first]['current_batch']} does not fit "
        f"{gpus[first].label} with a {margin:.0%} margin "
        f"({fmt_gib(rows[first]['predicted_at_current_bytes'])} of "
        f"{fmt_gib(rows[first]['total_bytes'])})"
    )
    return _finding("warning", rows, gpus, margin, summary, fixes)


def _finding(
    severity: str,
    rows: dict[int, dict[str, Any]],
    gpus: dict[int, DeviceStats],
    margin: float,
    summary: str,
    fixes: dict[int, str],
) -> Finding:
    """Both verdicts carry the same evidence: the fit per rank, its GPU and the margin."""
    return Finding(
        kind="memory_headroom",
        severity=severity,
        ranks=tuple(sorted(rows)),
        summary=summary,
        evidence={
            "gpus": [gpus[r].ref for r in sorted(rows)],
            "per_rank": {str(r): row for r, row in sorted(rows.items())},
            "margin": margin,
            "speedup_model": SPEEDUP_NOTE,
        },
        fixes=fixes,
        predicted_speedup=None,
    )


def budget_models(snapshot: Snapshot, *, margin: float) -> dict[int, BudgetModel]:
    """Each rank's measured budget against its capacity, where the probe measured the
    activations (the per-sample part) and the capacity is known."""
    out: dict[int, BudgetModel] = {}
    world = snapshot.world_size
    for view in snapshot.ranks:
        b = view.memory
        if b is None or b.activations_per_sample is None:
            continue
        batch = _latest_batch(view) or b.activation_batch
        model = model_for(b, batch=batch, margin=margin, world_size=world)
        if model.capacity_bytes is not None and batch:
            out[view.info.rank] = model
    return out


def _where(model: BudgetModel) -> str:
    if model.budget.device_total_bytes:
        return f"the GPU's {fmt_bytes(model.budget.device_total_bytes)}"
    return "this rank's share of the host's available memory"


def _from_budgets(
    models: dict[int, BudgetModel],
    pressured: Collection[int],
    *,
    margin: float,
    underused: float,
    short_ratio: float,
) -> list[Finding]:
    """The two verdicts from the measured budgets."""
    roomy: dict[int, BudgetModel] = {}
    tight: dict[int, BudgetModel] = {}
    for r, m in sorted(models.items()):
        current, cap, largest = m.current_bytes, m.capacity_bytes, m.largest_batch()
        if current is None or cap is None or m.batch is None:
            continue
        if current > cap:
            if r not in pressured:
                tight[r] = m
        elif current < underused * cap and largest is not None and largest > m.batch:
            roomy[r] = m
    out: list[Finding] = []
    if roomy:
        fixes = {r: _roomy_fix(m, margin) for r, m in roomy.items()}
        first = roomy[min(roomy)]
        room = (
            f"a batch of up to {first.largest_batch()} fits (now {first.batch})"
            if first.budget.device_total_bytes
            else "memory does not limit the batch"
        )
        summary = (
            f"{ranks_text(roomy)} hold{'s' if len(roomy) == 1 else ''} "
            f"{fmt_bytes(first.current_bytes)} of {fmt_bytes(first.capacity_bytes)} usable: {room}"
        )
        out.append(_budget_finding("info", roomy, margin, summary, fixes))
    if tight:
        fixes = {}
        for r, m in tight.items():
            lever = "the fixed part" if m.main_lever == "fixed" else "the activations"
            fixes[r] = (
                f"batch {m.batch} needs about {fmt_bytes(m.current_bytes)} of "
                f"{fmt_bytes(m.capacity_bytes)} usable ({_where(m)}; {parts_text(m)}); the lever "
                f"is {lever}: {levers_text(m, fmt_bytes)}"
            )
        first = tight[min(tight)]
        gpu = any(m.budget.device_total_bytes for m in tight.values())
        short = any(host_short(m.budget, short_ratio) for m in tight.values())
        summary = (
            f"{ranks_text(tight)}: batch {first.batch} does not fit with a {margin:.0%} margin "
            f"({fmt_bytes(first.current_bytes)} of {fmt_bytes(first.capacity_bytes)} usable)"
        )
        out.append(
            _budget_finding("warning" if gpu or short else "info", tight, margin, summary, fixes)
        )
    return out


def _roomy_fix(m: BudgetModel, margin: float) -> str:
    """On a GPU, the largest batch that fits; on a CPU job only what the rank holds: the host's
    memory would "fit" an absurd batch (millions of samples), and on a CPU the batch is sized
    by throughput, not memory. The evidence keeps the figure either way."""
    if not m.budget.device_total_bytes:
        return (
            f"nothing to change for memory: batch {m.batch} holds {fmt_bytes(m.current_bytes)} "
            f"({parts_text(m)}) of {fmt_bytes(m.capacity_bytes)} usable; on a CPU the batch is "
            "sized by throughput, not memory"
        )
    return (
        f"batch_size {m.batch} -> up to {m.largest_batch()} fits {_where(m)} with a "
        f"{margin:.0%} margin ({parts_text(m)}); raise it only while throughput still grows and "
        "scale the learning rate with it"
    )


def _budget_finding(
    severity: str,
    models: dict[int, BudgetModel],
    margin: float,
    summary: str,
    fixes: dict[int, str],
) -> Finding:
    return Finding(
        kind="memory_headroom",
        severity=severity,
        ranks=tuple(sorted(models)),
        summary=summary,
        evidence={
            "gpus": [],
            "per_rank": {str(r): m.evidence() for r, m in sorted(models.items())},
            "margin": margin,
            "speedup_model": SPEEDUP_NOTE,
        },
        fixes=fixes,
        predicted_speedup=None,
    )
