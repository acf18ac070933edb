"""utilization_imbalance: busy time spread across the job's ranks (90% against 50%).

Metric: per rank, the share of the step spent computing (h2d, forward, backward minus the
collective wait, optimizer). Decision: the spread between the busiest and the least busy rank is
at least ``min_spread``.

Attribution: the spread is a symptom. The ranks blamed are the ones the others wait for: the ones
that wait least at the all-reduce, among the ranks where the wait was measured. Never the ranks
that only wait: under DDP they look idle to the probe and fully busy to NVML, and either way they
are not the cause. Where no wait was measured at all, a rank's busy time includes its waiting,
so only a cause finding can attribute the spread; without one the rule stays silent. The cause
is the earlier finding that blames the same ranks (uneven batch, compute straggler, data
starvation); its fixes and speed-up are carried over.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..advisor import fmt_pct, predicted_speedup
from ..findings import Finding, severity_for
from ..snapshot import Snapshot
from .common import peer_median, ranks_text, ready

_CAUSES = ("batch_split", "compute_straggler", "data_starvation", "cpu_oversubscription")


def detect(
    snapshot: Snapshot,
    *,
    prior: Sequence[Finding] = (),
    min_steps: int = 8,
    min_spread: float = 0.25,
) -> list[Finding]:
    """Find a busy-time spread and attribute it.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_spread: busiest minus least busy share of the step (0.25 = 25 points).
    """
    stats = ready(snapshot.stats, min_steps)
    if len(stats) < 2:
        return []
    busy = {r: s.busy_ratio for r, s in stats.items()}
    spread = max(busy.values()) - min(busy.values())
    if spread < min_spread:
        return []
    waits = {r: s.collective_wait_s for r, s in stats.items() if s.collective_wait_s is not None}
    cause: Finding | None
    if len(waits) >= 2:
        lo, hi = min(waits.values()), max(waits.values())
        blamed = sorted(r for r, w in waits.items() if w <= lo + 0.25 * (hi - lo))
        cause = next(
            (f for kind in _CAUSES for f in prior if f.kind == kind and set(blamed) & set(f.ranks)),
            None,
        )
    else:
        cause = next((f for kind in _CAUSES for f in prior if f.kind == kind and f.ranks), None)
        if cause is None:
            return []
        blamed = sorted(cause.ranks)
    if cause is not None:
        fixes = {r: fx for r, fx in cause.fixes.items() if r in blamed}
        speedup = cause.predicted_speedup
    else:
        fixes = {}
        new_local = {}
        for r in blamed:
            peer = peer_median({q: s.local_s for q, s in stats.items() if q not in blamed}, r)
            if peer is not None:
                new_local[r] = peer
        speedup = predicted_speedup(stats, new_local) if new_local else None
        for r in blamed:
            fixes[r] = (
                f"profile rank {r}: it is busy {fmt_pct(busy[r])} of each step while its peers "
                "wait for it"
            )
    hi_r = max(busy, key=lambda r: busy[r])
    lo_r = min(busy, key=lambda r: busy[r])
    because = f" because of {cause.kind}" if cause else ""
    summary = (
        f"busy time spread {fmt_pct(busy[hi_r])} (rank {hi_r}) against {fmt_pct(busy[lo_r])} "
        f"(rank {lo_r}){because}: the others wait for {ranks_text(blamed)}"
    )
    evidence = {
        "busy_ratio": {str(r): round(b, 3) for r, b in sorted(busy.items())},
        "spread": round(spread, 3),
        "collective_wait_ms": {str(r): round(w * 1e3, 1) for r, w in sorted(waits.items())},
    }
    # The cause carries the weight; the symptom stays one level below it.
    sev = severity_for(speedup)
    if cause is not None and sev == "critical":
        sev = "warning"
    return [
        Finding(
            kind="utilization_imbalance",
            severity=sev,
            ranks=tuple(blamed),
            summary=summary,
            evidence=evidence,
            fixes=fixes,
            predicted_speedup=speedup,
            cause=cause.kind if cause else None,
        )
    ]
