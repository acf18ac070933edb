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

The range's low end also holds what the job's hosts can give (:func:`host_ceiling`): a fix that
removes a wait (a rank starved by slow storage, a rank that sleeps or waits on I/O) leaves every
CPU-second of a step to do in less time, and a host whose cores were already busy cannot do them
much faster. Its cores over its busy cores is the most any such fix can speed the job up; where
that is below a prediction, the range reaches down to it (a fix that also removes CPU work may
do better: the barrier model's figure stays the prediction).

A run that turned slow for good (a ``slowdown`` at step N) also bounds the findings that came
with the change: the steps before N ran without the fault, so its fix takes the job back to that
pace, the prediction (:func:`capped_at`, applied by :meth:`auditor.audit.Audit.final` to
findings the steps before N do not have). The model reads the slow steps, which run cheaper than
the job will once every rank works again: a starved rank's peer computes alone on a shared host.
The model's own figure stays the range's high end: the pace before is measured too, on a
stretch of the run, and a fix may do more than undo the fault.

A re-run does not keep the pace of the run it follows, even with nothing changed: the same job
on the same host steps faster in one minute than the next. So the range also holds the job's
own pace as it moved over the parts that found the finding (:func:`pace_spread`: the slowest
part's step over the fastest's): its low end divided by it, its high end multiplied, after the
cap above (:func:`with_pace`). What one run measured cannot be surer than the run is steady.

What the range does not hold: an error of the model beyond these (a fix that costs something
the run never measured). The fault benchmark (``bench/faults.py``) reports, per case, whether
the achieved speed-up fell inside the range, so that error shows where it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from .findings import Finding
from .snapshot import Snapshot

# Parts the window is cut into, tried in turn: four quarters show a drift over the run; a run
# too short for a rule's ``min_steps`` in each quarter gets halves.
PARTS = (4, 2)
# Parts that must have predicted a speed-up for the finding before its range is given.
MIN_PARTS = 2
# Steps a rank needs in a part before the part's pace counts (the rules' usual least).
PACE_MIN_STEPS = 8

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


def widened(f: Finding, values: Iterable[float]) -> Finding:
    """``f`` with its range stretched over ``values`` (from its prediction and its range so
    far: a rule may give one, from its model's alternatives)."""
    if f.predicted_speedup is None:
        return f
    every = [f.predicted_speedup, *(f.predicted_range or ()), *values]
    return replace(f, predicted_range=(min(every), max(every)))


def with_ranges(
    findings: Sequence[Finding],
    parts: Sequence[Sequence[Finding]],
    *,
    min_parts: int = MIN_PARTS,
    only: set[Key] | None = None,
) -> tuple[list[Finding], set[Key]]:
    """``findings`` with their ranges stretched over what the parts predicted (module doc),
    and the findings that got one. A finding that predicts nothing, that fewer than
    ``min_parts`` parts predicted, or that is not in ``only`` (where given) is returned as is."""
    seen = spans(parts)
    ranged = {k for k, got in seen.items() if len(got) >= min_parts}
    if only is not None:
        ranged &= only
    return [widened(f, seen[key(f)]) if key(f) in ranged else f for f in findings], ranged


def job_pace(snapshot: Snapshot) -> float | None:
    """The job's time per step in ``snapshot``: the slowest rank's steps' time over their count
    (a step that comes once in many, an epoch's worker start or a periodic stall, paces the job
    as much as the rest, where a median would land on one kind or the other); None where no
    rank has the steps to say."""
    paces = []
    for view in snapshot.ranks:
        steps = view.steps
        n = sum(s.count for s in steps)
        if n >= PACE_MIN_STEPS:
            paces.append(sum(s.step_s * s.count for s in steps) / n)
    pace = max(paces, default=0.0)
    return pace if pace > 0 else None


def pace_spread(
    parts: Sequence[Sequence[Finding]], paces: Sequence[float | None]
) -> dict[Key, float]:
    """Per finding that at least two parts found with a pace: the slowest of those parts' job
    step over the fastest's (1.0: the pace held)."""
    seen: dict[Key, list[float]] = {}
    for found, pace in zip(parts, paces, strict=True):
        if pace is None:
            continue
        for f in found:
            if f.predicted_speedup is not None:
                seen.setdefault(key(f), []).append(pace)
    return {k: max(p) / min(p) for k, p in seen.items() if len(p) >= 2}


def with_pace(findings: Sequence[Finding], spread: Mapping[Key, float]) -> list[Finding]:
    """``findings`` with a range whose ends reach out by the job's pace spread over the parts
    that found them (:func:`pace_spread`; recorded as the evidence's ``pace_spread``), never
    below 1.0; a finding without a range or a spread is returned as is."""
    out = []
    for f in findings:
        q = spread.get(key(f))
        if f.predicted_range is None or q is None or q <= 1.0:
            out.append(f)
            continue
        lo, hi = f.predicted_range
        out.append(
            replace(
                f,
                predicted_range=(max(1.0, lo / q), hi * q),
                evidence={**f.evidence, "pace_spread": round(q, 3)},
            )
        )
    return out


def host_ceiling(snapshot: Snapshot) -> float | None:
    """The most a fix that removes no CPU work can speed the job up: its busiest host's cores
    over its busy cores (the window's median), of the hosts its ranks run on; None where none
    of them was sampled."""
    ceilings = []
    for host in snapshot.hosts():
        cpu = snapshot.host_cpu(host)
        if cpu is not None and cpu[0] > 0 and cpu[1] > 0:
            ceilings.append(cpu[0] / cpu[1])
    return min(ceilings, default=None)


def with_ceiling(findings: Sequence[Finding], ceiling: float | None) -> list[Finding]:
    """``findings`` whose prediction is above ``ceiling`` (:func:`host_ceiling`) with their
    range reaching down to it (from the prediction itself where there was no range)."""
    out = []
    for f in findings:
        point = f.predicted_speedup
        if ceiling is None or point is None or ceiling >= point:
            out.append(f)
            continue
        lo, hi = f.predicted_range or (point, point)
        out.append(replace(f, predicted_range=(max(1.0, min(lo, ceiling)), hi)))
    return out


def capped_at(f: Finding, cap: float, step: int) -> Finding:
    """``f`` promising ``cap`` (the job's time per step now over before the change at
    ``step``) where its model promised more, its fixes' speed-ups no higher; its range from the
    lower of its low end and the cap up to the model's figure (the pace before the change is
    one stretch of one run, measured as noisily as the rest, and a fix that does more than
    undo the fault, more workers than the job had before it, may beat it); the evidence keeps
    what the model gave (``speedup_capped``)."""
    point = f.predicted_speedup
    if point is None or point <= cap:
        return f
    lo, _ = f.predicted_range or (point, point)
    return replace(
        f,
        predicted_speedup=cap,
        predicted_range=(min(lo, cap), point),
        fixes=tuple(
            replace(x, speedup=cap) if x.speedup is not None and x.speedup > cap else x
            for x in f.fixes
        ),
        evidence={
            **f.evidence,
            "speedup_capped": {"model": round(point, 3), "before_step": step},
        },
    )
