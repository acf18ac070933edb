"""compute_straggler: a rank whose own work is slower than its peers', that everyone waits for.

Metric: per rank, its own work per sample (:func:`~auditor.analysis.measures.own_work`: h2d +
forward + backward + optimizer, exclusive phases, so backward holds none of the collective wait,
*and* its time in no phase, ``other``: the loop's own code between forward and backward or after
the step, a metric, a debug check, a host-side transform, which its peers wait for just the
same; divided by the batch), and the median collective wait per step: the gradient all-reduce
and every other ``torch.distributed`` collective, by operation (``collective_ops``), which the
finding names where the others wait.

Why the wait matters: DDP's all-reduce ends every step at a barrier, so fast ranks spend the
straggler's extra time waiting inside ``backward()``. Backward *wall* time is then nearly equal on
every rank and hides a delay inside backward; the wait is not: the straggler waits least. The
rank is blamed only if it both works slower per sample (by ``min_excess``) and, where the wait
was measured, waits less than its peers; a rank that only waits is never blamed. The rank's extra
work must also stand out of its peers' own spread (``spread_k`` times their median absolute
deviation): robust to the straggler it looks for, with 2 ranks (no spread) as with 8.

The phase with the largest excess over the peers' median names where to look (``other`` where
the work is in no phase). Per-sample normalisation leaves uneven batches to ``batch_split``;
data wait is excluded (``data_starvation``); a rank whose host is oversubscribed by its own
DataLoader workers is left to ``cpu_oversubscription``, which explains its slower compute. A
rank that stalls (``stall``: a checkpoint every few steps) reads slower in its duration-weighted
medians, where its stalls weigh (and its peers in their waits): the stall explains that, and
the job is judged on each rank's typical step instead (the plain median of each figure over its
steps, :class:`~auditor.analysis.measures.TypicalStep`). Where even its typical own work is past
its peers' it is a straggler as well, and blamed on those figures (the speed-up of its own fix,
the stalls not counted): a stall never explains a persistent straggler away.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..advisor import Barrier
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..measures import (
    WORK_PHASES,
    PeerMedians,
    TypicalStep,
    mean_own_work,
    other_work,
    own_work,
    peer_median,
    robust_spread,
    typical_steps,
    with_peers_work,
)
from ..rule import Explained, Rule
from ..snapshot import Snapshot
from ..stats import collective_ops_ms, object_ops_floor, ops_order

KIND = "compute_straggler"
# The phases compared, in order; ``other``: the rank's own work in no phase.
PHASES = WORK_PHASES
OTHER = "other"
# The finding that explains a rank's slower duration-weighted figures by its spikes alone.
STALL = "stall"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_excess: compute per sample relative to the peers' median that counts as slow.
    min_gap_ratio: the rank's extra local time, and its extra own work (the local time less
        its data wait), must each be at least this share of the step; so must its extra own
        work as the window's plain mean (ranks taking turns being late on a busy host make
        one look slow in the medians, not in the sum).
    spread_k: the extra own work must also be at least this many times its peers' spread
        (the median absolute deviation of their own work, as a standard deviation): a rank
        does not stand out of peers that differ as much among themselves.
    short_of_cores: a blamed rank on the CPU whose main thread waited for a core (the kernel's
        run-queue delay), beyond its peers' median, for at least this share of its extra own
        work, while the CPU it used a step stayed under ``min_excess`` times its peers', is
        short of CPU on its host, not doing more work: its fix is cores, not its code. (A rank
        with more work on a busy host waits for cores too, in proportion: the CPU it used
        tells the two apart. On a GPU the host thread's CPU is not the rank's work: not
        judged there.)
    """

    min_steps: int = 8
    min_excess: float = 1.25
    min_gap_ratio: float = 0.10
    spread_k: float = 3.0
    short_of_cores: float = 0.5


