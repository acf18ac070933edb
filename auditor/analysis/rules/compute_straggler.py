"""compute_straggler: a rank whose own compute is slower than its peers', that everyone waits for.

Metric: per rank, compute time per sample (``compute_s``: h2d + forward + backward + optimizer,
exclusive phases, so backward holds none of the collective wait; divided by the batch), and the
median collective wait per step: the gradient all-reduce and every other ``torch.distributed``
collective, by operation (``collective_ops``), which the finding names where the others wait.

Why the wait matters: DDP's all-reduce ends every step at a barrier, so fast ranks spend the
straggler's extra time waiting inside ``backward()``. Backward *wall* time is then nearly equal on
every rank and hides a delay inside backward; the wait is not: the straggler waits least. The
rank is blamed only if it both computes slower per sample (by ``min_excess``) and, where the wait
was measured, waits less than its peers; a rank that only waits is never blamed.

The phase with the largest excess over the peers' median names where to look. Per-sample
normalisation leaves uneven batches to ``batch_split``; data wait is excluded (``data_starvation``);
a rank whose host is oversubscribed by its own DataLoader workers is left to
``cpu_oversubscription``, which explains its slower compute.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..advisor import predicted_speedup
from ..findings import Finding, severity_for
from ..measures import PeerMedians, own_work, peer_median, with_peers_work
from ..snapshot import Snapshot
from ..stats import RankStats, collective_ops_ms, collective_ops_order

_PHASES = ("h2d", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class SlowRank:
    """A blamed rank: its slowest phase against the peers' median of it, and the batch that
    would fit its pace if its device is simply slower (None where a smaller batch buys nothing)."""

    phase: str
    phase_s: float
    peer_phase_s: float
    batch_size: int | None = None
    batch_share: int | None = None
    # Micro-batches per step: ``batch_size`` and ``batch_share`` are per micro-batch (the
    # DataLoader's batch), several of which the rank accumulates into one step.
    accumulated: int = 1


@dataclass(frozen=True)
class Facts:
    """The blamed ranks, and the collectives the others wait in for them (largest first;
    empty where the probe named none)."""

    ranks: Mapping[int, SlowRank]
    waiting_in: tuple[str, ...] = ()


def detect(
    snapshot: Snapshot,
    *,
    explained: Collection[int] = (),
    min_steps: int = 8,
    min_excess: float = 1.25,
    min_gap_ratio: float = 0.10,
) -> list[Finding]:
    """Find ranks that compute slower than their peers and make them wait.

    Args:
        explained: ranks whose slowness another finding explains (their own DataLoader
            workers oversubscribing the host, a throttled or slower GPU): not judged here. The
            engine passes them (:mod:`auditor.analysis.causes`).
        min_steps: steps a rank needs in the window before it is judged.
        min_excess: compute per sample relative to the peers' median that counts as slow.
        min_gap_ratio: the rank's extra local time, and its extra own work (the local time
            less its data wait), must each be at least this share of the step.
    """
    stats = snapshot.ready(min_steps)
    if len(stats) < 2:
        return []
    per_sample = {r: _per_sample(s) for r, s in stats.items()}
    local = {r: s.local_s for r, s in stats.items()}
    # Its own work: the local time less the data wait, which is data_starvation's. A starved
    # rank whose compute is a little slower (its own loader's CPU on a busy host) was blamed
    # here for its whole data wait, at the speed-up of removing it.
    work = {r: own_work(s) for r, s in stats.items()}
    waits = {r: s.collective_wait_s for r, s in stats.items()}
    step = statistics.median(s.step_s for s in stats.values())

    contended = set(explained)
    blamed: dict[int, dict[str, float]] = {}
    cps_of_peers = PeerMedians(per_sample)
    local_of_peers = PeerMedians(local)
    work_of_peers = PeerMedians(work)
    waits_of_peers = PeerMedians(waits)
    for r in stats:
        if r in contended:
            continue
        peer_cps = cps_of_peers.get(r)
        peer_local = local_of_peers.get(r)
        peer_work = work_of_peers.get(r)
        if not peer_cps or peer_local is None or peer_work is None:
            continue
        excess = per_sample[r] / peer_cps
        gap = local[r] - peer_local
        if excess < min_excess or min(gap, work[r] - peer_work) < min_gap_ratio * step:
            continue
        w = waits[r]
        peer_wait = waits_of_peers.get(r)
        if w is None and peer_wait is not None:
            continue  # its own wait is unknown (so counted as work) while others' are known
        if w is not None and peer_wait is not None and w >= peer_wait:
            continue  # it waits as much as its peers: not the one they wait for
        blamed[r] = {"excess": excess, "gap": gap}
    if not blamed:
        return []

    # The fix brings a blamed rank's own work to its peers' median; its data wait stays.
    speedup = predicted_speedup(stats, with_peers_work(stats, blamed))
    slow: dict[int, SlowRank] = {}
    per_rank: dict[str, object] = {}
    for r in sorted(blamed):
        s = stats[r]
        phase, mine, theirs = _worst_phase(s, [stats[q] for q in stats if q not in blamed])
        batch = share = None
        # In the unit the user sets: the micro-batch (the step's batch without accumulation).
        micro = s.micro_batch_size
        if micro:
            fits = max(1, round(micro * (peer_median(per_sample, r) or 0) / per_sample[r]))
            if fits < micro:
                batch, share = round(micro), fits
        slow[r] = SlowRank(phase, mine, theirs, batch, share, s.accumulated)
        per_rank[str(r)] = {
            "phase": phase,
            "phase_ms": round(mine * 1e3, 1),
            "peer_phase_ms": round(theirs * 1e3, 1),
            "compute_per_sample_ratio": round(blamed[r]["excess"], 2),
            "extra_local_ms": round(blamed[r]["gap"] * 1e3, 1),
        }
    evidence: dict[str, object] = {
        "per_rank": per_rank,
        "collective_wait_ms": {
            str(r): None if w is None else round(w * 1e3, 1) for r, w in sorted(waits.items())
        },
        "local_ms": {str(r): round(v * 1e3, 1) for r, v in sorted(local.items())},
    }
    ops = collective_ops_ms(stats)
    if ops:
        evidence["collective_ops_ms"] = ops
    # The collectives the others wait in, by name where the probe reported them.
    waiting_in = collective_ops_order(s for r, s in stats.items() if r not in blamed)
    return [
        Finding(
            kind="compute_straggler",
            severity=severity_for(speedup),
            ranks=tuple(sorted(blamed)),
            facts=Facts(slow, waiting_in),
            evidence=evidence,
            predicted_speedup=speedup,
        )
    ]


def _per_sample(s: RankStats) -> float:
    return s.compute_s / s.batch_size if s.batch_size else s.compute_s


def _phase_s(s: RankStats, phase: str) -> float:
    # Phases are exclusive: backward_s holds no collective wait.
    return float(getattr(s, f"{phase}_s"))


def _worst_phase(s: RankStats, peers: list[RankStats]) -> tuple[str, float, float]:
    """The phase with the largest excess over the peers' median (scaled where batches differ)."""
    best = ("forward", _phase_s(s, "forward"), 0.0)
    best_gap = float("-inf")
    for phase in _PHASES:
        mine = _phase_s(s, phase)
        theirs_each = []
        for p in peers:
            scale = s.batch_size / p.batch_size if s.batch_size and p.batch_size else 1.0
            theirs_each.append(_phase_s(p, phase) * scale)
        theirs = statistics.median(theirs_each) if theirs_each else 0.0
        if mine - theirs > best_gap:
            best_gap = mine - theirs
            best = (phase, mine, theirs)
    return best
