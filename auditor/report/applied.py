"""Advice tried without editing the script: ``auditor run --apply``'s plan and what came of it.

* :func:`plan_from_report`: the loader levers a report's typed fixes (each finding's
  ``actions``) propose per rank, how to recognise each rank's training loader (its settings as
  the report saw them), and the fixes that need a code or hardware change (named, not applied).
* :func:`with_plan`: the report of a run made with a plan, holding it: the job's ``apply`` entry
  (sources, levers per rank, fixes not applied) and, on each rank, the planned value beside each
  lever its probe kept, and the planned levers its probe neither moved nor kept (no DataLoader
  matched).
* The words: what was applied and what was not, for the run's lines and the verdict.

Per rank the JSON report holds ``applied`` (``[{"lever", "from", "to"}]``, what the probe moved)
and ``not_applied`` (``[{"lever", "value", "reason"}]``); the reason codes are
:mod:`auditor.probe.apply`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from auditor.analysis.fixes import LOADER_LEVERS, Fix
from auditor.configs import ApplyPlan
from auditor.probe.apply import ALREADY, ITERABLE, NEEDS_WORKERS, NO_LOADER, REFUSED
from auditor.report.model import RankEntry, Report
from auditor.wording import ranks_text

# The loader settings a plan matches the training loader on (``auditor.probe.apply.MATCH_KEYS``).
MATCH_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")

REASONS: Mapping[str, str] = {
    ITERABLE: "its IterableDataset loader was built without workers (each worker would read "
    "the whole stream)",
    NEEDS_WORKERS: "it needs num_workers > 0",
    ALREADY: "already set",
    REFUSED: "DataLoader refused it; the loader was built as the script says",
    NO_LOADER: "no DataLoader on the rank matched the report's training loader",
}


def check_value(lever: str, value: Any) -> Any:
    """``value`` if it fits ``lever`` (an integer >= 0 workers, an integer >= 1 prefetch factor,
    a boolean flag), else ``ValueError`` saying what was expected."""
    if lever not in LOADER_LEVERS:
        raise ValueError(f"{lever} is not a loader lever")
    if lever in ("pin_memory", "persistent_workers"):
        if not isinstance(value, bool):
            raise ValueError(f"{lever} takes true or false, got {value!r}")
        return value
    least = 0 if lever == "num_workers" else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{lever} takes an integer >= {least}, got {value!r}")
    return value


def parse_value(lever: str, text: str) -> Any:
    """A lever's value as typed on the command line (``7``, ``true``)."""
    low = text.strip().lower()
    if lever in ("pin_memory", "persistent_workers"):
        flags = {"true": True, "1": True, "yes": True, "on": True}
        flags |= {"false": False, "0": False, "no": False, "off": False}
        if low not in flags:
            raise ValueError(f"{lever} takes true or false, got {text!r}")
        return flags[low]
    try:
        value = int(low)
    except ValueError:
        raise ValueError(f"{lever} takes an integer, got {text!r}") from None
    return check_value(lever, value)


def plan_from_report(
    report: Report,
) -> tuple[dict[int, dict[str, Any]], dict[int, dict[str, Any]], list[Fix]]:
    """``(levers, match, not_applied)`` from a report's fixes: the loader levers per rank (most
    severe finding first where two propose the same lever), each rank's training loader settings
    as the report saw them (or else the fixes' current values), and the other fixes. A proposed
    value of the wrong type raises ``ValueError``."""
    levers: dict[int, dict[str, Any]] = {}
    currents: dict[int, dict[str, Any]] = {}
    other: list[Fix] = []
    for finding in report.sorted_findings:
        for fix in finding.actions:
            if not fix.applicable or fix.rank is None or fix.proposed is None:
                other.append(fix)
                continue
            try:
                value = check_value(fix.lever, fix.proposed)
            except ValueError as exc:
                raise ValueError(f"rank {fix.rank}: {exc}") from None
            levers.setdefault(fix.rank, {}).setdefault(fix.lever, value)
            if fix.current is not None:
                currents.setdefault(fix.rank, {}).setdefault(fix.lever, fix.current)
    ranks = {r.rank: r for r in report.ranks}
    match = {}
    for rank in levers:
        entry = ranks.get(rank)
        seen = entry.loader if entry is not None else None
        if seen:
            match[rank] = {k: seen[k] for k in MATCH_KEYS if k in seen}
            if seen.get("dataset"):
                match[rank]["dataset"] = seen["dataset"]
        elif rank in currents:
            match[rank] = currents[rank]
    return levers, match, other


# --------------------------------------------------------------------------------------------
# the report of a run made with a plan


def plan_entry(plan: ApplyPlan) -> dict[str, Any]:
    """The job's ``apply`` entry: where the plan came from, the levers per rank, the fixes it
    left to the user."""
    return {
        "sources": list(plan.sources),
        "levers": {str(r): dict(v) for r, v in sorted(plan.levers.items())},
        "not_applied": [
            {"rank": rank, "lever": lever, "current": current, "proposed": proposed}
            for rank, lever, current, proposed in plan.not_applied
        ],
    }


