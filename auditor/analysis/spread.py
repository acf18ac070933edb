"""The range a predicted speed-up is sure of: the same rules, judging parts of the window alone.

A rule predicts from figures reduced over its window (medians, paces). How far that prediction
holds depends on how much those figures move over the run: a loader whose cost drifts, a host
that is busier in one minute than the next, a straggler that is slower some of the time. So the
window is cut into consecutive parts of equal time (:data:`PARTS`), every rule judges each part on
its own, and a finding's range runs from the least to the most that the whole window and each
part that found the same finding (kind, ranks, GPUs) predicted. A part that did not find it (the
fault had not begun, the part was too short to judge) says nothing about the finding's size and
is left out; with fewer than :data:`MIN_PARTS` parts that predicted a speed-up for it, a finding
gets no range (the report gives the one figure).

What the range does not hold: an error of the model itself (a fix that costs the host something
the run never measured). The fault benchmark (``bench/faults.py``) reports, per case, whether
the achieved speed-up fell inside the range, so that error shows where it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from .findings import Finding

# Parts the window is cut into, tried in turn: four quarters show a drift over the run; a run
# too short for a rule's ``min_steps`` in each quarter gets halves.
PARTS = (4, 2)
# Parts that must have predicted a speed-up for the finding before its range is given.
MIN_PARTS = 2

Key = tuple[str, tuple[int, ...], tuple[str, ...]]


def key(f: Finding) -> Key:
    """What makes findings of two windows one: the kind, the ranks and the GPUs it names."""
    return f.kind, f.ranks, f.gpus


def part_bounds(start: float, end: float, parts: int) -> list[tuple[float, float]]:
    """``parts`` consecutive ``(start, end)`` windows of equal time covering ``[start, end]``;
    none where the window has no length (or an open start)."""
    if not (end > start) or start == float("-inf") or parts < 1:
        return []
    length = (end - start) / parts
    return [(start + i * length, start + (i + 1) * length) for i in range(parts)]


def spans(parts: Iterable[Sequence[Finding]]) -> dict[Key, list[float]]:
    """The speed-ups each finding was predicted in the parts that found it."""
    out: dict[Key, list[float]] = {}
    for found in parts:
        for f in found:
            if f.predicted_speedup is not None:
                out.setdefault(key(f), []).append(f.predicted_speedup)
    return out


def with_ranges(
    findings: Sequence[Finding], parts: Iterable[Sequence[Finding]], *, min_parts: int = MIN_PARTS
) -> list[Finding]:
    """``findings`` with ``predicted_range`` set from the parts' findings (module doc): from
    the least to the most of the finding's own prediction and the parts'. A finding that
    predicts nothing, has a range already, or that fewer than ``min_parts`` parts predicted,
    is returned as is."""
    seen = spans(parts)
    out = []
    for f in findings:
        got = seen.get(key(f), [])
        if f.predicted_speedup is None or f.predicted_range is not None or len(got) < min_parts:
            out.append(f)
            continue
        every = [f.predicted_speedup, *got]
        out.append(replace(f, predicted_range=(min(every), max(every))))
    return out
