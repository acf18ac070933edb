"""data_starvation: a rank that spends a large share of its step waiting for its next batch.

Metric: per rank, the time blocked in the DataLoader's ``__next__`` per step as a share of the
step, both at the rank's pace (:meth:`Snapshot.ready`): with ``w >= 2`` workers, the mean over
each round of ``w`` steps (workers that cannot keep up deliver in rounds: one long wait, then
``w - 1`` short steps, and a median lands on one kind or the other), the duration-weighted
median over those rounds (an evaluation or a checkpoint save still cannot decide alone); the
medians themselves with 0 or 1 worker, whose waits come every step. Every figure below (load
time, pace, speed-up) reads the same paced figures, the peers' too.
Decision: starved when the share is at least ``min_wait_ratio`` and the wait is at least
``min_wait_s`` (so microsecond waits on very fast steps do not count).

Severity: from the predicted speed-up, and never below ``warning`` for a rank that waits for data
``warn_wait_ratio`` of its step or more. A number that could not be measured (a peer's collective
wait, the loading's CPU) never silences such a rank; the evidence names what was missing
(``not_measured``: :data:`COLLECTIVE_WAIT`, :data:`LOADING_CPU`, :data:`HOST_MEMORY`).

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

The fixes (:class:`~auditor.analysis.fixes.Fix`, per starved rank): ``num_workers`` from the
current count to the plan, ``pin_memory`` (a CUDA rank whose loader does not pin) and
``persistent_workers`` (workers that are not kept across epochs) turned on.

Workers started at every epoch. A loader without ``persistent_workers`` starts its workers
anew at each epoch: the probe books the new iterator's creation and its first batch's wait on
the step that pays for them (``StepSample.loader_start_s``). Once an epoch, a step's medians
miss that wait; over the window it is time the rank waited for data all the same, so a rank
whose starts took ``min_wait_ratio`` of its steps' time is starved too. Where the starts are
``restart_share`` of its data wait or more, its fix is to keep the workers
(``persistent_workers=True``, :data:`WORKERS_KEPT`), not more of them: the speed-up is the
starts' time gone from the run (the largest share of a starved rank: the others wait for it at
each epoch's first step). Each epoch's first batch still loads once kept workers are handed
the epoch's indices; with workers that keep up, that is a batch's load, well under a start.

When no worker fits (CPU-bound loading on a saturated host, or a host flagged by
``cpu_oversubscription``), the fix is cheaper loading (``loading_cost``). Its gain depends on
how much cheaper, which nothing measured says: the speed-up is the one of loading
``cheaper_factor`` times cheaper, named as that assumption (``speedup_basis``:
:data:`CHEAPER_LOADING`, else :data:`WORKERS_KEEP_UP`). Where the peers' collective wait was not
measured, the barrier model cannot tell their own work from their waiting, so no speed-up is
predicted (``speedup_model``: :data:`NOT_PREDICTED`); the facts give the upper bound of removing
the wait.

The step after the fix is at least what the starved rank's host allows once it is fed
(:class:`HostBound`, ``host_bound`` in the evidence): the CPU a step needs there (each rank's
work as its fed peers on the host do it, and the loading) over the host's cores, and, for
CPU-bound loading, the cores shared evenly among the ranks and the new workers while the ranks
work, each worker finishing its batch alone once they wait for it. The prediction reads the
longer of the two; its range reaches down to the same bound on the cores the host's other
work (busy cores no rank's process explains) leaves, which may or may not stay busy.

Assumptions: workers run independently (no shared lock in the dataset), and loading time per
batch does not depend on the number of workers (true for decoding and for a storage backend
that is not yet saturated).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..advisor import Barrier
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..loading import (
    IO,
    UNKNOWN,
    HostBound,
    LoadingCost,
    fair_share,
    host_available_bytes,
    loading_cost,
    work_cpu,
)
from ..measures import own_work
from ..rule import Explained, Rule
from ..snapshot import Snapshot
from ..stats import RankStats
from ..workers import (
    MAIN_RSS,
    WORKERS_RSS,
    WorkerPlan,
    cheaper_wait,
    memory_room,
    worker_plan,
)

KIND = "data_starvation"
# Evidence codes (the report words them). ``speedup_basis``: the workers keep up, or loading
# ``cheaper_factor`` times cheaper (an assumption). ``per_worker_basis``: one worker's memory is
# the workers' RSS, or the main process's (:mod:`..workers`: ``WORKERS_RSS``, ``MAIN_RSS``).
# ``speedup_model``: not predicted. ``not_measured``: the peers' collective wait, the loading's
# CPU, the host's available memory.
WORKERS_KEEP_UP = "workers_keep_up"
CHEAPER_LOADING = "cheaper_loading"
# The wait is mostly the workers starting at every epoch: kept across epochs, they would not.
WORKERS_KEPT = "workers_kept"
NOT_PREDICTED = "not_predicted"
COLLECTIVE_WAIT = "collective_wait"
LOADING_CPU = "loading_cpu"
HOST_MEMORY = "host_memory"


@dataclass(frozen=True)
class Thresholds:
    """Args:
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
    restart_share: a loader without ``persistent_workers`` whose workers' starts (at every
        epoch: the iterator's creation and its first batch's wait) took at least this share of
        the rank's data wait in the window is starved by the starts: its fix is to keep the
        workers, not more of them.
    """

    min_steps: int = 8
    min_wait_ratio: float = 0.15
    min_wait_s: float = 0.002
    warn_wait_ratio: float = 0.25
    margin: float = 1.25
    max_workers: int = 32
    io_bound_share: float = 0.25
    memory_share: float = 0.5
    cheaper_factor: float = 2.0
    restart_share: float = 0.5


@dataclass(frozen=True)
class Inputs:
    """Per rank ready to judge (at its pace): its data wait and its share of the step, step,
    local time, own work (local less data wait, never 0), collective wait (None: unmeasured) and
    its operations (None: none reported).

    Only for the ranks that wait (``min_wait_ratio`` and ``min_wait_s``, the test ``decide``
    applies), what the worker plan reads: host, loading cost (:mod:`auditor.analysis.loading`),
    the cores its loading uses now, one worker's memory and its basis (:data:`WORKERS_RSS`,
    :data:`MAIN_RSS`), its loader's ``num_workers`` and ``persistent_workers`` (None: no loader
    seen), whether it is a CUDA rank whose loader does not pin memory, and its workers' CPU
    each; per host of theirs, its ranks, idle cores and available memory (None: unmeasured)."""

    wait_ratio: Mapping[int, float]
    wait_s: Mapping[int, float]
    step_s: Mapping[int, float]
    local_s: Mapping[int, float]
    work_s: Mapping[int, float]
    collective_wait_s: Mapping[int, float | None]
    collective_ops: Mapping[int, Mapping[str, float] | None]
    host: Mapping[int, str]
    cost: Mapping[int, LoadingCost]
    own_cores: Mapping[int, float]
    worker_bytes: Mapping[int, float]
    worker_basis: Mapping[int, str]
    num_workers: Mapping[int, int | None]
    persistent_workers: Mapping[int, bool | None]
    unpinned_cuda: Mapping[int, bool]
    worker_cpu_each: Mapping[int, float | None]
    host_ranks: Mapping[str, tuple[int, ...]]
    idle_cores: Mapping[str, float | None]
    available: Mapping[str, int | None]
    # The main process CPU (cores) and the workers' (None: not sampled) of every ready rank on
    # a starved rank's host, and each such host's ``(cores, busy cores)``: what the host bound
    # reads (_host_bound).
    main_cpu: Mapping[int, float | None] = field(default_factory=dict)
    worker_cpu: Mapping[int, float | None] = field(default_factory=dict)
    host_cpu: Mapping[str, tuple[float, float] | None] = field(default_factory=dict)
    # Per waiting rank whose loader started workers in the window: the starts' share of its
    # steps' time, the seconds each took, and their time over its data wait
    # (:attr:`RankStats.loader_start_share` and kin).
    loader_starts: Mapping[int, Restarts] = field(default_factory=dict)


@dataclass(frozen=True)
class Restarts:
    """A loader's workers started anew in the window: the starts' share of the rank's steps'
    time, the seconds each took, and their time over the rank's data wait."""

    share: float
    each_s: float
    of_wait: float


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
    # Its host, its loading's cost (what the report says of it: the verdict and its figures,
    # or what was not measured) and whether the host's available memory was measured.
    host: str = ""
    cost: LoadingCost | None = None
    memory_measured: bool = True
    # Where its workers' starts at every epoch are most of its wait (the fix is
    # ``persistent_workers`` alone): those starts.
    restarts: Restarts | None = None


