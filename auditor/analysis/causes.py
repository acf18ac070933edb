"""Cause-linking, the engine's step between rules: which finding explains which, declared once.

Rules measure the snapshot and decide alone; none reads another rule's findings. Three kinds of
link remain, and only this module knows them:

* *explained ranks*: a rank another finding already explains is not judged again where that
  changes the rule's own arithmetic (peer medians, speed-up, the worker plan). compute_straggler
  skips ranks that cpu_oversubscription or hardware_straggler blame; data_starvation does not
  raise workers on ranks whose host cpu_oversubscription found saturated; memory_headroom leaves
  memory_pressure's ranks to it. :func:`inputs` hands those rules plain rank sets.
* *symptom -> cause*: utilization_imbalance is told the candidate :data:`CAUSES` (most specific
  first) and names the one that blames the ranks the others wait for.
* *repeats*: a memory_imbalance finding on a GPU that dataparallel_gather already named (as an
  explained memory_imbalance) is the same observation; :func:`drop_repeats` keeps the explained one.

The engine runs rules in :data:`LISTING` order, which puts every explaining rule first (a test
checks it), and lists findings of equal severity and speed-up in that order: the result never
depends on the order of ``RULES``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .findings import Finding

# Candidate causes of a symptom, the most specific first.
CAUSES = (
    "hardware_straggler",
    "dataparallel_gather",
    "batch_split",
    "compute_straggler",
    "data_starvation",
    "cpu_oversubscription",
)

# Rule -> the rules whose findings change what it concludes.
EXPLAINED_BY: dict[str, tuple[str, ...]] = {
    "compute_straggler": ("cpu_oversubscription", "hardware_straggler"),
    "data_starvation": ("cpu_oversubscription",),
    "memory_headroom": ("memory_pressure",),
    "memory_imbalance": ("dataparallel_gather",),
    "utilization_imbalance": CAUSES,
}

# Evaluation and listing order: causes before what they explain.
LISTING = (
    "cpu_oversubscription",
    "data_starvation",
    "batch_split",
    "hardware_straggler",
    "compute_straggler",
    "dataparallel_gather",
    "memory_imbalance",
    "memory_pressure",
    "memory_headroom",
    "idle_device",
    "utilization_imbalance",
)

# Keyword inputs the engine gives (never thresholds a user may set).
INPUTS = frozenset({"explained", "oversubscribed", "pressured", "causes"})


def order(names: Iterable[str]) -> list[str]:
    """``names`` in :data:`LISTING` order (others after, by name), whatever order they came in."""
    return sorted(names, key=lambda n: (LISTING.index(n) if n in LISTING else len(LISTING), n))


def _blamed(found: Mapping[str, Sequence[Finding]], *rules: str) -> frozenset[int]:
    return frozenset(r for rule in rules for f in found.get(rule, ()) for r in f.ranks)


def inputs(rule: str, found: Mapping[str, Sequence[Finding]]) -> dict[str, Any]:
    """The keyword inputs ``rule`` takes from the findings of the rules that explain it."""
    if rule == "compute_straggler":
        return {"explained": _blamed(found, "cpu_oversubscription", "hardware_straggler")}
    if rule == "data_starvation":
        return {"oversubscribed": _blamed(found, "cpu_oversubscription")}
    if rule == "memory_headroom":
        return {"pressured": _blamed(found, "memory_pressure")}
    if rule == "utilization_imbalance":
        return {"causes": candidate_causes(f for fs in found.values() for f in fs)}
    return {}


def candidate_causes(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """The findings that can explain a symptom, in :data:`CAUSES` order (stable within a kind)."""
    return tuple(
        sorted((f for f in findings if f.kind in CAUSES), key=lambda f: CAUSES.index(f.kind))
    )


def named_gpus(findings: Iterable[Finding]) -> set[str]:
    """UUIDs of the GPUs these findings name in their evidence."""
    out: set[str] = set()
    for f in findings:
        for g in f.evidence.get("gpus") or ():
            if isinstance(g, dict) and g.get("uuid"):
                out.add(str(g["uuid"]))
    return out


def drop_repeats(found: Mapping[str, list[Finding]]) -> dict[str, list[Finding]]:
    """memory_imbalance's own findings less those on a GPU an explained memory_imbalance finding
    (dataparallel_gather's) already names."""
    out = dict(found)
    explained = [
        f
        for rule, fs in found.items()
        if rule != "memory_imbalance"
        for f in fs
        if f.kind == "memory_imbalance"
    ]
    named = named_gpus(explained)
    if named and "memory_imbalance" in out:
        out["memory_imbalance"] = [
            f for f in out["memory_imbalance"] if f.cause or not (named_gpus([f]) & named)
        ]
    return out
