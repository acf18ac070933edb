"""``auditor run --apply``: its value read into an :class:`~auditor.configs.ApplyPlan`, checked
before anything starts.

The value is a comma-separated list (the option may be given several times, as ``--set``):

* a JSON report (``REPORT.json``): the loader levers of its findings' typed fixes, per rank;
* ``rankN.lever=value``: one loader lever (``num_workers``, ``pin_memory``,
  ``persistent_workers``, ``prefetch_factor``) on rank N.

Later items win where two set the same lever on one rank. A report that is not one, an unknown
lever or one that needs a code change, a rank the command does not start, or a value of the wrong
type is a :class:`~auditor.configs.ConfigError`: one line, exit 2, the job not started.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from auditor.analysis.fixes import LEVERS, LOADER_LEVERS
from auditor.configs import ApplyPlan, ConfigError
from auditor.report.applied import parse_value, plan_from_report
from auditor.report.json_report import read_report
from auditor.torchrun import expected_ranks

_ITEM = re.compile(r"^rank(\d+)\.([A-Za-z_]\w*)=(.*)$")
_LOADER = ", ".join(sorted(LOADER_LEVERS))


def parse_apply(
    text: str | None, command: Sequence[str], *, source: str = "--apply"
) -> ApplyPlan | None:
    """The plan ``text`` names (None when empty). ``command``: the job's launch, whose rank count
    (torchrun's ``--nproc_per_node`` x ``--nnodes``, where it says) bounds the ranks."""
    if not text or not text.strip():
        return None
    world = expected_ranks(command)
    levers: dict[int, dict[str, Any]] = {}
    match: dict[int, dict[str, Any]] = {}
    not_applied: list[tuple[int | None, str, Any, Any]] = []
    sources: list[str] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        sources.append(item)
        if "=" in item:
            rank, lever, value = _lever_item(item, source)
            _check_rank(rank, world, source, item)
            levers.setdefault(rank, {})[lever] = value
            continue
        try:
            report = read_report(item)
            wanted, seen, other = plan_from_report(report)
        except FileNotFoundError:
            raise ConfigError(f"{source}: no such report: {item}") from None
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read {item}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ConfigError(f"{source}: {item}: {exc}") from None
        for rank in wanted:
            _check_rank(rank, world, source, f"{item} (a fix on rank {rank})")
        for rank, values in wanted.items():
            levers.setdefault(rank, {}).update(values)
        match.update(seen)
        not_applied.extend((f.rank, f.lever, f.current, f.proposed) for f in other)
    return ApplyPlan(
        levers=levers,
        match={r: m for r, m in match.items() if r in levers},
        not_applied=tuple(dict.fromkeys(not_applied)),
        sources=tuple(sources),
    )


def _lever_item(item: str, source: str) -> tuple[int, str, Any]:
    m = _ITEM.match(item)
    if m is None:
        raise ConfigError(
            f"{source}: expected REPORT.json or rankN.lever=value (e.g. rank1.num_workers=7), "
            f"got {item!r}"
        )
    rank, lever, raw = int(m.group(1)), m.group(2), m.group(3)
    if lever not in LEVERS:
        raise ConfigError(f"{source}: unknown lever {lever!r} (loader levers: {_LOADER})")
    if lever not in LOADER_LEVERS:
        raise ConfigError(
            f"{source}: {lever} needs a change to the script or machine; --apply sets loader "
            f"levers only ({_LOADER})"
        )
    try:
        return rank, lever, parse_value(lever, raw)
    except ValueError as exc:
        raise ConfigError(f"{source}: {item}: {exc}") from None


def _check_rank(rank: int, world: int | None, source: str, what: str) -> None:
    if world is not None and rank >= world:
        raise ConfigError(
            f"{source}: {what}: rank {rank} is out of range (the command starts {world} "
            f"rank{'' if world == 1 else 's'}: 0 to {world - 1})"
        )
