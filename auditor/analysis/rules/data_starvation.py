"""data_starvation: a rank that spends a large share of its step waiting for its next batch.

Metric: per rank, the median time blocked in the DataLoader's ``__next__`` as a share of the step.
Decision: starved when the share is at least ``min_wait_ratio`` and the wait is at least
``min_wait_s`` (so microsecond waits on very fast steps do not count).

The fix sizes ``num_workers`` from what was measured:

* per-batch load time ``L``: with ``num_workers == 0`` the main process loads, so ``L`` is the
  data wait itself; with ``a`` workers that cannot keep up, each worker delivers one batch per
  ``L`` seconds and the rank consumes one per step, so ``L ~= a * step``;
* the target pace ``T``: the rank's own work per step without the data wait, or the job's
  slowest rank's, whichever is longer (faster than the job's pace buys nothing);
* ``b = ceil(margin * L / T)`` workers would keep up, capped by the cores the rank's workers may
  use (idle cores plus what its workers use now) divided by the CPU one worker was measured to
  use (1 core where unmeasured). Workers below ``io_bound_cpu`` cores each, on a host with a core
  to spare, wait on storage rather than on the CPU, so their count is not capped by cores. (On a
  saturated host low CPU per worker proves nothing: many CPU-bound workers share few cores.)
  When the host has no room, raising workers would only oversubscribe it: the fix says so, and
  the speed-up is the upper bound of removing the wait (named as such in the evidence).

Assumptions: workers run independently (no shared lock in the dataset), and loading time per
batch does not depend on the number of workers (true for decoding and for a storage backend
that is not yet saturated).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ..advisor import fmt_ms, fmt_pct, predicted_speedup
from ..findings import Finding, severity_for
from ..snapshot import Snapshot
from ..stats import RankStats
from .common import ranks_text, ready, with_expectation


def detect(
    snapshot: Snapshot,
    *,
    prior: Sequence[Finding] = (),
    min_steps: int = 8,
    min_wait_ratio: float = 0.15,
    min_wait_s: float = 0.002,
    margin: float = 1.25,
    max_workers: int = 32,
    io_bound_cpu: float = 0.15,
) -> list[Finding]:
    """Find starved ranks.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_wait_ratio: data wait as a share of the step that counts as starved (0.15 = 15%).
        min_wait_s: smallest median wait per step that counts, in seconds.
        margin: head-room on the worker count so a burst of slow batches does not stall.
        max_workers: upper bound on a recommended ``num_workers``.
        io_bound_cpu: CPU (cores) per worker below which workers count as I/O-bound.
    """
    stats = ready(snapshot.stats, min_steps)
    starved = {
        r: s
        for r, s in stats.items()
        if s.data_wait_ratio >= min_wait_ratio and s.data_wait_s >= min_wait_s
    }
    if not starved:
        return []
    # The pace the job would keep without data stalls: the slowest rank's own work.
    job_pace = max(_work_s(s) for s in stats.values())
    oversubscribed = {r for f in prior if f.kind == "cpu_oversubscription" for r in f.ranks}
    fed = [s.data_wait_s for r, s in stats.items() if r not in starved]
    residual = statistics.median(fed) if fed else 0.0

    new_local: dict[int, float] = {}
    fixes: dict[int, str] = {}
    evidence: dict[str, object] = {"job_pace_ms": round(job_pace * 1e3, 1), "per_rank": {}}
    per_rank: dict[str, object] = {}
    hosts = snapshot.hosts()
    for r, s in sorted(starved.items()):
        free = _free_cores(
            snapshot, s, starved_on_host=sum(1 for q in hosts.get(s.host, []) if q in starved)
        )
        idle = _idle_cores(snapshot, s.host)
        plan = _worker_plan(
            s,
            job_pace,
            free,
            margin=margin,
            max_workers=max_workers,
            io_bound=s.worker_cpu_each is not None
            and s.worker_cpu_each < io_bound_cpu
            and (idle is None or idle >= 1.0),
        )
        current = s.loader.num_workers if s.loader else None
        # Even a fed rank waits a little per batch (hand-off from the workers): the peers'
        # median wait, where there are unstarved peers, is the floor of what a fix can reach.
        new_wait = max(plan.expected_wait_s, min(residual, s.data_wait_s))
        new_local[r] = max(0.0, s.local_s - s.data_wait_s + new_wait)
        fixes[r] = _fix_text(s, plan, current, saturated=r in oversubscribed)
        per_rank[str(r)] = {
            "data_wait_ms": round(s.data_wait_s * 1e3, 1),
            "step_ms": round(s.step_s * 1e3, 1),
            "data_wait_ratio": round(s.data_wait_ratio, 3),
            "load_per_batch_ms": round(plan.load_s * 1e3, 1),
            "num_workers": current,
            "recommended_workers": plan.workers,
            "worker_cpu_each": None if s.worker_cpu_each is None else round(s.worker_cpu_each, 2),
            "free_cores": None if free is None else round(free, 2),
            "expected_wait_ms": round(new_wait * 1e3, 1),
            "speedup_basis": "upper bound: data wait removed"
            if plan.workers is None
            else "workers",
        }
    evidence["per_rank"] = per_rank
    speedup = predicted_speedup(stats, new_local)
    worst = max(starved.values(), key=lambda s: s.data_wait_ratio)
    where = "" if len(starved) == 1 else f" on rank {worst.rank}"
    summary = (
        f"{ranks_text(starved)} wait{'s' if len(starved) == 1 else ''} for data: "
        f"{fmt_ms(worst.data_wait_s)} of a {fmt_ms(worst.step_s)} step "
        f"({fmt_pct(worst.data_wait_ratio)}){where}"
    )
    return [
        Finding(
            kind="data_starvation",
            severity=severity_for(speedup),
            ranks=tuple(sorted(starved)),
            summary=summary,
            evidence=evidence,
            fixes={r: with_expectation(f, speedup) for r, f in fixes.items()},
            predicted_speedup=speedup,
        )
    ]


class _Plan:
    """How many workers, the measured load per batch and the wait they should leave."""

    def __init__(
        self,
        workers: int | None,
        load_s: float,
        expected_wait_s: float,
        capped: bool,
        measured: bool,
    ) -> None:
        self.workers = workers
        self.load_s = load_s
        self.expected_wait_s = expected_wait_s
        self.capped = capped
        self.measured = measured


def _work_s(s: RankStats) -> float:
    """A rank's own work per step apart from waiting for data or for its peers."""
    return max(1e-6, s.local_s - s.data_wait_s)


