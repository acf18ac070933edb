"""data_starvation: a rank that spends a large share of its step waiting for its next batch.

Metric: per rank, the time blocked in the DataLoader's ``__next__`` per step as a share of the
step, both at the rank's pace (:meth:`RankStats.paced`): with ``w >= 2`` workers, the mean over
each round of ``w`` steps (workers that cannot keep up deliver in rounds: one long wait, then
``w - 1`` short steps, and a median lands on one kind or the other), the duration-weighted
median over those rounds (an evaluation or a checkpoint save still cannot decide alone); the
medians themselves with 0 or 1 worker, whose waits come every step. Every figure below (load
time, pace, speed-up) reads the same paced figures, the peers' too.
Decision: starved when the share is at least ``min_wait_ratio`` and the wait is at least
``min_wait_s`` (so microsecond waits on very fast steps do not count).

Severity: from the predicted speed-up, and never below ``warning`` for a rank that waits for data
``warn_wait_ratio`` of its step or more. A number that could not be measured (a peer's collective
wait, the loading's CPU) never silences such a rank; the evidence names what was missing.

The fix starts from what the loading costs (:mod:`auditor.analysis.loading`): I/O-bound
loading (little CPU while it loads) or CPU-bound loading.

* per-batch load time ``L``: with ``num_workers == 0`` the main process loads, so ``L`` is the
  data wait itself; with ``a`` workers that cannot keep up, each worker delivers one batch per
  ``L`` seconds and the rank consumes one per step, so ``L ~= a * step`` (the mean step: ``a``
  batches per ``L``);
* the target pace ``T``: the rank's own work per step without the data wait, or the job's
  slowest rank's, whichever is longer (faster than the job's pace buys nothing). Ranks whose
  collective wait was not measured are left out of the job's pace: their waiting for the
  starved rank would count as work;
* ``b = ceil(margin * L / T)`` workers would keep up, at most ``max_workers``, and at most what
  ``memory_share`` of the host's available memory holds (one worker's RSS each: the workers'
  measured RSS, else the main process's, an upper bound for a forked worker);
* I/O-bound loading is not capped by cores: its workers sit waiting on storage or the network
  and cost memory, not CPU. CPU-bound (or unmeasured) loading is capped by the cores its workers
  may use (idle cores shared among the host's starved ranks, plus what its loading uses now)
  divided by the CPU one loader was measured to use (1 core where unmeasured).

When no worker fits (CPU-bound loading on a saturated host, or a host flagged by
``cpu_oversubscription``), the fix is cheaper loading. Its gain depends on how much cheaper,
which nothing measured says: the speed-up is the one of loading ``cheaper_factor`` times
cheaper, named as that assumption. Where the peers' collective wait was not measured, the
barrier model cannot tell their own work from their waiting, so no speed-up is predicted; the
evidence gives the upper bound of removing the wait.

Assumptions: workers run independently (no shared lock in the dataset), and loading time per
batch does not depend on the number of workers (true for decoding and for a storage backend
that is not yet saturated).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from auditor.wording import ranks_text

from ..advisor import predicted_speedup
from ..findings import Finding, severity_for
from ..loading import (
    IO,
    UNKNOWN,
    LoadingCost,
    fair_share,
    host_available_bytes,
    loading_cost,
)
from ..measures import own_work
from ..snapshot import Snapshot
from ..stats import RankStats

# What capped a worker plan: the free cores, the cores where the host was never sampled (one
# assumed), the host's available memory, or ``max_workers``.
CORES = "cores"
CORES_ASSUMED = "cores_assumed"
MEMORY = "memory"
MAX_WORKERS = "max_workers"
# The evidence's name of each limit (the JSON record's ``limited_by``).
_LIMIT_EVIDENCE = {CORES_ASSUMED: "cores (host not sampled: 1 assumed)"}


@dataclass(frozen=True)
class StarvedRank:
    """A starved rank's remedy: its current and recommended workers (None: none fit), what
    capped the count below what would keep up, its loading's kind and CPU, and the loader
    settings to turn on."""

    num_workers: int | None  # None where the rank's loader settings are unknown
    workers: int | None
    limited_by: str | None  # CORES, CORES_ASSUMED, MEMORY, MAX_WORKERS; None where not capped
    loading: str  # IO, CPU or UNKNOWN (auditor.analysis.loading)
    loading_cores: float | None  # cores the loading used while it loaded; None if unmeasured
    set_pin_memory: bool
    set_persistent_workers: bool


@dataclass(frozen=True)
class Wait:
    """The worst-starved rank's data wait per step against its step (at its pace:
    :meth:`RankStats.paced`)."""

    rank: int
    data_wait_s: float
    step_s: float
    data_wait_ratio: float


@dataclass(frozen=True)
class PeersWait:
    """The unstarved ranks' collective wait per step for the starved (median over them, each at
    its pace), and the operations they wait in (largest first; empty where none was
    reported)."""

    ranks: tuple[int, ...]
    wait_s: float
    ops: tuple[str, ...]


@dataclass(frozen=True)
class Facts:
    """The starved ranks' remedies, the worst wait, the peers' wait for them (None where not
    measured or too small to be waiting), and how much cheaper the "make loading cheaper" fix
    is assumed to make loading."""

    ranks: Mapping[int, StarvedRank]
    worst: Wait
    peers: PeersWait | None
    cheaper_factor: float


def detect(
    snapshot: Snapshot,
    *,
    oversubscribed: Collection[int] = (),
    min_steps: int = 8,
    min_wait_ratio: float = 0.15,
    min_wait_s: float = 0.002,
    warn_wait_ratio: float = 0.25,
    margin: float = 1.25,
    max_workers: int = 32,
    io_bound_share: float = 0.25,
    memory_share: float = 0.5,
    cheaper_factor: float = 2.0,
) -> list[Finding]:
    """Find starved ranks.

    Args:
        oversubscribed: ranks on a host cpu_oversubscription found saturated: no more
            CPU-bound workers for them (the engine passes them, :mod:`auditor.analysis.causes`).
        min_steps: steps a rank needs in the window before it is judged.
        min_wait_ratio: data wait as a share of the step that counts as starved (0.15 = 15%).
        min_wait_s: smallest wait per step (at the rank's pace) that counts, in seconds.
        warn_wait_ratio: data wait share at which the finding is at least a warning, whatever
            the predicted speed-up (or where none could be predicted).
        margin: head-room on the worker count so a burst of slow batches does not stall.
        max_workers: upper bound on a recommended ``num_workers``.
        io_bound_share: loading that uses less than this share of the CPU a CPU-bound loader
            gets on its host is I/O-bound (see :mod:`auditor.analysis.loading`).
        memory_share: share of the host's available memory that new workers may take.
        cheaper_factor: how much cheaper the "make loading cheaper" fix is assumed to make
            loading, for its predicted speed-up (2.0 = half the cost).
    """
    # At each rank's pace: with workers, the mean step and wait over their rounds of arrivals.
    ready = snapshot.ready(min_steps)
    stats = dict(zip(ready, map(RankStats.paced, ready.values()), strict=True))
    starved = {
        r: s
        for r, s in stats.items()
        if s.data_wait_ratio >= min_wait_ratio and s.data_wait_s >= min_wait_s
    }
    if not starved:
        return []
    # Peers whose collective wait was not measured: their waiting for the starved ranks is
    # booked as their own work, so neither their pace nor the speed-up can be trusted.
    blind = (
        sorted(r for r, s in stats.items() if r not in starved and s.collective_wait_s is None)
        if len(stats) >= 2
        else []
    )
    # The pace the job would keep without data stalls: the slowest rank's own work.
    seen = _without_blind(stats, blind)  # (the starved are never blind: never empty)
    job_pace = max(map(_work_s, seen.values()))
    fed = [s.data_wait_s for r, s in stats.items() if r not in starved]
    residual = statistics.median(fed) if fed else 0.0

    new_local: dict[int, float] = {}
    upper_local: dict[int, float] = {}
    plans: dict[int, _Plan] = {}
    costs: dict[int, LoadingCost] = {}
    per_rank: dict[str, object] = {}
    not_measured: list[str] = []
    hosts = snapshot.hosts()
    shares = {s.host: fair_share(snapshot, s.host) for s in starved.values()}
    available = {host: host_available_bytes(snapshot, host) for host in shares}
    for r, s in sorted(starved.items()):
        on_host = sum(1 for q in hosts.get(s.host, []) if q in starved)
        cost = loading_cost(snapshot, s, io_bound_share=io_bound_share, share=shares[s.host])
        free = _free_cores(snapshot, s, cost, starved_on_host=on_host)
        memory = _memory_room(
            s, available[s.host], starved_on_host=on_host, memory_share=memory_share
        )
        plan = _worker_plan(s, cost, job_pace, free, memory, margin=margin, max_workers=max_workers)
        if plan.workers is not None and r in oversubscribed and cost.kind != IO:
            plan = _Plan(None, plan.wanted, None, 0.0)  # the host has no CPU to give
        if plan.workers is None:
            new_wait = _cheaper_wait(s, cost, cheaper_factor)
            basis = f"loading {cheaper_factor:g}x cheaper (an assumption: the fix sets how much)"
        else:
            # Even a fed rank waits a little per batch (hand-off from the workers): the peers'
            # median wait, where there are unstarved peers, is the floor of what a fix reaches.
            new_wait = max(plan.expected_wait_s, min(residual, s.data_wait_s))
            basis = "workers keep up"
        new_local[r] = max(0.0, s.local_s - s.data_wait_s + new_wait)
        upper_local[r] = max(0.0, s.local_s - s.data_wait_s + min(residual, s.data_wait_s))
        plans[r], costs[r] = plan, cost
        if cost.kind == UNKNOWN:
            sized = "workers sized by the free cores" if plan.workers else "no workers added"
            not_measured.append(f"loading CPU of rank {r} ({cost.missing}): {sized}")
        if memory is None and plan.workers is not None:
            not_measured.append(
                f"available memory on {s.host or 'the host'} of rank {r}: "
                "workers not bounded by memory"
            )
        per_rank[str(r)] = {
            "data_wait_ms": round(s.data_wait_s * 1e3, 1),
            "step_ms": round(s.step_s * 1e3, 1),
            "data_wait_ratio": round(s.data_wait_ratio, 3),
            "load_per_batch_ms": round(cost.load_s * 1e3, 1),
            "num_workers": s.loader.num_workers if s.loader else None,
            "recommended_workers": plan.workers,
            "workers_needed": plan.wanted,
            "limited_by": _limit_evidence(plan),
            "worker_cpu_each": None if s.worker_cpu_each is None else round(s.worker_cpu_each, 2),
            "free_cores": None if free is None else round(free, 2),
            "loading": cost.evidence(),
            "memory": None if memory is None else memory.evidence(),
            "expected_wait_ms": round(new_wait * 1e3, 1),
            "speedup_basis": basis,
        }
    evidence: dict[str, object] = {"job_pace_ms": round(job_pace * 1e3, 1), "per_rank": per_rank}
    peers = _peer_waits(stats, starved)
    if peers:
        evidence["peers_collective_wait_ms"] = peers
    at_most = predicted_speedup(seen, upper_local)
    speedup: float | None
    if blind:
        speedup = None
        not_measured.insert(
            0,
            f"collective wait on {ranks_text(blind)}: {'its' if len(blind) == 1 else 'their'} "
            f"waiting for {ranks_text(starved)} counts as work, so no speed-up is predicted "
            f"(at most {at_most:.1f}x with the data wait removed)",
        )
        evidence["speedup_model"] = f"not predicted; at most {at_most:.2f}x"
    else:
        speedup = predicted_speedup(stats, new_local)
    if not_measured:
        evidence["not_measured"] = not_measured

    worst = max(starved.values(), key=lambda s: s.data_wait_ratio)
    facts = Facts(
        ranks={r: _starved_rank(starved[r], plans[r], costs[r]) for r in plans},
        worst=Wait(worst.rank, worst.data_wait_s, worst.step_s, worst.data_wait_ratio),
        peers=_peers_wait(stats, starved, max(min_wait_s, 0.25 * worst.data_wait_s)),
        cheaper_factor=cheaper_factor,
    )
    severity = severity_for(speedup)
    if severity == "info" and worst.data_wait_ratio >= warn_wait_ratio:
        severity = "warning"  # a clear wait is worth a look whatever could not be predicted
    return [
        Finding(
            kind="data_starvation",
            severity=severity,
            ranks=tuple(sorted(starved)),
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
        )
    ]


@dataclass(frozen=True)
class _Memory:
    """What the host's memory allows: one worker's RSS and the workers that fit."""

    per_worker_bytes: float
    basis: str
    available_bytes: int
    room: int

    def evidence(self) -> dict[str, object]:
        return {
            "per_worker_bytes": round(self.per_worker_bytes),
            "per_worker_basis": self.basis,
            "host_available_bytes": self.available_bytes,
            "workers_that_fit": self.room,
        }


@dataclass(frozen=True)
class _Plan:
    """How many workers (None: none fit), how many would keep up, what limits the count, and
    the wait they should leave."""

    workers: int | None
    wanted: int
    limit: str | None
    expected_wait_s: float

    @property
    def capped(self) -> bool:
        return self.workers is None or self.workers < self.wanted


def _limit_evidence(plan: _Plan) -> str | None:
    """The evidence's name of what capped the plan; None where nothing did."""
    if not plan.capped or plan.limit is None:
        return None
    return _LIMIT_EVIDENCE.get(plan.limit, plan.limit)


def _work_s(s: RankStats) -> float:
    """A rank's own work per step apart from waiting for data or for its peers (never 0: the
    worker plan divides by it)."""
    return max(1e-6, own_work(s))


def _idle_cores(snapshot: Snapshot, host: str) -> float | None:
    cpu = snapshot.host_cpu(host)
    return None if cpu is None else max(0.0, cpu[0] - cpu[1])


def _free_cores(
    snapshot: Snapshot, s: RankStats, cost: LoadingCost, *, starved_on_host: int
) -> float | None:
    """Cores this rank's workers may use in all: idle cores shared among the host's starved
    ranks, plus what its loading uses now (workers, or the main thread's loading, which moves
    to the workers). None where the host was never sampled."""
    idle = _idle_cores(snapshot, s.host)
    if idle is None:
        return None
    if cost.workers == 0:
        own = 0.0 if s.data_cpu_s is None or s.step_s <= 0 else s.data_cpu_s / s.step_s
    elif s.worker_cpu is not None:
        own = s.worker_cpu
    else:  # unmeasured: assume each current worker keeps a core busy
        own = float(cost.workers)
    return idle / max(1, starved_on_host) + own


def _memory_room(
    s: RankStats, available: int | None, *, starved_on_host: int, memory_share: float
) -> _Memory | None:
    """Workers the host's ``available`` memory holds for this rank; None where unmeasured."""
    if s.worker_rss_each:
        each, basis = s.worker_rss_each, "the workers' RSS"
    else:
        main = s.main_rss_bytes or s.rss_bytes
        each, basis = (main or 0.0), "the main process's RSS (at most what a forked worker holds)"
    if available is None or each <= 0:
        return None
    room = int(memory_share * available / max(1, starved_on_host) / each)
    return _Memory(per_worker_bytes=each, basis=basis, available_bytes=available, room=room)


def _worker_plan(
    s: RankStats,
    cost: LoadingCost,
    job_pace: float,
    free_cores: float | None,
    memory: _Memory | None,
    *,
    margin: float,
    max_workers: int,
) -> _Plan:
    current = cost.workers
    target = max(_work_s(s), job_pace)
    wanted = max(current + 1, math.ceil(margin * cost.load_s / target - 1e-9))
    caps: list[tuple[int, str]] = [(max_workers, MAX_WORKERS)]
    if cost.kind != IO:  # I/O-bound workers wait on storage: they need memory, not cores
        room = 1.0 if free_cores is None else free_cores
        each = cost.cores if cost.cores else 1.0
        limit = CORES if free_cores is not None else CORES_ASSUMED
        caps.append((int(room / max(each, 1e-3) + 1e-9), limit))
    if memory is not None:
        caps.append((current + memory.room, MEMORY))
    cap, limit = min(caps, key=lambda c: c[0])
    workers = min(wanted, cap)
    if workers <= current:
        return _Plan(None, wanted, limit, 0.0)
    expected = max(0.0, cost.load_s / workers - _work_s(s))
    return _Plan(workers, wanted, limit, min(expected, s.data_wait_s))


def _cheaper_wait(s: RankStats, cost: LoadingCost, factor: float) -> float:
    """The data wait left if loading took ``1 / factor`` of its time with today's loaders."""
    load = cost.load_s / max(1.0, factor)
    if cost.workers == 0:
        return min(s.data_wait_s, load)  # the main process loads while the rank waits
    return min(s.data_wait_s, max(0.0, load / cost.workers - _work_s(s)))


def _without_blind(stats: dict[int, RankStats], blind: list[int]) -> dict[int, RankStats]:
    if not blind:
        return stats
    kept = {r: s for r, s in stats.items() if r not in blind}
    return kept or stats


def _peer_waits(stats: dict[int, RankStats], starved: dict[int, RankStats]) -> dict[str, object]:
    """The unstarved ranks' collective wait per step, with its operations where reported."""
    out: dict[str, object] = {}
    for r, s in sorted(stats.items()):
        if r in starved:
            continue
        row: dict[str, object] = {
            "total": None if s.collective_wait_s is None else round(s.collective_wait_s * 1e3, 1)
        }
        if s.collective_ops:
            row["ops"] = {op: round(w * 1e3, 1) for op, w in sorted(s.collective_ops.items())}
        out[str(r)] = row
    return out


def _peers_wait(
    stats: dict[int, RankStats], starved: dict[int, RankStats], min_s: float
) -> PeersWait | None:
    """The unstarved ranks' median collective wait for the starved, where measured and at least
    ``min_s`` (less is the collectives' own cost, not waiting for the starved)."""
    peers = {r: s for r, s in stats.items() if r not in starved and s.collective_wait_s}
    if not peers:
        return None
    wait = statistics.median(s.collective_wait_s or 0.0 for s in peers.values())
    if wait < min_s:
        return None
    totals: dict[str, float] = {}
    for s in peers.values():
        for op, w in (s.collective_ops or {}).items():
            totals[op] = totals.get(op, 0.0) + w
    ops = tuple(op for op, w in sorted(totals.items(), key=lambda kv: -kv[1]) if w > 0)
    return PeersWait(tuple(sorted(peers)), wait, ops)


def _starved_rank(s: RankStats, plan: _Plan, cost: LoadingCost) -> StarvedRank:
    """What the fix of a starved rank changes: its workers and its loader settings."""
    cfg = s.loader
    pin = persistent = False
    if cfg is not None:
        pin = not cfg.pin_memory and s.device.startswith("cuda")
        persistent = (plan.workers or cfg.num_workers) > 0 and not cfg.persistent_workers
    return StarvedRank(
        num_workers=None if cfg is None else cfg.num_workers,
        workers=plan.workers,
        limited_by=plan.limit if plan.capped else None,
        loading=cost.kind,
        loading_cores=cost.cores,
        set_pin_memory=pin,
        set_persistent_workers=persistent,
    )
