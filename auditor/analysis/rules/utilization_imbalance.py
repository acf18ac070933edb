"""utilization_imbalance: busy time spread across the job's ranks (90% against 50%).

Metric: per rank, the share of the step spent computing (``compute_s``: h2d, forward, backward
and optimizer, the waits excluded). Decision: the spread between the busiest and the least busy
rank is at least ``min_spread``.

Attribution: the spread is a symptom. The ranks blamed are the ones the others wait for: the ones
that wait least at the all-reduce, among the ranks where the wait was measured. Never the ranks
that only wait: under DDP they look idle to the probe and fully busy to NVML, and either way they
are not the cause. Where no wait was measured at all, a rank's busy time includes its waiting,
so only a cause finding can attribute the spread; without one the rule stays silent. The cause
is the earlier finding that blames the same ranks (uneven batch, compute straggler, data
starvation); its fixes and speed-up are carried over.

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
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter

from auditor.wording import ranks_text

from ..advisor import predicted_speedup
from ..devices import DeviceStats
from ..findings import Finding, severity_for
from ..measures import peer_median
from ..snapshot import Snapshot
from ..stats import collective_ops_ms, collective_ops_order


@dataclass(frozen=True)
class Spread:
    """The busiest and the least busy of the compared ranks (``rank 2``) or GPUs (their label),
    with their busy share."""

    high: str
    high_busy: float
    low: str
    low_busy: float
    gpus: bool = False


@dataclass(frozen=True)
class Facts:
    """The spread; the finding that explains it (whose fixes the blamed ranks get), else each
    blamed rank's busy share; the collectives the others wait in; whether the job has peers."""

    spread: Spread
    cause: Finding | None
    busy: Mapping[int, float]
    waiting_in: tuple[str, ...] = ()
    peers: bool = True


