"""utilization_imbalance: busy time spread across the job's ranks (90% against 50%).

Metric: per rank, the share of the step spent computing (``compute_s``: h2d, forward, backward
and optimizer, the waits excluded). Decision: the spread between the busiest and the least busy
rank is at least ``min_spread``.

Attribution: the spread is a symptom. The ranks blamed are the ones the others wait for: the ones
that wait least at the all-reduce, among the ranks where the wait was measured. Never the ranks
that only wait: under DDP they look idle to the probe and fully busy to NVML, and either way they
are not the cause. Where no wait was measured at all, a rank's busy time includes its waiting,
so only a cause finding can attribute the spread; without one the rule stays silent. The cause
is the earlier finding that blames the same ranks (uneven batch, compute straggler, a stall,
data starvation), handed over as ``explained.findings`` in ``explained_by`` order (the most specific
first); its fixes (answering both findings) and its speed-up are carried over.

Two kinds of rank are never blamed. A rank whose step is mostly collective wait
(``max_wait_ratio`` or more) is waiting, not being waited for. And where a peer waits for data
(a ``data_starvation`` finding), a rank no cause names is not what the job waits for: it waits
for the starved peer, and if its busy time looks high, that is waiting the probe booked as work
(a collective it could not time, a framework's gather before forward). The starved ranks are
blamed instead, with starvation as the cause.

GPU busy time: where NVML samples exist, the spread is also computed from each GPU's median
utilisation (the job's GPUs: those its ranks own), so a DataParallel job, one process driving
several GPUs, or a starved DDP rank whose GPU idles while its peers spin in the all-reduce, is
seen too. NVML is only the trigger: it reads a rank waiting in an all-reduce as 100% busy, so the
attribution stays with the rank timings above. When only the GPU spread is large, the ranks that
wait least are blamed only if the waits really differ (by ``min_wait_gap`` of the step);
otherwise only a cause can attribute it, and without one the rule stays silent.

Without a cause, each blamed rank's fix is to find its extra work (``rank_work``), and the
speed-up is the barrier model's with the blamed ranks at their peers' median local time.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from operator import attrgetter, itemgetter

from ..advisor import Barrier
from ..devices import DeviceStats
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..measures import peer_median
from ..rule import Explained, Rule
from ..snapshot import Snapshot
from ..stats import ops_order

KIND = "utilization_imbalance"
# The candidate causes, the most specific first: the order they are handed over in.
CAUSES = (
    "hardware_straggler",
    "dataparallel_gather",
    "batch_split",
    "compute_straggler",
    "stall",
    "data_starvation",
    "cpu_oversubscription",
)


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_spread: busiest minus least busy share of the step (0.25 = 25 points), for ranks'
        compute share and for GPUs' utilisation alike.
    min_samples: NVML samples a GPU needs in the window before its utilisation counts.
    min_wait_gap: when only the GPU spread is large, the waits must differ by this share of
        the step before the least-waiting ranks are blamed.
    max_wait_ratio: a rank whose collective wait is this share of its step or more is
        never blamed (0.5 = half the step).
    """

    min_steps: int = 8
    min_spread: float = 0.25
    min_samples: int = 5
    min_wait_gap: float = 0.05
    max_wait_ratio: float = 0.5


@dataclass(frozen=True)
class Inputs:
    """Per rank (the ranks ready to judge, at their pace): busy share, collective wait as a
    share of the step, local time, the collectives it waited in, and the measured collective
    waits (ranks whose wait was not measured left out); the job's median step and its barrier
    model. Per GPU of the job with a measured utilisation (the snapshot's order): that
    utilisation and its NVML figures (for its name); each rank's GPUs."""

    busy: Mapping[int, float]
    wait_ratio: Mapping[int, float]
    local_s: Mapping[int, float]
    ops: Mapping[int, Mapping[str, float] | None]
    wait_s: Mapping[int, float]
    step_s: float
    barrier: Barrier
    gpu_busy: Mapping[str, float]
    gpus: Mapping[str, DeviceStats]
    gpus_of: Mapping[int, tuple[str, ...]]


@dataclass(frozen=True)
class Spread:
    """The busiest and the least busy of the compared ranks (their rank) or GPUs (their
    label), with their busy share."""

    high: int | str
    high_busy: float
    low: int | str
    low_busy: float
    gpus: bool = False