def with_plan(report: Report, plan: ApplyPlan | None) -> Report:
    """``report`` holding ``plan`` (module doc); the report itself without one."""
    if plan is None:
        return report
    ranks = []
    for r in report.ranks:
        wanted = plan.levers.get(r.rank) or {}
        said = {a.get("lever") for a in r.applied} | {n.get("lever") for n in r.not_applied}
        kept = tuple(
            {"lever": k.get("lever"), "value": wanted.get(str(k.get("lever"))), **k}
            for k in r.not_applied
        )
        missing = tuple(
            {"lever": lever, "value": value, "reason": NO_LOADER}
            for lever, value in wanted.items()
            if lever not in said
        )
        if kept or missing:
            r = replace(r, not_applied=(*kept, *missing))
        ranks.append(r)
    return replace(report, job=replace(report.job, apply=plan_entry(plan)), ranks=tuple(ranks))


# --------------------------------------------------------------------------------------------
# words


def setting(value: Any) -> str:
    """A DataLoader argument as the script would write it: ``7``, ``True``, ``None``."""
    return repr(value) if isinstance(value, str) else str(value)


def moves_text(moves: Sequence[Mapping[str, Any]]) -> str:
    """``num_workers 0 -> 7, pin_memory False -> True``."""
    return ", ".join(
        f"{m.get('lever')} {setting(m.get('from'))} -> {setting(m.get('to'))}" for m in moves
    )


def applied_line(rank: int, moves: Sequence[Mapping[str, Any]]) -> str:
    """``applied on rank 1: num_workers 0 -> 7, pin_memory False -> True``."""
    return f"applied on rank {rank}: {moves_text(moves)}"


def kept_text(kept: Sequence[Mapping[str, Any]], planned: Mapping[str, Any]) -> str:
    """``prefetch_factor 4 (it needs num_workers > 0)``, one per kept lever."""
    parts = []
    for k in kept:
        lever = str(k.get("lever"))
        value = k.get("value", planned.get(lever))
        reason = REASONS.get(str(k.get("reason")), str(k.get("reason")))
        parts.append(f"{lever} {setting(value)} ({reason})")
    return "; ".join(parts)


def fix_text(rank: int | None, lever: str, current: Any, proposed: Any) -> str:
    """A fix left to the user: ``rank 1 batch_size 32 -> 64``, ``rank 0 rank_work``."""
    who = f"rank {rank} " if rank is not None else ""
    if proposed is None:
        return f"{who}{lever}"
    if current is None:
        return f"{who}{lever} -> {setting(proposed)}"
    return f"{who}{lever} {setting(current)} -> {setting(proposed)}"


def plan_lines(plan: ApplyPlan) -> list[str]:
    """What ``auditor run`` says before the job starts: the levers it will set, per rank, and the
    fixes it leaves to the user, by name."""
    out = []
    if plan.levers:
        for rank, levers in sorted(plan.levers.items()):
            values = ", ".join(f"{k}={setting(v)}" for k, v in levers.items())
            out.append(f"--apply: rank {rank}'s training DataLoader gets {values}")
    else:
        out.append("--apply: nothing to apply (no loader lever among the fixes)")
    code = _code_fixes(plan.not_applied)
    if code:
        out.append(f"--apply: not applied (a change to the script or machine): {code}")
    return out


def _code_fixes(fixes: Sequence[tuple[int | None, str, Any, Any]]) -> str:
    seen: dict[str, None] = {}
    for rank, lever, current, proposed in fixes:
        seen.setdefault(fix_text(rank, lever, current, proposed), None)
    return "; ".join(seen)


def verdict_lines(report: Report) -> list[str]:
    """The verdict's lines on a run made with ``--apply``: per rank what was applied and what was
    not (and why), then the fixes left to the user. Empty for any other run."""
    out = []
    plan = report.job.apply
    for r in report.sorted_ranks:
        if r.applied:
            out.append(f"Applied on rank {r.rank}: {moves_text(r.applied)}.")
        if r.not_applied:
            planned = _planned(plan, r)
            out.append(f"Not applied on rank {r.rank}: {kept_text(r.not_applied, planned)}.")
    if plan is not None:
        fixes = [
            (f.get("rank"), str(f.get("lever")), f.get("current"), f.get("proposed"))
            for f in plan.get("not_applied") or ()
            if isinstance(f, Mapping)
        ]
        code = _code_fixes(fixes)
        if code:
            out.append(f"Not applied (a change to the script or machine): {code}.")
        if not plan.get("levers"):
            out.append("Nothing was applied: no loader lever among the fixes.")
        elif not any(r.applied for r in report.ranks):
            named = [int(k) for k in plan.get("levers") or {} if str(k).isdigit()]
            out.append(f"Nothing was applied on {ranks_text(named)}.")
    return out


def _planned(plan: Mapping[str, Any] | None, rank: RankEntry) -> Mapping[str, Any]:
    levers = (plan or {}).get("levers") or {}
    mine = levers.get(str(rank.rank)) if isinstance(levers, Mapping) else None
    return mine if isinstance(mine, Mapping) else {}
