"""The rule registry: one module per finding kind, each declaring ``RULE`` (:class:`Rule`).

Rules are pure: a snapshot in, findings out; no I/O, no clock, no globals, no other rule's
module. Everything about the set of rules is derived here from the declarations: the kinds, the
order (each rule's ``place``; a rule's explaining rules before it, checked at import), and the
cause graph the engine follows (``explained_by``). Adding a rule is adding its module (with its
phrasing and its tests): it is found by walking this package.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
from collections.abc import Iterable, Mapping
from typing import Any

from ..rule import Rule


def _discover() -> tuple[Rule[Any, Any], ...]:
    rules: list[Rule[Any, Any]] = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        rule = getattr(module, "RULE", None)
        if not isinstance(rule, Rule):
            raise TypeError(f"{module.__name__} declares no RULE")
        if rule.kind != info.name:
            raise TypeError(
                f"{module.__name__} declares {rule.kind!r}: a rule's module is its kind"
            )
        rules.append(rule)
    return ordered(rules)


def ordered(rules: Iterable[Rule[Any, Any]]) -> tuple[Rule[Any, Any], ...]:
    """``rules`` in listing order (by ``place``), whatever order they came in; TypeError where a
    rule would come before a rule that explains it, or two rules share a kind or a place."""
    out = sorted(rules, key=lambda r: (r.place, r.kind))
    for a, b in itertools.pairwise(out):
        if a.kind == b.kind or a.place == b.place:
            raise TypeError(f"{a.kind} and {b.kind} share a kind or a place ({a.place})")
    seen: set[str] = set()
    for rule in out:
        early = set(rule.explained_by) - seen
        if early:
            raise TypeError(f"{rule.kind} is explained by {sorted(early)}, listed after it")
        seen.add(rule.kind)
    return tuple(out)


# Every rule, in listing order: the order the engine runs them and lists their findings.
REGISTRY: tuple[Rule[Any, Any], ...] = _discover()
RULES: Mapping[str, Rule[Any, Any]] = {rule.kind: rule for rule in REGISTRY}
# Stable names (DESIGN.md): used in JSON, metrics, dashboards and alert rules.
KINDS: tuple[str, ...] = tuple(RULES)