@dataclass(frozen=True)
class Wait:
    """The worst-starved rank's data wait per step against its step (at its pace:
    :meth:`Snapshot.ready`)."""

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
    is assumed to make loading. Where no speed-up is predicted: the peers whose collective wait
    was not measured (``blind``), and the most removing the data wait could give (``at_most``)."""

    ranks: Mapping[int, StarvedRank]
    worst: Wait
    peers: PeersWait | None
    cheaper_factor: float
    blind: tuple[int, ...] = ()
    at_most: float | None = None


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    # At each rank's pace: with workers, the mean step and wait over their rounds of arrivals.
    stats = snapshot.ready(t.min_steps)
    wait_ratio = {r: s.data_wait_ratio for r, s in stats.items()}
    waiting = {
        r: s
        for r, s in stats.items()
        if (wait_ratio[r] >= t.min_wait_ratio and s.data_wait_s >= t.min_wait_s)
        # Workers started at every epoch: a wait once an epoch that a step's medians miss.
        or (s.loader_start_share or 0.0) >= t.min_wait_ratio
    }
    if not waiting:
        return None
    hosts = snapshot.hosts()
    shares = {s.host: fair_share(snapshot, s.host) for s in waiting.values()}
    cost = {
        r: loading_cost(snapshot, s, io_bound_share=t.io_bound_share, share=shares[s.host])
        for r, s in waiting.items()
    }
    memory = {r: _worker_memory(s) for r, s in waiting.items()}
    on_hosts = [r for h in shares for r in hosts.get(h, ()) if r in stats]
    return Inputs(
        wait_ratio=wait_ratio,
        wait_s={r: s.data_wait_s for r, s in stats.items()},
        step_s={r: s.step_s for r, s in stats.items()},
        local_s={r: s.local_s for r, s in stats.items()},
        work_s={r: _work_s(s) for r, s in stats.items()},
        collective_wait_s={r: s.collective_wait_s for r, s in stats.items()},
        collective_ops={r: s.collective_ops for r, s in stats.items()},
        host={r: s.host for r, s in waiting.items()},
        cost=cost,
        own_cores={r: _own_cores(s, cost[r]) for r, s in waiting.items()},
        worker_bytes={r: m[0] for r, m in memory.items()},
        worker_basis={r: m[1] for r, m in memory.items()},
        num_workers={r: s.loader.num_workers if s.loader else None for r, s in waiting.items()},
        persistent_workers={
            r: s.loader.persistent_workers if s.loader else None for r, s in waiting.items()
        },
        unpinned_cuda={
            r: s.loader is not None and not s.loader.pin_memory and s.device.startswith("cuda")
            for r, s in waiting.items()
        },
        worker_cpu_each={r: s.worker_cpu_each for r, s in waiting.items()},
        host_ranks={h: tuple(hosts.get(h, ())) for h in shares},
        idle_cores={h: _idle_cores(snapshot, h) for h in shares},
        available={h: host_available_bytes(snapshot, h) for h in shares},
        main_cpu={r: stats[r].main_cpu for r in on_hosts},
        worker_cpu={r: stats[r].worker_cpu for r in on_hosts},
        host_cpu={h: snapshot.host_cpu(h) for h in shares},
        loader_starts={
            r: Restarts(s.loader_start_share, s.loader_start_each_s, s.loader_start_of_wait)
            for r, s in waiting.items()
            if s.loader_start_share is not None
            and s.loader_start_each_s is not None
            and s.loader_start_of_wait is not None
        },
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find starved ranks. Ranks on a host ``cpu_oversubscription`` found saturated (its
    findings' ranks, handed over by the engine) get no more CPU-bound workers."""
    oversubscribed = explained.ranks
    starved = [
        r
        for r in i.wait_ratio
        if (i.wait_ratio[r] >= t.min_wait_ratio and i.wait_s[r] >= t.min_wait_s)
        or ((k := _restarts(i, r, t)) is not None and k.share >= t.min_wait_ratio)
    ]
    if not starved:
        return []
    is_starved = set(starved)
    # Peers whose collective wait was not measured: their waiting for the starved ranks is
    # booked as their own work, so neither their pace nor the speed-up can be trusted.
    blind = (
        sorted(r for r in i.wait_ratio if r not in is_starved and i.collective_wait_s[r] is None)
        if len(i.wait_ratio) >= 2
        else []
    )
    # The pace the job would keep without data stalls: the slowest rank's own work.
    seen = _without_blind(list(i.wait_ratio), blind)  # (the starved are never blind)
    job_pace = max(i.work_s[r] for r in seen)
    fed = [i.wait_s[r] for r in i.wait_ratio if r not in is_starved]
    residual = statistics.median(fed) if fed else 0.0

    new_local: dict[int, float] = {}
    upper_local: dict[int, float] = {}
    plans: dict[int, WorkerPlan] = {}
    memory_measured: dict[int, bool] = {}
    per_rank: dict[str, object] = {}
    not_measured: list[str] = []
    kept: dict[int, Restarts] = {}
    for r in sorted(starved):
        restarts = _restarts(i, r, t)
        if restarts is not None:
            kept[r] = restarts
            per_rank[str(r)] = {
                "data_wait_ms": round(i.wait_s[r] * 1e3, 1),
                "step_ms": round(i.step_s[r] * 1e3, 1),
                "data_wait_ratio": round(i.wait_ratio[r], 3),
                "num_workers": i.num_workers[r],
                "loader_start_share": round(restarts.share, 3),
                "loader_start_each_ms": round(restarts.each_s * 1e3, 1),
                "loader_start_of_wait": round(restarts.of_wait, 3),
                "speedup_basis": WORKERS_KEPT,
            }
            continue
        host = i.host[r]
        cost = i.cost[r]
        wait_s, local_s, work_s = i.wait_s[r], i.local_s[r], i.work_s[r]
        on_host = sum(1 for q in i.host_ranks[host] if q in is_starved)
        idle = i.idle_cores[host]
        free = None if idle is None else idle / max(1, on_host) + i.own_cores[r]
        memory = memory_room(
            i.worker_bytes[r],
            i.worker_basis[r],
            i.available[host],
            starved_on_host=on_host,
            memory_share=t.memory_share,
        )
        plan = worker_plan(
            wait_s, work_s, cost, job_pace, free, memory, margin=t.margin, max_workers=t.max_workers
        )
        if plan.workers is not None and r in oversubscribed and cost.kind != IO:
            plan = WorkerPlan(None, plan.wanted, None, 0.0)  # the host has no CPU to give
        if plan.workers is None:
            new_wait = cheaper_wait(wait_s, work_s, cost, t.cheaper_factor)
            basis = CHEAPER_LOADING
        else:
            # Even a fed rank waits a little per batch (hand-off from the workers): the peers'
            # median wait, where there are unstarved peers, is the floor of what a fix reaches.
            new_wait = max(plan.expected_wait_s, min(residual, wait_s))
            basis = WORKERS_KEEP_UP
        new_local[r] = max(0.0, local_s - wait_s + new_wait)
        upper_local[r] = max(0.0, local_s - wait_s + min(residual, wait_s))
        plans[r] = plan
        memory_measured[r] = memory is not None
        if cost.kind == UNKNOWN:
            not_measured.append(LOADING_CPU)
        if memory is None and plan.workers is not None:
            not_measured.append(HOST_MEMORY)
        each = i.worker_cpu_each[r]
        per_rank[str(r)] = {
            "data_wait_ms": round(wait_s * 1e3, 1),
            "step_ms": round(i.step_s[r] * 1e3, 1),
            "data_wait_ratio": round(i.wait_ratio[r], 3),
            "load_per_batch_ms": round(cost.load_s * 1e3, 1),
            "num_workers": i.num_workers[r],
            "recommended_workers": plan.workers,
            "workers_needed": plan.wanted,
            "limited_by": plan.limit if plan.capped else None,
            "worker_cpu_each": None if each is None else round(each, 2),
            "free_cores": None if free is None else round(free, 2),
            "loading": cost.evidence(),
            "memory": None if memory is None else memory.evidence(),
            "expected_wait_ms": round(new_wait * 1e3, 1),
            "speedup_basis": basis,
        }
    evidence: dict[str, object] = {"job_pace_ms": round(job_pace * 1e3, 1), "per_rank": per_rank}
    peers = _peer_waits(i, is_starved)
    if peers:
        evidence["peers_collective_wait_ms"] = peers
    at_most = _barrier(i, seen).speedup(upper_local)
    speedup: float | None
    predicted_range: tuple[float, float] | None = None
    if not plans:
        # Every starved rank's wait is its workers' starts: kept, their time is gone from the
        # run (the slowest rank's share: the others wait for it at each epoch's first step).
        speedup = max(1.0 / max(1e-9, 1.0 - k.share) for k in kept.values())
        evidence["speedup_model"] = WORKERS_KEPT
    elif blind:
        speedup = None
        not_measured.insert(0, COLLECTIVE_WAIT)
        evidence["speedup_model"] = NOT_PREDICTED
    else:
        barrier = _barrier(i, list(i.wait_ratio))
        speedup = barrier.speedup(new_local)
        bound = _host_bound(i, is_starved, plans, t.cheaper_factor)
        if bound is not None:
            evidence["host_bound"] = bound.evidence()
            after, before = barrier.step_s(new_local), barrier.step_s()
            # The host's cores bound the point; the busy cores no rank explains may stay busy
            # or not: the range reaches down to the step with them.
            point = max(after, bound.step_s(others=False))
            if point > after > 0:
                speedup = max(1.0, before / point)
            low = max(1.0, before / bound.step_s())
            if low < speedup:
                predicted_range = (low, speedup)
    if kept and plans and speedup is not None:
        speedup = max(speedup, *(1.0 / max(1e-9, 1.0 - k.share) for k in kept.values()))
    if not_measured:
        evidence["not_measured"] = not_measured

    worst = max(starved, key=lambda r: i.wait_ratio[r])
    ranks = {r: _starved_rank(i, r, plans[r], memory_measured[r]) for r in sorted(plans)}
    ranks |= {r: _restarting_rank(i, r, k) for r, k in kept.items()}
    ranks = dict(sorted(ranks.items()))
    facts = Facts(
        ranks=ranks,
        worst=Wait(worst, i.wait_s[worst], i.step_s[worst], i.wait_ratio[worst]),
        peers=_peers_wait(i, is_starved, max(t.min_wait_s, 0.25 * i.wait_s[worst])),
        cheaper_factor=t.cheaper_factor,
        blind=tuple(blind),
        at_most=at_most if blind else None,
    )
    severity = severity_for(speedup)
    if severity == "info" and i.wait_ratio[worst] >= t.warn_wait_ratio:
        severity = "warning"  # a clear wait is worth a look whatever could not be predicted
    return [
        Finding(
            kind=KIND,
            severity=severity,
            ranks=tuple(sorted(starved)),
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
            predicted_range=predicted_range,
            fixes=tuple(fix for r, rank in ranks.items() for fix in _fixes(r, rank, speedup)),
        )
    ]