def _idle_cores(snapshot: Snapshot, host: str) -> float | None:
    cpu = snapshot.host_cpu(host)
    return None if cpu is None else max(0.0, cpu[0] - cpu[1])


def _free_cores(snapshot: Snapshot, s: RankStats, *, starved_on_host: int) -> float | None:
    """Cores this rank's workers may use in all: idle cores shared among the host's starved
    ranks, plus what its workers use now. None where the host was never sampled."""
    idle = _idle_cores(snapshot, s.host)
    if idle is None:
        return None
    if s.worker_cpu is not None:
        own = s.worker_cpu
    else:  # unmeasured: assume each current worker keeps a core busy
        own = float(s.loader.num_workers if s.loader else 0)
    return idle / max(1, starved_on_host) + own


def _worker_plan(
    s: RankStats,
    job_pace: float,
    free_cores: float | None,
    *,
    margin: float,
    max_workers: int,
    io_bound: bool,
) -> _Plan:
    current = s.loader.num_workers if s.loader else 0
    load_s = s.data_wait_s if current == 0 else current * s.step_s
    target = max(_work_s(s), job_pace)
    needed = min(max_workers, max(current + 1, math.ceil(margin * load_s / target)))
    each = s.worker_cpu_each
    if io_bound:
        cap = max_workers  # waiting on storage: more workers cost memory, not CPU
    else:
        room = 1.0 if free_cores is None else free_cores
        cap = int(room / (each if each is not None else 1.0) + 1e-9)
    workers = min(needed, cap)
    if workers <= current:
        return _Plan(None, load_s, 0.0, capped=True, measured=free_cores is not None)
    expected = max(0.0, load_s / workers - _work_s(s))
    return _Plan(
        workers, load_s, min(expected, s.data_wait_s), workers < needed, free_cores is not None
    )


def _fix_text(s: RankStats, plan: _Plan, current: int | None, *, saturated: bool) -> str:
    parts: list[str] = []
    cfg = s.loader
    if plan.workers is None or saturated:
        parts.append(
            "no free CPU on this host for more DataLoader workers: make loading cheaper "
            "(cache decoded samples, lighter transforms, decode on the device)"
        )
    else:
        change = f"num_workers {current if current is not None else '?'} -> {plan.workers}"
        if plan.capped and plan.measured:
            change += " (as many as the free cores allow)"
        parts.append(change)
    if cfg is not None:
        if not cfg.pin_memory and s.device.startswith("cuda"):
            parts.append("pin_memory=True")
        workers_after = plan.workers or cfg.num_workers
        if workers_after > 0 and not cfg.persistent_workers:
            parts.append("persistent_workers=True")
    return ", ".join(parts)