@dataclass(frozen=True)
class Facts:
    """The spread; the finding that explains it (whose fixes the blamed ranks get), else each
    blamed rank's busy share; the collectives the others wait in; whether the job has peers;
    the ranks whose collective wait was not measured (where the job has peers); whether GPU
    busy time was measured."""

    spread: Spread
    cause: Finding | None
    busy: Mapping[int, float]
    waiting_in: tuple[str, ...] = ()
    peers: bool = True
    unmeasured: tuple[int, ...] = ()
    gpu_busy: bool = False
    # Judged over the run's steps after warm-up from each rank's history (the time account's
    # check, :mod:`auditor.analysis.consistency`), not over the window's medians.
    run: bool = False


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    if not stats:
        return None
    gpus = _job_gpus(snapshot, set(stats), t.min_samples)
    return Inputs(
        busy=dict(zip(stats, map(attrgetter("busy_ratio"), stats.values()), strict=True)),
        wait_ratio=dict(zip(stats, map(attrgetter("wait_ratio"), stats.values()), strict=True)),
        local_s=dict(zip(stats, map(attrgetter("local_s"), stats.values()), strict=True)),
        ops=dict(zip(stats, map(attrgetter("collective_ops"), stats.values()), strict=True)),
        wait_s={
            r: w
            for r, w in zip(
                stats, map(attrgetter("collective_wait_s"), stats.values()), strict=True
            )
            if w is not None
        },
        step_s=statistics.median(map(attrgetter("step_s"), stats.values())),
        barrier=Barrier.of(stats),
        gpu_busy={u: float(d.gpu_util or 0.0) for u, d in gpus.items()},
        gpus=gpus,
        gpus_of=snapshot.gpus_of,
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find a busy-time spread and attribute it: to the cause (``explained.findings``, the
    most specific first) that blames the ranks the others wait for, else to those ranks."""
    causes = explained.findings
    busy = i.busy
    spread = max(busy.values()) - min(busy.values()) if len(busy) >= 2 else 0.0
    gpu_busy = i.gpu_busy
    gpu_spread = max(gpu_busy.values()) - min(gpu_busy.values()) if len(gpu_busy) >= 2 else 0.0
    if spread < t.min_spread and gpu_spread < t.min_spread:
        return []
    waits = i.wait_s
    step = i.step_s
    cause: Finding | None
    waits_differ = len(waits) >= 2 and (
        spread >= t.min_spread or max(waits.values()) - min(waits.values()) >= t.min_wait_gap * step
    )
    starvation = next((f for f in causes if f.kind == "data_starvation"), None)
    starved = set(starvation.ranks) & set(busy) if starvation else set()
    named = {r for f in causes for r in f.ranks}
    if waits_differ:
        lo, hi = min(waits.values()), max(waits.values())
        blamed = sorted(r for r, w in waits.items() if w <= lo + 0.25 * (hi - lo))
        if starved:
            # Peers wait for data: only a rank some cause names can be what the job waits for.
            blamed = [r for r in blamed if r in named] or sorted(starved)
        cause = next((f for f in causes if set(blamed) & set(f.ranks)), None)
    else:
        cause = next((f for f in causes if set(f.ranks) & set(busy)), None)
        if cause is None:
            return []
        blamed = sorted(set(cause.ranks) & set(busy))
    # A rank that mostly waits at the collectives is not the one the others wait for.
    blamed = [r for r in blamed if i.wait_ratio[r] < t.max_wait_ratio]
    if not blamed:
        return []
    if cause is not None:
        speedup = cause.predicted_speedup
    else:
        new_local = {}
        for r in blamed:
            peer = peer_median({q: v for q, v in i.local_s.items() if q not in blamed}, r)
            if peer is not None:
                new_local[r] = peer
        speedup = i.barrier.speedup(new_local) if new_local else None
    if spread >= t.min_spread:
        hi_r = max(busy.items(), key=itemgetter(1))[0]
        lo_r = min(busy.items(), key=itemgetter(1))[0]
        shown = Spread(hi_r, busy[hi_r], lo_r, busy[lo_r])
    else:
        hi_g = i.gpus[max(gpu_busy, key=lambda u: gpu_busy[u])]
        lo_g = i.gpus[min(gpu_busy, key=lambda u: gpu_busy[u])]
        shown = Spread(hi_g.label, gpu_busy[hi_g.uuid], lo_g.label, gpu_busy[lo_g.uuid], gpus=True)
    unmeasured = tuple(sorted(r for r in busy if r not in waits)) if len(busy) >= 2 else ()
    # Where the others wait for the blamed ranks, by operation (where the probe named them).
    facts = Facts(
        spread=shown,
        cause=cause,
        busy={r: busy[r] for r in blamed},
        waiting_in=ops_order(ops for r, ops in i.ops.items() if r not in blamed),
        peers=len(busy) >= 2,
        unmeasured=unmeasured,
        gpu_busy=bool(i.gpus),
    )
    evidence: dict[str, object] = {
        "busy_ratio": {str(r): round(b, 3) for r, b in sorted(busy.items())},
        "spread": round(spread, 3),
        "collective_wait_ms": {str(r): round(w * 1e3, 1) for r, w in sorted(waits.items())},
    }
    ops_ms = _ops_ms(i.ops)
    if ops_ms:
        evidence["collective_ops_ms"] = ops_ms
    if unmeasured:
        evidence["not_measured"] = ["collective_wait"]
    named_gpus: tuple[str, ...] = ()
    if i.gpus:
        # The job's GPUs in node and index order (a stable sort: the snapshot's order kept).
        ordered = sorted(i.gpus.values(), key=lambda d: (d.node, d.index))
        evidence["gpu_busy_ratio"] = {d.uuid: round(gpu_busy[d.uuid], 3) for d in ordered}
        evidence["gpu_spread"] = round(gpu_spread, 3)
        on_blamed = {u for r in blamed for u in i.gpus_of.get(r, ())}
        evidence["gpus"] = [d.ref for d in ordered if d.uuid in on_blamed]
        named_gpus = tuple(d.uuid for d in ordered if d.uuid in on_blamed)
    # The cause carries the weight; the symptom stays one level below it.
    sev = severity_for(speedup)
    if cause is not None and sev == "critical":
        sev = "warning"
    return [
        Finding(
            kind=KIND,
            severity=sev,
            ranks=tuple(blamed),
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
            cause=cause.kind if cause else None,
            fixes=_fixes(blamed, cause, speedup),
            gpus=named_gpus,
        )
    ]


def account_finding(
    *,
    culprits: tuple[int, ...],
    busy: Mapping[int, float],
    wait_share: Mapping[int, float],
    steps: Mapping[int, int],
    speedup: float,
    severity: str,
    cause: Finding | None,
) -> Finding:
    """The spread as the run's time shows it where the window's rules named no cause worth a
    warning (:mod:`auditor.analysis.consistency`): ``busy`` is each rank's share of its steps
    not spent waiting at the collectives, the culprits the ranks the others waited for."""
    hi_r = max(busy.items(), key=itemgetter(1))[0]
    lo_r = min(busy.items(), key=itemgetter(1))[0]
    facts = Facts(
        spread=Spread(hi_r, busy[hi_r], lo_r, busy[lo_r]),
        cause=cause,
        busy={r: busy[r] for r in culprits},
        run=True,
    )
    evidence: dict[str, object] = {
        "source": "run_steps",
        "busy_ratio": {str(r): round(b, 3) for r, b in sorted(busy.items())},
        "collective_wait_share": {str(r): w for r, w in sorted(wait_share.items())},
        "steps": {str(r): n for r, n in sorted(steps.items())},
        "spread": round(busy[hi_r] - busy[lo_r], 3),
    }
    return Finding(
        kind=KIND,
        severity=severity,
        ranks=culprits,
        facts=facts,
        evidence=evidence,
        predicted_speedup=speedup,
        cause=cause.kind if cause else None,
        fixes=_fixes(list(culprits), cause, speedup),
    )


def _fixes(blamed: list[int], cause: Finding | None, speedup: float | None) -> tuple[Fix, ...]:
    """The cause's fixes for the blamed ranks, answering both findings; without a cause, the
    rank's extra work to find."""
    if cause is not None:
        mine = set(blamed)
        return tuple(
            replace(fix, answers=(cause.kind, KIND)) for fix in cause.fixes if fix.rank in mine
        )
    return tuple(Fix("rank_work", r, None, None, speedup, (KIND,)) for r in blamed)


def _ops_ms(ops: Mapping[int, Mapping[str, float] | None]) -> dict[str, dict[str, float]]:
    """Evidence: each rank's median collective wait per step by operation, in ms (ranks that
    reported no operations left out): :func:`~auditor.analysis.stats.collective_ops_ms` of
    the column."""
    return {
        str(r): {op: round(w * 1e3, 1) for op, w in sorted(mine.items())}
        for r, mine in sorted(ops.items())
        if mine
    }


def _job_gpus(snapshot: Snapshot, ranks: set[int], min_samples: int) -> dict[str, DeviceStats]:
    """The GPUs of the judged ranks with a measured utilisation (none: no NVML samples)."""
    if not snapshot.gpu_stats:
        return {}
    gpus_of = snapshot.gpus_of
    mine = {u for r in ranks for u in gpus_of.get(r, ())}
    return {
        u: d
        for u, d in snapshot.gpu_stats.items()
        if u in mine and not d.lost and d.samples >= min_samples and d.gpu_util is not None
    }


RULE = Rule(
    kind=KIND,
    place=110,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=CAUSES,
)
