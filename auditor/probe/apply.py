"""Loader levers that ``auditor run --apply`` sets on named ranks: which DataLoader takes them,
and which of them it may take.

The run hands the plan to every rank in the environment (:func:`auditor.cluster.probing.probe_env`):

* ``AUDITOR_PROBE_APPLY``: ``{"1": {"num_workers": 7, "pin_memory": true}}``, the values to set
  per rank;
* ``AUDITOR_PROBE_APPLY_MATCH`` (optional): ``{"1": {"num_workers": 0, "batch_size": 32,
  "dataset": "SyntheticImages"}}``, the training loader's settings as the report being applied
  saw them.

**Which loader is the training loader.** A DataLoader is built before it is iterated, so at
build time nothing says yet whether it will train. The report does: it names the settings of the
loader that trained on the rank (``ranks[i].loader``, the probe's pick of the loader with a
backward between its batches). A loader built with those settings (the levers' current values,
its batch size and its dataset's class; not its sampler, which Lightning and Accelerate replace
when they rebuild a loader) is taken as the training loader, and every loader that matches takes
the levers: an evaluation loader built alike gets them too, which is harmless. Without settings
to match (a lever given on the command line), every loader the rank builds takes the levers.

**Only valid combinations.** ``persistent_workers`` and ``prefetch_factor`` need workers: on a
loader left at ``num_workers=0`` they are skipped, not passed (DataLoader would refuse them). A
loader over an ``IterableDataset`` built with ``num_workers=0`` keeps it: each worker would
iterate the whole stream unless the dataset shards itself by worker, which nothing here can
tell. Levers already at their value are left alone.

Standard library only: this runs inside the training ranks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV_APPLY = "AUDITOR_PROBE_APPLY"
ENV_MATCH = "AUDITOR_PROBE_APPLY_MATCH"

# The DataLoader arguments the probe can set (``auditor.analysis.fixes.LOADER_LEVERS``; a test
# keeps the two equal, the probe imports nothing above it).
LEVERS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
# The loader settings a plan may match on (``auditor.samples.LoaderConfig``'s names).
MATCH_KEYS = (*LEVERS, "batch_size", "dataset")

# Why a planned lever was not set on a loader (codes; ``auditor.report.applied`` words them).
ITERABLE = "iterable_dataset"  # num_workers of an IterableDataset loader built without workers
NEEDS_WORKERS = "needs_workers"  # persistent_workers / prefetch_factor on a loader without workers
ALREADY = "already"  # the loader already had the value
REFUSED = "refused"  # DataLoader refused the new arguments: the loader was built as the script said
NO_LOADER = "no_loader"  # no DataLoader on the rank matched the report's training loader


@dataclass(frozen=True)
class RankPlan:
    """What to set on one rank's training loader, and how to recognise that loader."""

    levers: Mapping[str, Any]
    match: Mapping[str, Any] = field(default_factory=dict)

    def matches(self, config: Mapping[str, Any]) -> bool:
        """Whether a loader built with ``config`` (its settings by ``LoaderConfig`` name) is the
        training loader the plan was made for."""
        return all(config.get(k) == v for k, v in self.match.items())


def read_plan(env: Mapping[str, str]) -> dict[int, RankPlan]:
    """The plan in the environment, per rank; empty when there is none. Raises ``ValueError`` on
    a malformed one (the run writes it, so that is a bug, never the user's input)."""
    raw = env.get(ENV_APPLY)
    if not raw:
        return {}
    levers = _per_rank(raw, ENV_APPLY)
    match = _per_rank(env.get(ENV_MATCH) or "{}", ENV_MATCH)
    out = {}
    for rank, values in levers.items():
        unknown = sorted(set(values) - set(LEVERS))
        if unknown:
            raise ValueError(f"{ENV_APPLY}: not a loader lever: {', '.join(unknown)}")
        wanted = match.get(rank, {})
        out[rank] = RankPlan(
            levers=dict(values), match={k: v for k, v in wanted.items() if k in MATCH_KEYS}
        )
    return out


def _per_rank(raw: str, name: str) -> dict[int, dict[str, Any]]:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{name}: expected a JSON object of ranks")
    out = {}
    for key, values in data.items():
        if not isinstance(values, dict):
            raise ValueError(f"{name}: rank {key}: expected a JSON object of levers")
        out[int(key)] = values
    return out


def changes(
    plan: RankPlan, config: Mapping[str, Any], *, iterable: bool
) -> tuple[dict[str, tuple[Any, Any]], dict[str, str]]:
    """The levers to move on a loader built with ``config`` (``{lever: (from, to)}``), and those
    the plan names that it keeps (``{lever: reason}``), valid combinations only (module doc).

    Lowering ``num_workers`` to 0 also turns ``persistent_workers`` off and ``prefetch_factor`` to
    None where they were set (DataLoader refuses them without workers): those are moves too.
    """
    moves: dict[str, tuple[Any, Any]] = {}
    kept: dict[str, str] = {}
    workers = config.get("num_workers") or 0
    if "num_workers" in plan.levers:
        want = plan.levers["num_workers"]
        if want == workers:
            kept["num_workers"] = ALREADY
        elif iterable and workers == 0:
            kept["num_workers"] = ITERABLE
        else:
            moves["num_workers"] = (workers, want)
            workers = want
    for lever in ("persistent_workers", "prefetch_factor"):
        now = config.get(lever)
        if lever in plan.levers:
            want = plan.levers[lever]
            if workers == 0:
                kept[lever] = NEEDS_WORKERS
            elif want == now:
                kept[lever] = ALREADY
            else:
                moves[lever] = (now, want)
                continue
        if workers == 0 and now not in (None, False):  # workers gone: the lever must go too
            moves[lever] = (now, False if lever == "persistent_workers" else None)
    if "pin_memory" in plan.levers:
        want, now = plan.levers["pin_memory"], config.get("pin_memory")
        if want == now:
            kept["pin_memory"] = ALREADY
        else:
            moves["pin_memory"] = (now, want)
    return moves, kept
