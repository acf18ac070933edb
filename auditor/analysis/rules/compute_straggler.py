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
``cpu_oversubscription``, which explains its slower compute; a rank that stalls (``stall``: a
checkpoint every few steps) is that finding's, as its stalls weigh in its duration-weighted
medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from ..advisor import Barrier
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..measures import PeerMedians, own_work, peer_median, with_peers_work
from ..rule import Explained, Rule
from ..snapshot import Snapshot
from ..stats import collective_ops_ms, ops_order

KIND = "compute_straggler"
PHASES = ("h2d", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_excess: compute per sample relative to the peers' median that counts as slow.
    min_gap_ratio: the rank's extra local time, and its extra own work (the local time less
        its data wait), must each be at least this share of the step.
    """

    min_steps: int = 8
    min_excess: float = 1.25
    min_gap_ratio: float = 0.10


@dataclass(frozen=True)
class Inputs:
    """Per rank (the ranks ready to judge, at their pace): compute per sample, local time, own
    work (local less data wait: the data wait is data_starvation's), collective wait (None:
    unmeasured), its exclusive phases (:data:`PHASES` order), batch and micro-batch, and the
    collectives it waited in; the job's median step and its barrier model."""

    per_sample_s: Mapping[int, float]
    local_s: Mapping[int, float]
    work_s: Mapping[int, float]
    wait_s: Mapping[int, float | None]
    phases_s: Mapping[int, tuple[float, ...]]
    batch: Mapping[int, float | None]
    micro_batch: Mapping[int, float | None]
    accumulated: Mapping[int, int]
    ops: Mapping[int, Mapping[str, float] | None]
    ops_ms: Mapping[str, Mapping[str, float]]
    step_s: float
    barrier: Barrier


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


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    if len(stats) < 2:
        return None
    return Inputs(
        per_sample_s={
            r: s.compute_s / s.batch_size if s.batch_size else s.compute_s for r, s in stats.items()
        },
        local_s={r: s.local_s for r, s in stats.items()},
        work_s={r: own_work(s) for r, s in stats.items()},
        wait_s={r: s.collective_wait_s for r, s in stats.items()},
        phases_s={r: (s.h2d_s, s.forward_s, s.backward_s, s.optimizer_s) for r, s in stats.items()},
        batch={r: s.batch_size for r, s in stats.items()},
        micro_batch={r: s.micro_batch_size for r, s in stats.items()},
        accumulated={r: s.accumulated for r, s in stats.items()},
        ops={r: s.collective_ops for r, s in stats.items()},
        ops_ms=collective_ops_ms(stats),
        step_s=statistics.median(s.step_s for s in stats.values()),
        barrier=Barrier.of(stats),
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Blame ranks that compute slower per sample than their peers and make them wait. Ranks
    whose slowness another finding explains (their own DataLoader workers oversubscribing the
    host, a throttled or slower GPU) are not judged here."""
    contended = explained.ranks
    blamed: dict[int, dict[str, float]] = {}
    cps_of_peers = PeerMedians(i.per_sample_s)
    local_of_peers = PeerMedians(i.local_s)
    work_of_peers = PeerMedians(i.work_s)
    waits_of_peers = PeerMedians(i.wait_s)
    for r in i.per_sample_s:
        if r in contended:
            continue
        peer_cps = cps_of_peers.get(r)
        peer_local = local_of_peers.get(r)
        peer_work = work_of_peers.get(r)
        if not peer_cps or peer_local is None or peer_work is None:
            continue
        excess = i.per_sample_s[r] / peer_cps
        gap = i.local_s[r] - peer_local
        if excess < t.min_excess or min(gap, i.work_s[r] - peer_work) < t.min_gap_ratio * i.step_s:
            continue
        w = i.wait_s[r]
        peer_wait = waits_of_peers.get(r)
        if w is None and peer_wait is not None:
            continue  # its own wait is unknown (so counted as work) while others' are known
        if w is not None and peer_wait is not None and w >= peer_wait:
            continue  # it waits as much as its peers: not the one they wait for
        blamed[r] = {"excess": excess, "gap": gap}
    if not blamed:
        return []

    # The fix brings a blamed rank's own work to its peers' median; its data wait stays.
    speedup = i.barrier.speedup(with_peers_work(i.local_s, i.work_s, blamed))
    slow: dict[int, SlowRank] = {}
    per_rank: dict[str, object] = {}
    fixes: list[Fix] = []
    peers = [q for q in i.per_sample_s if q not in blamed]
    for r in sorted(blamed):
        phase, mine, theirs = _worst_phase(i, r, peers)
        batch = share = None
        # In the unit the user sets: the micro-batch (the step's batch without accumulation).
        micro = i.micro_batch[r]
        if micro:
            fits = max(1, round(micro * (peer_median(i.per_sample_s, r) or 0) / i.per_sample_s[r]))
            if fits < micro:
                batch, share = round(micro), fits
        slow[r] = SlowRank(phase, mine, theirs, batch, share, i.accumulated[r])
        fixes.append(Fix("rank_work", r, current=phase, speedup=speedup, answers=(KIND,)))
        if share is not None:
            fixes.append(Fix("batch_size", r, batch, share, speedup, (KIND,)))
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
            str(r): None if w is None else round(w * 1e3, 1) for r, w in sorted(i.wait_s.items())
        },
        "local_ms": {str(r): round(v * 1e3, 1) for r, v in sorted(i.local_s.items())},
    }
    if i.ops_ms:
        evidence["collective_ops_ms"] = i.ops_ms
    # The collectives the others wait in, by name where the probe reported them.
    waiting_in = ops_order(i.ops[q] for q in peers)
    return [
        Finding(
            kind=KIND,
            severity=severity_for(speedup),
            ranks=tuple(sorted(blamed)),
            facts=Facts(slow, waiting_in),
            evidence=evidence,
            predicted_speedup=speedup,
            fixes=tuple(fixes),
        )
    ]


def _worst_phase(i: Inputs, r: int, peers: list[int]) -> tuple[str, float, float]:
    """The phase with the largest excess over the peers' median (scaled where batches differ).
    Phases are exclusive: backward holds no collective wait."""
    best = (PHASES[1], i.phases_s[r][1], 0.0)
    best_gap = float("-inf")
    batch = i.batch[r]
    for k, phase in enumerate(PHASES):
        mine = i.phases_s[r][k]
        theirs_each = []
        for p in peers:
            other = i.batch[p]
            scale = batch / other if batch and other else 1.0
            theirs_each.append(i.phases_s[p][k] * scale)
        theirs = statistics.median(theirs_each) if theirs_each else 0.0
        if mine - theirs > best_gap:
            best_gap = mine - theirs
            best = (phase, mine, theirs)
    return best


RULE = Rule(
    kind=KIND,
    place=50,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=("cpu_oversubscription", "hardware_straggler", "stall"),
)