def detect(
    snapshot: Snapshot,
    *,
    causes: Sequence[Finding] = (),
    min_steps: int = 8,
    min_spread: float = 0.25,
    min_samples: int = 5,
    min_wait_gap: float = 0.05,
    max_wait_ratio: float = 0.5,
) -> list[Finding]:
    """Find a busy-time spread and attribute it.

    Args:
        causes: findings that may explain the spread, the most specific first (the engine
            passes them: :func:`auditor.analysis.causes.candidate_causes`).
        min_steps: steps a rank needs in the window before it is judged.
        min_spread: busiest minus least busy share of the step (0.25 = 25 points), for ranks'
            compute share and for GPUs' utilisation alike.
        min_samples: NVML samples a GPU needs in the window before its utilisation counts.
        min_wait_gap: when only the GPU spread is large, the waits must differ by this share of
            the step before the least-waiting ranks are blamed.
        max_wait_ratio: a rank whose collective wait is this share of its step or more is
            never blamed (0.5 = half the step).
    """
    stats = snapshot.ready(min_steps)
    if not stats:
        return []
    busy = dict(zip(stats, map(attrgetter("busy_ratio"), stats.values()), strict=True))
    spread = max(busy.values()) - min(busy.values()) if len(busy) >= 2 else 0.0
    gpus = _job_gpus(snapshot, set(stats), min_samples)
    gpu_busy = {u: float(d.gpu_util or 0.0) for u, d in gpus.items()}
    gpu_spread = max(gpu_busy.values()) - min(gpu_busy.values()) if len(gpu_busy) >= 2 else 0.0
    if spread < min_spread and gpu_spread < min_spread:
        return []
    waits = {
        r: w
        for r, w in zip(stats, map(attrgetter("collective_wait_s"), stats.values()), strict=True)
        if w is not None
    }
    step = statistics.median(map(attrgetter("step_s"), stats.values()))
    cause: Finding | None
    waits_differ = len(waits) >= 2 and (
        spread >= min_spread or max(waits.values()) - min(waits.values()) >= min_wait_gap * step
    )
    starvation = next((f for f in causes if f.kind == "data_starvation"), None)
    starved = set(starvation.ranks) & set(stats) if starvation else set()
    named = {r for f in causes for r in f.ranks}
    if waits_differ:
        lo, hi = min(waits.values()), max(waits.values())
        blamed = sorted(r for r, w in waits.items() if w <= lo + 0.25 * (hi - lo))
        if starved:
            # Peers wait for data: only a rank some cause names can be what the job waits for.
            blamed = [r for r in blamed if r in named] or sorted(starved)
        cause = next((f for f in causes if set(blamed) & set(f.ranks)), None)
    else:
        cause = next((f for f in causes if set(f.ranks) & set(stats)), None)
        if cause is None:
            return []
        blamed = sorted(set(cause.ranks) & set(stats))
    # A rank that mostly waits at the collectives is not the one the others wait for.
    blamed = [r for r in blamed if stats[r].wait_ratio < max_wait_ratio]
    if not blamed:
        return []
    if cause is not None:
        speedup = cause.predicted_speedup
    else:
        new_local = {}
        for r in blamed:
            peer = peer_median({q: s.local_s for q, s in stats.items() if q not in blamed}, r)
            if peer is not None:
                new_local[r] = peer
        speedup = predicted_speedup(stats, new_local) if new_local else None
    if spread >= min_spread:
        hi_r = max(busy.items(), key=itemgetter(1))[0]
        lo_r = min(busy.items(), key=itemgetter(1))[0]
        shown = Spread(f"rank {hi_r}", busy[hi_r], f"rank {lo_r}", busy[lo_r])
    else:
        hi_g = gpus[max(gpu_busy, key=lambda u: gpu_busy[u])]
        lo_g = gpus[min(gpu_busy, key=lambda u: gpu_busy[u])]
        shown = Spread(hi_g.label, gpu_busy[hi_g.uuid], lo_g.label, gpu_busy[lo_g.uuid], gpus=True)
    # Where the others wait for the blamed ranks, by operation (where the probe named them).
    facts = Facts(
        spread=shown,
        cause=cause,
        busy={r: busy[r] for r in blamed},
        waiting_in=collective_ops_order(s for r, s in stats.items() if r not in blamed),
        peers=len(stats) >= 2,
    )
    evidence: dict[str, object] = {
        "busy_ratio": {str(r): round(b, 3) for r, b in sorted(busy.items())},
        "spread": round(spread, 3),
        "collective_wait_ms": {str(r): round(w * 1e3, 1) for r, w in sorted(waits.items())},
    }
    ops = collective_ops_ms(stats)
    if ops:
        evidence["collective_ops_ms"] = ops
    unmeasured = sorted(r for r, s in stats.items() if s.collective_wait_s is None)
    if unmeasured and len(stats) >= 2:
        whose = "its" if len(unmeasured) == 1 else "their"
        evidence["not_measured"] = [
            f"collective wait on {ranks_text(unmeasured)}: {whose} waiting may read as busy time"
        ]
    if gpus:
        # The job's GPUs in node and index order (the snapshot's order, kept).
        ordered = [d for u, d in snapshot.gpus_in_place if u in gpus]
        evidence["gpu_busy_ratio"] = {d.uuid: round(gpu_busy[d.uuid], 3) for d in ordered}
        evidence["gpu_spread"] = round(gpu_spread, 3)
        on_blamed = {u for r in blamed for u in snapshot.gpus_of.get(r, ())}
        evidence["gpus"] = [d.ref for d in ordered if d.uuid in on_blamed]
        evidence["gpu_note"] = "NVML counts a rank waiting in an all-reduce as busy"
    # The cause carries the weight; the symptom stays one level below it.
    sev = severity_for(speedup)
    if cause is not None and sev == "critical":
        sev = "warning"
    return [
        Finding(
            kind="utilization_imbalance",
            severity=sev,
            ranks=tuple(blamed),
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
            cause=cause.kind if cause else None,
        )
    ]


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