def _fixes(r: int, rank: StarvedRank, speedup: float | None) -> list[Fix]:
    """A starved rank's changes: its workers (or cheaper loading where none fit) and the loader
    settings to turn on; where its wait is its workers' starts, keeping them."""
    answers = (KIND,)
    if rank.restarts is not None:
        fixes = [Fix("persistent_workers", r, False, True, speedup, answers)]
        if rank.set_pin_memory:
            fixes.append(Fix("pin_memory", r, False, True, speedup, answers))
        return fixes
    if rank.workers is None:
        fixes = [Fix("loading_cost", r, speedup=speedup, answers=answers)]
    else:
        fixes = [Fix("num_workers", r, rank.num_workers, rank.workers, speedup, answers)]
    if rank.set_pin_memory:
        fixes.append(Fix("pin_memory", r, False, True, speedup, answers))
    if rank.set_persistent_workers:
        fixes.append(Fix("persistent_workers", r, False, True, speedup, answers))
    return fixes


def _work_s(s: RankStats) -> float:
    """A rank's own work per step apart from waiting for data or for its peers (never 0: the
    worker plan divides by it)."""
    return max(1e-6, own_work(s))


def _idle_cores(snapshot: Snapshot, host: str) -> float | None:
    cpu = snapshot.host_cpu(host)
    return None if cpu is None else max(0.0, cpu[0] - cpu[1])


