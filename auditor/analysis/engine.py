"""Runs every rule over a snapshot: the thin facade the audit, the service and the tests call.

Steps of :func:`analyze`:

1. *reduce*: the snapshot reduces its samples once, on first use (per-rank ``stats`` at their
   pace, per-GPU ``gpu_stats``, GPU ``owners``; :class:`~auditor.analysis.snapshot.Snapshot`).
2. *measure, decide*: each rule of the registry (:mod:`auditor.analysis.rules`), in listing
   order, measures its inputs and decides, given what the rules it declares ``explained_by``
   concluded (they come before it).
3. *review*: the findings are checked against each other and against the run's time
   (:mod:`~auditor.analysis.consistency`): a contradiction is resolved by the stronger
   evidence, and the finding that loses is set aside with its reason.
4. *order*: most severe first, then the largest speed-up; ties in listing order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .consistency import Review
from .consistency import review as check
from .findings import Finding, finding_order
from .rules import REGISTRY, RULES
from .snapshot import Snapshot


def settings(overrides: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Every rule's thresholds with ``overrides`` (rule -> threshold -> value) applied.

    ValueError naming the first unknown rule or threshold, so a typo in ``--set`` is refused
    before a job starts or a service runs, not at the first verdict."""
    overrides = overrides or {}
    unknown = set(overrides) - set(RULES)
    if unknown:
        raise ValueError(
            f"unknown rule(s): {', '.join(sorted(unknown))}; rules: {', '.join(RULES)}"
        )
    return {rule.kind: rule.settings(overrides.get(rule.kind)) for rule in REGISTRY}


def check_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """ValueError unless every rule and threshold in ``overrides`` exists (:func:`settings`)."""
    settings(overrides)


def analyze(
    snapshot: Snapshot, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Finding]:
    """All findings for ``snapshot``, most severe first.

    ``overrides`` maps a rule name to threshold keyword arguments, e.g.
    ``{"data_starvation": {"min_wait_ratio": 0.3}}``; unknown names raise ``ValueError``.
    """
    return list(review(snapshot, overrides).findings)


def review(snapshot: Snapshot, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Review:
    """Every rule's findings for ``snapshot``, checked for contradictions (most severe first),
    and the findings set aside with their reasons."""
    given = settings(overrides)
    found: dict[str, list[Finding]] = {}
    for rule in REGISTRY:
        explained = [f for kind in rule.explained_by for f in found[kind]]
        found[rule.kind] = rule.judge(snapshot, given[rule.kind], explained)
        for f in found[rule.kind]:
            if f.kind not in RULES:
                raise ValueError(f"{rule.kind} gave a finding of unknown kind {f.kind!r}")
    ordered = sorted((f for rule in REGISTRY for f in found[rule.kind]), key=finding_order)
    checked = check(ordered, snapshot, wait_share=given["utilization_imbalance"].min_spread)
    return Review(tuple(sorted(checked.findings, key=finding_order)), checked.set_aside)