@dataclass(frozen=True)
class Inputs:
    """Per rank (the ranks ready to judge, at their pace): own work per sample, local time, own
    work (local less data wait: the data wait is data_starvation's), collective wait (None:
    unmeasured), its exclusive phases and its work in none (:data:`PHASES` order), batch and
    micro-batch, the collectives it waited in, and its typical step (plain medians: what a
    rank whose stalls weigh in its figures is judged on); the job's median step and its
    barrier model."""

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
    typical: Mapping[int, TypicalStep] = field(default_factory=dict)
    # Own work per step as the window's plain mean (:func:`~..measures.mean_own_work`).
    mean_work_s: Mapping[int, float] = field(default_factory=dict)
    # Ranks on the CPU: seconds a step the main thread waited for a core (run-queue delay) and
    # the CPU seconds it used a step; absent: not measured, or a rank that drives a GPU.
    core_wait_s: Mapping[int, float] = field(default_factory=dict)
    cpu_s: Mapping[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SlowRank:
    """A blamed rank: its slowest phase (:data:`PHASES`; ``other``: its own work in no phase)
    against the peers' median of it, and the batch that would fit its pace if its device is
    simply slower (None where a smaller batch buys nothing, and for work in no phase, which a
    smaller batch does not shrink)."""

    phase: str
    phase_s: float
    peer_phase_s: float
    batch_size: int | None = None
    batch_share: int | None = None
    # Micro-batches per step: ``batch_size`` and ``batch_share`` are per micro-batch (the
    # DataLoader's batch), several of which the rank accumulates into one step.
    accumulated: int = 1
    # Short of cores: the seconds a step its main thread waited for a core, and its peers'
    # median, where that wait is most of its extra work (None otherwise).
    core_wait_s: float | None = None
    peer_core_wait_s: float | None = None

    @property
    def short_of_cores(self) -> bool:
        return self.core_wait_s is not None


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
    other = other_work(snapshot, stats)
    return Inputs(
        per_sample_s={
            r: own_work(s) / s.batch_size if s.batch_size else own_work(s) for r, s in stats.items()
        },
        local_s={r: s.local_s for r, s in stats.items()},
        work_s={r: own_work(s) for r, s in stats.items()},
        wait_s={r: s.collective_wait_s for r, s in stats.items()},
        phases_s={
            r: (s.h2d_s, s.forward_s, s.backward_s, s.optimizer_s, other.get(r, 0.0))
            for r, s in stats.items()
        },
        batch={r: s.batch_size for r, s in stats.items()},
        micro_batch={r: s.micro_batch_size for r, s in stats.items()},
        accumulated={r: s.accumulated for r, s in stats.items()},
        ops={r: s.collective_ops for r, s in stats.items()},
        ops_ms=collective_ops_ms(stats),
        step_s=statistics.median(s.step_s for s in stats.values()),
        barrier=Barrier.of(stats),
        # A window of one sample per rank (serve's means) is its own typical step: none kept.
        typical=typical_steps(snapshot, stats)
        if any(len(v.steps) > 1 for v in snapshot.ranks)
        else {},
        mean_work_s=mean_own_work(snapshot, stats),
        core_wait_s={
            r: s.main_wait * s.step_s
            for r, s in stats.items()
            if s.main_wait is not None and s.device == "cpu"
        },
        cpu_s={
            r: s.main_cpu * s.step_s
            for r, s in stats.items()
            if s.main_cpu is not None and s.device == "cpu"
        },
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Blame ranks that work slower per sample than their peers and make them wait. Ranks
    whose slowness another finding explains (their own DataLoader workers oversubscribing the
    host, a throttled or slower GPU) are not judged here; ranks a stall explains are judged on
    their typical step."""
    stalled = frozenset(r for f in explained.findings if f.kind == STALL for r in f.ranks)
    contended = frozenset(r for f in explained.findings if f.kind != STALL for r in f.ranks)
    # A stalled rank without its typical step (none measured) is the stall's alone.
    contended |= {r for r in stalled if r not in i.typical}
    i = _typical_for(i, stalled - contended)
    blamed: dict[int, dict[str, float]] = {}
    cps_of_peers = PeerMedians(i.per_sample_s)
    # No rank works ``min_excess`` past its peers per sample unless it does past the least its
    # peers' median can be: the few that do are judged (at 16,384 ranks, a handful).
    least = cps_of_peers.least()
    floor = t.min_excess * least if least is not None and least > 0 else float("-inf")
    candidates = [r for r, v in i.per_sample_s.items() if v >= floor and r not in contended]
    if not candidates:
        return []
    local_of_peers = PeerMedians(i.local_s)
    work_of_peers = PeerMedians(i.work_s)
    waits_of_peers = PeerMedians(i.wait_s)
    mean_of_peers = PeerMedians(i.mean_work_s)
    for r in candidates:
        peer_cps = cps_of_peers.get(r)
        peer_local = local_of_peers.get(r)
        peer_work = work_of_peers.get(r)
        if not peer_cps or peer_local is None or peer_work is None:
            continue
        excess = i.per_sample_s[r] / peer_cps
        gap = i.local_s[r] - peer_local
        extra = i.work_s[r] - peer_work
        if excess < t.min_excess or min(gap, extra) < t.min_gap_ratio * i.step_s:
            continue
        if extra < t.spread_k * _peer_spread(i.work_s, r):
            continue  # its peers differ as much among themselves: it does not stand out
        peer_mean = mean_of_peers.get(r)
        if (
            peer_mean is not None
            and r in i.mean_work_s
            and i.mean_work_s[r] - peer_mean < t.min_gap_ratio * i.step_s
        ):
            continue  # over the whole window its own work is not past its peers'
        w = i.wait_s[r]
        peer_wait = waits_of_peers.get(r)
        if w is None and peer_wait is not None:
            continue  # its own wait is unknown (so counted as work) while others' are known
        if w is not None and peer_wait is not None and w >= peer_wait:
            continue  # it waits as much as its peers: not the one they wait for
        blamed[r] = {"excess": excess, "gap": gap, "extra": extra}
    if not blamed:
        return []
    core_waits, cpus = PeerMedians(i.core_wait_s), PeerMedians(i.cpu_s)

    # The fix brings a blamed rank's own work to its peers' median; its data wait stays.
    new_local = with_peers_work(i.local_s, i.work_s, blamed)
    speedup = i.barrier.speedup(new_local)
    slow: dict[int, SlowRank] = {}
    per_rank: dict[str, object] = {}
    fixes: list[Fix] = []
    peers = [q for q in i.per_sample_s if q not in blamed]
    for r in sorted(blamed):
        phase, mine, theirs = _worst_phase(i, r, peers)
        batch = share = None
        # In the unit the user sets: the micro-batch (the step's batch without accumulation).
        micro = i.micro_batch[r]
        if micro and phase != OTHER:
            fits = max(1, round(micro * (peer_median(i.per_sample_s, r) or 0) / i.per_sample_s[r]))
            if fits < micro:
                batch, share = round(micro), fits
        queued, peer_queued = i.core_wait_s.get(r), core_waits.get(r)
        cpu, peer_cpu = i.cpu_s.get(r), cpus.get(r)
        short = (
            queued is not None
            and peer_queued is not None
            and cpu is not None
            and peer_cpu is not None
            and cpu < t.min_excess * peer_cpu
            and queued - peer_queued >= t.short_of_cores * blamed[r]["extra"]
        )
        if short:
            # Its extra time is mostly time it waited for a core: its host's CPU, not its work
            # (a smaller batch or less code would queue the same).
            slow[r] = SlowRank(
                phase, mine, theirs, None, None, i.accumulated[r], queued, peer_queued
            )
            fixes.append(Fix("host_cores", r, speedup=speedup, answers=(KIND,)))
        else:
            slow[r] = SlowRank(phase, mine, theirs, batch, share, i.accumulated[r])
            fixes.append(Fix("rank_work", r, current=phase, speedup=speedup, answers=(KIND,)))
            if share is not None:
                fixes.append(Fix("batch_size", r, batch, share, speedup, (KIND,)))
        row: dict[str, object] = {
            "phase": phase,
            "phase_ms": round(mine * 1e3, 1),
            "peer_phase_ms": round(theirs * 1e3, 1),
            "compute_per_sample_ratio": round(blamed[r]["excess"], 2),
            "extra_local_ms": round(blamed[r]["gap"] * 1e3, 1),
        }
        if queued is not None:  # a rank on the CPU whose wait for a core was read
            row["core_wait_ms"] = round(queued * 1e3, 1)
            row["peer_core_wait_ms"] = None if peer_queued is None else round(peer_queued * 1e3, 1)
            row["cpu_ms"] = None if cpu is None else round(cpu * 1e3, 1)
            row["peer_cpu_ms"] = None if peer_cpu is None else round(peer_cpu * 1e3, 1)
            row["short_of_cores"] = short
        per_rank[str(r)] = row
    evidence: dict[str, object] = {
        "per_rank": per_rank,
        "collective_wait_ms": {
            str(r): None if w is None else round(w * 1e3, 1) for r, w in sorted(i.wait_s.items())
        },
        "local_ms": {str(r): round(v * 1e3, 1) for r, v in sorted(i.local_s.items())},
    }
    if i.ops_ms:
        evidence["collective_ops_ms"] = i.ops_ms
    span = _object_span(i, slow, new_local, speedup)
    if span is not None:
        # The rank's own code with an object gather every rank pays for is a metrics gather in
        # the loop: taken off the step, the gather goes with the code (the fault benchmark's
        # case: 1.17x predicted without it, 1.83x achieved). The figure without it is the low
        # end.
        evidence["speedup_if_object_collectives_go"] = round(span[1], 3)
        speedup = span[1]
        fixes = [replace(x, speedup=speedup) for x in fixes]
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
            predicted_range=span,
        )
    ]


def _object_span(
    i: Inputs, slow: Mapping[int, SlowRank], new_local: Mapping[int, float], speedup: float
) -> tuple[float, float] | None:
    """Where a blamed rank's excess is its own code (no phase) and every rank pays for object
    collectives each step (a metrics gather in the loop: pickling on one rank, unpickling on
    all), the fix removes those too: the barrier model's figure with their floor gone is the
    prediction, and the figure with only the rank's own code gone the range's low end. None
    where that does not apply or gives nothing more."""
    if not any(s.phase == OTHER for s in slow.values()):
        return None
    floor = object_ops_floor(i.ops.values())
    if floor <= 0:
        return None
    before = i.barrier.step_s()
    after = Barrier(i.barrier.local, max(0.0, i.barrier.floor - floor)).step_s(new_local)
    most = before / after if after > 0 else speedup
    return (speedup, most) if most > speedup else None


def _typical_for(i: Inputs, stalled: frozenset[int]) -> Inputs:
    """``i`` taken from every rank's typical step where a stall explains some rank's figures
    (``stalled``): a stall's spikes weigh in duration-weighted medians and read as slow work in
    every figure of the stalling rank, and as waits in its peers'; the plain medians over the
    steps say whether the rank is slower besides. Every rank is read alike, so the comparison
    is of like with like."""
    if not any(r in i.typical for r in stalled if r in i.per_sample_s):
        return i
    swap = {r: i.typical[r] for r in i.per_sample_s if r in i.typical}
    per_sample = dict(i.per_sample_s)
    local, work, wait, phases = dict(i.local_s), dict(i.work_s), dict(i.wait_s), dict(i.phases_s)
    for r, typ in swap.items():
        batch = i.batch[r]
        per_sample[r] = typ.work_s / batch if batch else typ.work_s
        local[r], work[r], phases[r] = typ.local_s, typ.work_s, typ.phases_s
        if typ.wait_s is not None:
            wait[r] = typ.wait_s
    waits = [w for w in wait.values() if w is not None]
    return replace(
        i,
        per_sample_s=per_sample,
        local_s=local,
        work_s=work,
        wait_s=wait,
        phases_s=phases,
        step_s=statistics.median(t.step_s for t in swap.values()),
        barrier=Barrier(local, min(waits) if waits else 0.0),
    )


def _peer_spread(work_s: Mapping[int, float], r: int) -> float:
    """Rank ``r``'s peers' spread of own work (:func:`robust_spread` of every other rank's; 0.0
    with one peer). Asked only of a rank that is already slower by the other thresholds."""
    return robust_spread(v for q, v in work_s.items() if q != r)


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