def _own_cores(s: RankStats, cost: LoadingCost) -> float:
    """The cores a rank's loading uses now: its workers', or the main thread's loading (which
    moves to the workers)."""
    if cost.workers == 0:
        return 0.0 if s.data_cpu_s is None or s.step_s <= 0 else s.data_cpu_s / s.step_s
    if s.worker_cpu is not None:
        return s.worker_cpu
    return float(cost.workers)  # unmeasured: assume each current worker keeps a core busy


def _worker_memory(s: RankStats) -> tuple[float, str]:
    """One worker's memory and its basis: the workers' RSS, else the main process's (at most
    what a forked worker holds); 0 where neither was measured."""
    if s.worker_rss_each:
        return s.worker_rss_each, WORKERS_RSS
    main = s.main_rss_bytes or s.rss_bytes
    return (main or 0.0), MAIN_RSS


def _host_bound(
    i: Inputs, starved: set[int], plans: Mapping[int, WorkerPlan], cheaper_factor: float
) -> HostBound | None:
    """The tightest :class:`HostBound` of the starved ranks' hosts: a fed rank does as much CPU
    work per step as its fed peers on those hosts do now (:func:`work_cpu`), its loading costs
    the CPU per step it was measured to (a cheaper loading its share of it), and what else
    keeps the host busy stays. A host cannot do more CPU-seconds a second than it has
    cores, however well its ranks are fed: where the workers' CPU and a rank that computes
    again outgrow the cores that sat idle while it waited, the step is at least this long.
    None where a figure it needs was not measured (no host sample, no fed peer's CPU there)."""
    fed = {
        r: work_cpu(cpu, i.step_s[r], i.work_s[r])
        for r, cpu in i.main_cpu.items()
        if r not in starved and cpu is not None and i.step_s[r] > 0
    }
    if not fed:
        return None
    work = statistics.median(fed.values())
    bounds = []
    for host, cpu in i.host_cpu.items():
        if cpu is None:
            continue
        cores, busy = cpu
        ranks = i.host_ranks.get(host, ())
        need = explained = longest = cpu_loading = 0.0
        loaders = 0
        for q in ranks:
            main, workers = i.main_cpu.get(q), i.worker_cpu.get(q)
            if main is None:
                break
            explained += main + (workers or 0.0)
            if q not in starved:
                need += fed[q]
                longest = max(longest, fed[q])
                continue
            loading = i.cost[q].cpu_s
            if loading is None:
                break
            plan = plans[q].workers
            if plan is None:
                loading /= cheaper_factor  # today's loaders, cheaper
            elif i.cost[q].kind != IO:
                cpu_loading += loading  # on ``plan`` workers that each want a core
                loaders += plan
            need += work + loading
            longest = max(longest, work)
        else:
            others = max(0.0, busy - explained)
            if need > 0 and cores > 0:
                bounds.append(
                    HostBound(host, need, cores, others, len(ranks), longest, cpu_loading, loaders)
                )
    return max(bounds, key=lambda b: b.step_s(), default=None)


