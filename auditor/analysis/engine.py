"""Runs every rule over a snapshot: the thin facade the CLI, the service and the tests call."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from .findings import Finding
from .rules import RULES
from .snapshot import Snapshot


def check_overrides(overrides: Mapping[str, Mapping[str, Any]]) -> None:
    """ValueError naming the first unknown rule or threshold, so a typo in ``--set`` is refused
    before a job starts or a service runs, not at the first verdict."""
    unknown = set(overrides) - set(RULES)
    if unknown:
        raise ValueError(
            f"unknown rule(s): {', '.join(sorted(unknown))}; rules: {', '.join(RULES)}"
        )
    for name, kwargs in overrides.items():
        params = inspect.signature(RULES[name]).parameters
        known = [p for p, v in params.items() if v.kind is inspect.Parameter.KEYWORD_ONLY]
        known = [p for p in known if p != "prior"]
        bad = sorted(set(kwargs) - set(known))
        if bad:
            raise ValueError(
                f"{name}: unknown threshold(s) {', '.join(bad)}; thresholds: {', '.join(known)}"
            )


def analyze(
    snapshot: Snapshot, overrides: Mapping[str, Mapping[str, Any]] | None = None
) -> list[Finding]:
    """All findings for ``snapshot``, most severe first.

    ``overrides`` maps a rule name to threshold keyword arguments, e.g.
    ``{"data_starvation": {"min_wait_ratio": 0.3}}``; unknown names raise ``ValueError``.
    """
    overrides = overrides or {}
    unknown = set(overrides) - set(RULES)
    if unknown:
        raise ValueError(f"unknown rule(s): {', '.join(sorted(unknown))}")
    findings: list[Finding] = []
    for name, rule in RULES.items():
        kwargs = dict(overrides.get(name, {}))
        try:
            found = rule(snapshot, prior=tuple(findings), **kwargs)
        except TypeError as exc:
            if kwargs and "unexpected keyword" in str(exc):
                raise ValueError(f"{name}: unknown threshold in {sorted(kwargs)}") from None
            raise
        findings.extend(found)
    return sorted(findings, key=lambda f: (-f.severity_level, -(f.predicted_speedup or 1.0)))
