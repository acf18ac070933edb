"""A finding set aside by the review (:mod:`auditor.analysis.consistency`) in words: what it
said, what outranked it, and why. The report lists these as notes under the verdict, so a
reader sees what was left out and on what evidence."""

from __future__ import annotations

from auditor.analysis.consistency import (
    ACCOUNT_WAIT,
    FIX_UNDONE,
    GPU_WORKS,
    MEMORY_CLIMBS,
    SetAside,
)
from auditor.wording import ranks_text


def _who(kind: str, ranks: tuple[int, ...]) -> str:
    return f"{kind} on {ranks_text(ranks)}" if ranks else kind


def sentence(s: SetAside, gpu_labels: dict[str, str] | None = None) -> str:
    """``Set aside: idle_device on vm GPU 0 - rank 1 computes there (compute_straggler on
    rank 1 rests on its own timings).``"""
    f = s.finding
    labels = gpu_labels or {}
    gpus = ", ".join(labels.get(g, g) for g in f.gpus)
    what = f"{f.kind} on {gpus}" if gpus else _who(f.kind, f.ranks)
    by = _who(s.by_kind, s.by_ranks)
    if s.reason == GPU_WORKS:
        why = f"the GPU works: {by} rests on the ranks' own device timings, which outrank NVML"
    elif s.reason == FIX_UNDONE:
        why = f"its {s.lever} fix would undo the one of {by}, the stronger finding"
    elif s.reason == MEMORY_CLIMBS:
        why = f"its larger batch would fill memory that already climbs ({by})"
    elif s.reason == ACCOUNT_WAIT:
        why = f"the run's steps show more: {by}"
    else:
        why = f"{by} outranks it ({s.reason})"
    return f"Set aside: {what} - {why}."