def _without_blind(ranks: list[int], blind: list[int]) -> list[int]:
    if not blind:
        return ranks
    kept = [r for r in ranks if r not in blind]
    return kept or ranks


def _barrier(i: Inputs, ranks: list[int]) -> Barrier:
    """The barrier model over ``ranks``: their local times, and the least any of them waited at
    the collectives (0 where none was measured)."""
    waits = [w for w in (i.collective_wait_s[r] for r in ranks) if w is not None]
    return Barrier({r: i.local_s[r] for r in ranks}, min(waits) if waits else 0.0)


def _peer_waits(i: Inputs, starved: set[int]) -> dict[str, object]:
    """The unstarved ranks' collective wait per step, with its operations where reported."""
    out: dict[str, object] = {}
    for r in sorted(i.wait_ratio):
        if r in starved:
            continue
        wait = i.collective_wait_s[r]
        row: dict[str, object] = {"total": None if wait is None else round(wait * 1e3, 1)}
        ops = i.collective_ops[r]
        if ops:
            row["ops"] = {op: round(w * 1e3, 1) for op, w in sorted(ops.items())}
        out[str(r)] = row
    return out


def _peers_wait(i: Inputs, starved: set[int], min_s: float) -> PeersWait | None:
    """The unstarved ranks' median collective wait for the starved, where measured and at least
    ``min_s`` (less is the collectives' own cost, not waiting for the starved)."""
    peers = [r for r in i.wait_ratio if r not in starved and i.collective_wait_s[r]]
    if not peers:
        return None
    wait = statistics.median(i.collective_wait_s[r] or 0.0 for r in peers)
    if wait < min_s:
        return None
    totals: dict[str, float] = {}
    for r in peers:
        for op, w in (i.collective_ops[r] or {}).items():
            totals[op] = totals.get(op, 0.0) + w
    ops = tuple(op for op, w in sorted(totals.items(), key=lambda kv: -kv[1]) if w > 0)
    return PeersWait(tuple(sorted(peers)), wait, ops)


