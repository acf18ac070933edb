"""Runs every rule over a snapshot: the thin facade the CLI, the service and the tests call.

Steps of :func:`analyze`:

1. *reduce*: the snapshot reduces its samples once, on first use (per-rank ``stats``, per-GPU
   ``gpu_stats``, GPU ``owners``; :class:`~auditor.analysis.snapshot.Snapshot`).
2. *detect*: each rule judges the snapshot, in :data:`~auditor.analysis.causes.LISTING` order,
   taking from :func:`~auditor.analysis.causes.inputs` what the rules explaining it concluded.
3. *link*: :func:`~auditor.analysis.causes.drop_repeats` keeps one finding per observation.
4. *order*: most severe first, then the largest speed-up; ties in LISTING order.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from . import causes
from .findings import Finding, finding_order
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
        known = [p for p in known if p not in causes.INPUTS]
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
    names = causes.order(RULES)
    found: dict[str, list[Finding]] = {}
    for name in names:
        kwargs = dict(overrides.get(name, {}))
        given = sorted(set(kwargs) & causes.INPUTS)
        if given:
            raise ValueError(f"{name}: {', '.join(given)} is the engine's input, not a threshold")
        try:
            found[name] = RULES[name](snapshot, **causes.inputs(name, found), **kwargs)
        except TypeError as exc:
            if kwargs and "unexpected keyword" in str(exc):
                raise ValueError(f"{name}: unknown threshold in {sorted(kwargs)}") from None
            raise
    found = causes.drop_repeats(found)
    return sorted((f for name in names for f in found[name]), key=finding_order)
