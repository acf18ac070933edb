"""Reading a rendered Grafana dashboard back: its panels, the PromQL of every target, the series
selectors of its variables, and each query with its template variables substituted as Grafana's
Prometheus data source would, so the queries can be run against a real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from auditor.ops.grafana import Json


def panels(dashboard: Mapping[str, Any]) -> list[Json]:
    """Every panel of a rendered dashboard, rows and the panels of collapsed rows included."""
    out: list[Json] = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every target of a rendered dashboard, in panel order."""
    return [
        (panel.get("title", ""), target["expr"])
        for panel in panels(dashboard)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.*?)\s*,\s*(?P<label>\w+)\s*\)\s*$")


def variable_selectors(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(variable name, series selector) of every ``label_values(selector, label)`` variable: the
    selectors Grafana sends to Prometheus' label-values API as ``match[]``."""
    out: list[tuple[str, str]] = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        match = _LABEL_VALUES.match(text)
        if match is None:
            raise ValueError(f"variable {var.get('name')!r}: not a label_values query: {text!r}")
        out.append((var["name"], match.group("selector")))
    return out


# Grafana's built-in interval variables, with the values a 1 h range and a 15 s scrape give.
BUILTIN_VALUES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
ALL_VALUE = ".*"
_ALL_MARKERS = ("All", "$__all")
_VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::(?P<fmt>\w+))?\}|\[\[(?P<bracket>\w+)(?::(?P<bfmt>\w+))?\]\]"
    r"|\$(?P<plain>\w+)"
)
# What Grafana's Prometheus data source escapes in a multi-value or All variable's values: the
# value lands inside a PromQL string used as a regex, hence the doubled backslash.
_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|\\]")


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value)


def _format(value: str | Sequence[str], fmt: str | None) -> str:
    if isinstance(value, str):
        if value in _ALL_MARKERS:
            return ALL_VALUE
        return value if fmt == "raw" else _regex_escape(value)
    values = list(value)
    if not values:
        raise ValueError("a variable needs at least one value")
    if any(v in _ALL_MARKERS for v in values):
        return ALL_VALUE
    if fmt == "raw":
        return ",".join(values)
    escaped = [_regex_escape(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, values: Mapping[str, str | Sequence[str]]) -> str:
    """``expr`` with its variables replaced as Grafana's Prometheus data source does it.

    ``values`` maps a variable name (``job``) to one value, a list of values (``(a|b)``), or
    ``All``/``$__all`` (``.*``, the dashboards' All value). Values are regex-escaped, as Grafana
    escapes multi-value variables, since every template variable here sits in a ``=~`` matcher.
    ``$__rate_interval``, ``$__interval`` and ``$__range`` default to :data:`BUILTIN_VALUES`
    unless given. A variable with no value raises ValueError: a query that cannot be run.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracket") or match.group("plain")
        fmt = match.group("fmt") or match.group("bfmt")
        if name in values:
            if name in BUILTIN_VALUES:
                return str(values[name])
            return _format(values[name], fmt)
        if name in BUILTIN_VALUES:
            return BUILTIN_VALUES[name]
        raise ValueError(f"no value for variable ${name} in {expr!r}")

    return _VARIABLE.sub(replace, expr)


def variable_names(expr: str) -> set[str]:
    """The variables ``expr`` refers to (``$job``, ``${node}``, ``[[rank]]``, ``$__interval``)."""
    return {
        m.group("braced") or m.group("bracket") or m.group("plain")
        for m in _VARIABLE.finditer(expr)
    }