def _starved_rank(i: Inputs, r: int, plan: WorkerPlan, memory_measured: bool) -> StarvedRank:
    """What the fix of a starved rank changes: its workers and its loader settings."""
    cost = i.cost[r]
    current = i.num_workers[r]
    persistent = i.persistent_workers[r]
    set_persistent = current is not None and (plan.workers or current) > 0 and not persistent
    return StarvedRank(
        num_workers=current,
        workers=plan.workers,
        limited_by=plan.limit if plan.capped else None,
        loading=cost.kind,
        loading_cores=cost.cores,
        set_pin_memory=i.unpinned_cuda[r],
        set_persistent_workers=set_persistent,
        host=i.host[r],
        cost=cost,
        memory_measured=memory_measured,
    )


def _restarts(i: Inputs, r: int, t: Thresholds) -> Restarts | None:
    """The worker starts that make most of a starved rank's wait (:attr:`Thresholds.restart_share`)
    where its loader does not keep its workers; None otherwise."""
    starts = i.loader_starts.get(r)
    if starts is None or i.persistent_workers.get(r) is not False:
        return None
    if not i.num_workers.get(r) or starts.of_wait < t.restart_share:
        return None
    return starts


def _restarting_rank(i: Inputs, r: int, restarts: Restarts) -> StarvedRank:
    """A rank starved by its workers' starts: its workers stay as many, kept across epochs."""
    workers = i.num_workers[r] or 0
    kept = WorkerPlan(workers, workers, None, 0.0)
    return replace(_starved_rank(i, r, kept, True), restarts=restarts)


RULE = Rule(
    kind=KIND,
    place=20,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=("cpu_oversubscription",),
)
