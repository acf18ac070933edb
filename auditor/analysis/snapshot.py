"""The snapshot: a time window of rank and node samples, the one input every rule judges.

Both paths build it: the live path (`auditor run`: node actors -> :class:`SampleStore`) and, later,
the operator path (PromQL -> snapshot). Nothing here does I/O or reads a clock: the caller says
what "now" is.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from operator import attrgetter
from typing import Any, TypeVar

from auditor.samples import (
    Batch,
    DeviceSample,
    FlopCount,
    MemoryBudget,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)

from .accounting import Account, RunTotals, account, with_gpu_memory
from .devices import DeviceStats, owners_of, rank_gpus, reduce_devices, strays_of
from .history import RankHistory
from .stats import RankStats, rank_stats

_T = TypeVar("_T")


@dataclass(frozen=True)
class RankView:
    """One rank's samples inside the window."""

    info: RankInfo
    steps: tuple[StepSample, ...]
    cpu: tuple[ProcessCpu, ...] = ()
    ended: bool = False
    # The latest memory budget the rank measured (any time up to the window's end), if any.
    memory: MemoryBudget | None = None
    # The latest FLOPs per step the rank counted (any time up to the window's end), if any.
    flops: FlopCount | None = None

    @property
    def step_count(self) -> int:
        """Steps in the window (a sample rebuilt from counters stands for several)."""
        return sum(s.count for s in self.steps)


@dataclass
class Snapshot:
    """Rank and node samples over ``[start, end]`` (wall-clock seconds), and what the rules read:
    the samples reduced once (``stats``, ``gpu_stats``, ``owners``, ...).

    Not frozen: the reductions are ``cached_property``s, computed on first use and kept. Nothing
    else changes a snapshot once built.
    """

    job: str
    start: float
    end: float
    ranks: tuple[RankView, ...]
    nodes: tuple[NodeCpu, ...] = ()
    # GPU samples (NVML, or a recording) inside the window, every device of every node.
    devices: tuple[DeviceSample, ...] = ()
    # Per-GPU figures over the window computed elsewhere, for GPUs with no samples above: the
    # operator path has Prometheus compute them (quantile_over_time, deriv, ...) instead of
    # shipping every sample. Rules read neither field: both reach them as ``gpu_stats``.
    gpus: tuple[DeviceStats, ...] = ()
    # Total steps seen per rank over the whole run, not only the window (for the report).
    total_steps: dict[int, int] = field(default_factory=dict)
    # Each rank's account of its whole run (``accounting``), where the store could make one.
    accounts: dict[int, Account] = field(default_factory=dict)
    # Per-rank statistics computed elsewhere, equal to what reducing ``ranks`` gives (tested):
    # ``auditor serve`` builds them from Prometheus' columns along with the ranks
    # (:func:`~.stats.rank_stats_from_columns`) instead of reducing each rank's samples again.
    # None: ``stats`` reduces ``ranks`` on first use.
    precomputed_stats: dict[int, RankStats] | None = field(default=None, repr=False, compare=False)
    # Each rank's whole run as series over steps, bounded (:mod:`.history`): what the rules that
    # judge the run over time read (memory that climbs, a rank that turned slow). Empty where
    # the source keeps no history (serve's Prometheus windows).
    history: dict[int, RankHistory] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def stats(self) -> dict[int, RankStats]:
        """Per-rank robust statistics over the window, computed once per snapshot (or given:
        ``precomputed_stats``)."""
        if self.precomputed_stats is not None:
            return self.precomputed_stats
        return {view.info.rank: rank_stats(view) for view in self.ranks}

    @cached_property
    def paced(self) -> dict[int, RankStats]:
        """Each rank's statistics with the step, data wait and collective wait at its pace
        (:meth:`RankStats.paced`): what the rank tables show, so a rank's row and a finding's
        figures agree where a loader's workers deliver in bursts (the median step lands on
        one kind of step there, never on the pace)."""
        return {r: s.paced() for r, s in self.stats.items()}

    @cached_property
    def gpu_stats(self) -> dict[str, DeviceStats]:
        """Per-GPU figures over the window by UUID, one shape for both paths: the raw samples
        reduced here (live path) and the figures Prometheus reduced (``gpus``, serve)."""
        return reduce_devices(self.devices, self.gpus)

    @cached_property
    def gpus_in_place(self) -> list[tuple[str, DeviceStats]]:
        """``gpu_stats`` in node and index order (the order findings about GPUs come in)."""
        return sorted(self.gpu_stats.items(), key=lambda kv: (kv[1].node, kv[1].index))

    @cached_property
    def view_of(self) -> dict[int, RankView]:
        """Each rank's view by rank (shared, do not change it)."""
        return {v.info.rank: v for v in self.ranks}

    @cached_property
    def most_steps(self) -> int:
        """The most steps any rank took in the window (0 without ranks): each rank's statistics
        count its view's steps (``RankStats.steps`` is ``RankView.step_count``)."""
        return max(map(attrgetter("steps"), self.stats.values()), default=0)

    @cached_property
    def owners(self) -> dict[str, tuple[int, ...]]:
        """Every GPU (by UUID) mapped to the ranks that own it (see :mod:`.devices`)."""
        return owners_of([v.info for v in self.ranks], self.devices, self.gpus)

    @cached_property
    def gpus_of(self) -> dict[int, tuple[str, ...]]:
        """Each rank's GPUs (UUIDs): the inverse of ``owners``."""
        return rank_gpus(self.owners)

    @cached_property
    def strays(self) -> dict[str, dict[int, int | None]]:
        """Ranks with a process on a GPU they do not own: ``{uuid: {rank: bytes or None}}``."""
        return strays_of([v.info for v in self.ranks], self.devices, self.owners)

    @property
    def world_size(self) -> int:
        sizes = [v.info.world_size for v in self.ranks]
        return max(sizes) if sizes else 0

    @property
    def parallel_mode(self) -> str:
        modes = {v.info.parallel_mode for v in self.ranks}
        for mode in ("ddp", "fsdp", "deepspeed", "dataparallel"):
            if mode in modes:
                return mode
        return "none"

    @cached_property
    def nodes_by_host(self) -> dict[str, list[NodeCpu]]:
        """Node CPU samples grouped by host (one pass, not one per host)."""
        out: dict[str, list[NodeCpu]] = {}
        for n in self.nodes:
            out.setdefault(n.host, []).append(n)
        return out

    def node_cpu(self, host: str) -> NodeCpu | None:
        """The latest node CPU sample of ``host`` in the window (None if never sampled)."""
        return max(self.nodes_by_host.get(host, ()), key=lambda n: n.time, default=None)

    def host_cpu(self, host: str) -> tuple[float, float] | None:
        """``(cores, busy cores)`` of a host over the window; busy is the median sample, so
        start-up and shut-down do not dilute a saturated steady state. None if never sampled."""
        samples = self.nodes_by_host.get(host, [])
        if not samples:
            return None
        busy = statistics.median(n.busy_cores for n in samples)
        return max(samples, key=lambda n: n.time).cores, busy

    def hosts(self) -> dict[str, list[int]]:
        """Ranks grouped by host (computed once per snapshot: shared, do not change it)."""
        return self._hosts

    @cached_property
    def _hosts(self) -> dict[str, list[int]]:
        # Several rules and the reports ask; at 4,096 ranks each grouping cost ~3 ms.
        out: dict[str, list[int]] = {}
        for v in self.ranks:
            out.setdefault(v.info.host, []).append(v.info.rank)
        return out

    def ready(self, min_steps: int) -> dict[int, RankStats]:
        """Ranks with at least ``min_steps`` steps in the window (and a step time): the ones the
        rules judge, at their pace (:attr:`paced`): the pace is chosen here once, so every rule
        and every table read the same figures. Kept per ``min_steps`` (shared, do not change
        it): most rules ask, with the same threshold, and each filtering of 4,096 ranks cost
        ~1 ms."""
        return self.kept(
            ("ready", min_steps),
            lambda: {r: s for r, s in self.paced.items() if s.steps >= min_steps and s.step_s > 0},
        )

    def kept(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """``make()``, computed once per snapshot and ``key``: a measure several rules read with
        the same thresholds (the key names the measure and its thresholds). The result is
        shared: do not change it."""
        try:
            return self._kept[key]
        except KeyError:
            out = self._kept[key] = make()
            return out

    @cached_property
    def _kept(self) -> dict[Hashable, Any]:
        return {}


# Steps of each rank that the live and replayed verdicts skip (see SampleStore.warmup_steps).
WARMUP_STEPS = 5
# Seconds of each rank's first steps that a live verdict also skips: DataLoader workers still
# filling their prefetch queues, allocators and caches still growing. Judged live, a window that
# opens on them raised warnings for a second or two on balanced jobs (a 15% data wait as the
# loader warmed up); the final verdict reads the whole run and skips only WARMUP_STEPS.
LIVE_WARMUP_S = 2.0


class SampleStore:
    """Accumulates :class:`Batch` deliveries and cuts :class:`Snapshot` windows.

    Memory stays bounded: each rank keeps at most ``max_steps_per_rank`` steps and
    ``max_cpu_per_rank`` CPU samples (oldest dropped), so a week-long job costs the same as a
    minute-long one. Step counts and each rank's summed steps over the whole run
    (:class:`~.accounting.RunTotals`, for its account) are kept separately.
    """

    def __init__(
        self,
        job: str = "",
        *,
        max_steps_per_rank: int = 20_000,
        max_cpu_per_rank: int = 3_600,
        on_add: Callable[[Batch], None] | None = None,
        warmup_steps: int = 0,
    ) -> None:
        self.job = job
        self._on_add = on_add  # e.g. a recording writer that keeps everything the store drops
        # A rank's first steps start DataLoader workers, warm caches and allocators: they say
        # nothing about the steady state, and judging them raised false alarms at start-up.
        self.warmup_steps = warmup_steps
        self._infos: dict[int, RankInfo] = {}
        self._steps: dict[int, deque[StepSample]] = {}
        self._cpu: dict[int, deque[ProcessCpu]] = {}
        self._nodes: deque[NodeCpu] = deque(maxlen=max_cpu_per_rank)
        self._devices: dict[str, deque[DeviceSample]] = {}
        self._ended: set[int] = set()
        self._total: dict[int, int] = {}
        self._run: dict[int, RunTotals] = {}
        self._history: dict[int, RankHistory] = {}
        self._memory: dict[int, list[MemoryBudget]] = {}
        self._flops: dict[int, list[FlopCount]] = {}
        self._max_steps = max_steps_per_rank
        self._max_cpu = max_cpu_per_rank

    def add(self, batch: Batch) -> None:
        for info in batch.infos:
            self._infos[info.rank] = info
        for s in batch.steps:
            self._total[s.rank] = self._total.get(s.rank, 0) + 1
            run = self._run.get(s.rank)
            if run is None:
                run = self._run[s.rank] = RunTotals()
            run.add(s)  # the rank's account holds every step, the counted one included
            if s.flops_counted:
                # The probe counted this step's FLOPs, which cost it time (FlopCount.cost_s):
                # neither the window's steps nor the history, so no rule judges that cost.
                continue
            self._steps.setdefault(s.rank, deque(maxlen=self._max_steps)).append(s)
            hist = self._history.get(s.rank)
            if hist is None:
                hist = self._history[s.rank] = RankHistory(s.rank)
            hist.add(s)
        for c in batch.processes:
            self._cpu.setdefault(c.rank, deque(maxlen=self._max_cpu)).append(c)
        self._nodes.extend(batch.nodes)
        for d in batch.devices:
            self._devices.setdefault(d.uuid, deque(maxlen=self._max_cpu)).append(d)
        self._ended.update(batch.ended)
        for m in batch.memory:
            # A budget is sent only when it changes: the few per rank are all kept.
            kept = self._memory.setdefault(m.rank, [])
            kept.append(m)
            kept.sort(key=lambda b: b.time)
            del kept[: -self._max_cpu]
        for f in batch.flops:
            # Counted once after warm-up and again when the input shape changes: few per rank.
            counts = self._flops.setdefault(f.rank, [])
            counts.append(f)
            counts.sort(key=lambda c: c.time)
            del counts[: -self._max_cpu]
        if self._on_add is not None:
            self._on_add(batch)

    def add_all(self, batches: Iterable[Batch]) -> None:
        for b in batches:
            self.add(b)

    @property
    def ranks(self) -> list[int]:
        return sorted(set(self._infos) | set(self._steps))

    @property
    def infos(self) -> dict[int, RankInfo]:
        return dict(self._infos)

    @property
    def ended(self) -> set[int]:
        return set(self._ended)

    def total_steps(self) -> dict[int, int]:
        return dict(self._total)

    def accounts(self) -> dict[int, Account]:
        """Each rank's account of its whole run so far (ranks with neither a step nor both
        ends of their process reported have none)."""
        out: dict[int, Account] = {}
        for rank in self.ranks:
            info = self._infos.get(rank)
            a = account(
                rank,
                self._run.get(rank),
                started_at=info.started_at if info is not None else None,
                ended_at=info.ended_at if info is not None else None,
            )
            if a is not None:
                out[rank] = a
        return out

    def history(self) -> dict[int, RankHistory]:
        """Each rank's run so far as series over steps, warm-up included (frozen copies)."""
        return {r: h.frozen() for r, h in self._history.items()}

    def latest_time(self) -> float | None:
        """The newest sample time seen, the natural "now" for replayed data."""
        times = [d[-1].time for d in self._steps.values() if d]
        times += [d[-1].time for d in self._cpu.values() if d]
        times += [d[-1].time for d in self._devices.values() if d]
        return max(times) if times else None

    def first_time(self) -> float | None:
        times = [d[0].time for d in self._steps.values() if d]
        return min(times) if times else None

    def snapshot(self, now: float, window_s: float | None, *, warmup_s: float = 0.0) -> Snapshot:
        """Samples with ``now - window_s < time <= now``; ``window_s=None`` takes everything.
        ``warmup_s``: each rank's steps that ended within that many seconds of its first step's
        start are left out as well (:data:`LIVE_WARMUP_S`)."""
        start = float("-inf") if window_s is None else now - window_s

        def keep(t: float) -> bool:
            return start < t <= now

        views = []
        for rank in self.ranks:
            info = self._infos.get(rank) or RankInfo(rank=rank, world_size=0)
            run = self._run.get(rank)
            began = run.first_start if run is not None and warmup_s > 0 else None
            settled = float("-inf") if began is None else began + warmup_s
            steps = tuple(
                s
                for s in self._steps.get(rank, ())
                if keep(s.time) and s.step >= self.warmup_steps and s.time > settled
            )
            cpu = tuple(c for c in self._cpu.get(rank, ()) if keep(c.time))
            budgets = [m for m in self._memory.get(rank, ()) if m.time <= now]
            counts = [f for f in self._flops.get(rank, ()) if f.time <= now]
            views.append(
                RankView(
                    info=info,
                    steps=steps,
                    cpu=cpu,
                    ended=rank in self._ended,
                    memory=budgets[-1] if budgets else None,
                    flops=counts[-1] if counts else None,
                )
            )
        nodes = tuple(n for n in self._nodes if keep(n.time))
        devices = tuple(d for q in self._devices.values() for d in q if keep(d.time))
        first = self.first_time()
        lo = start if window_s is not None else (first if first is not None else now)
        snap = Snapshot(
            job=self.job,
            start=lo,
            end=now,
            ranks=tuple(views),
            nodes=nodes,
            devices=devices,
            total_steps=self.total_steps(),
            accounts=self.accounts(),
            history=self.history(),
        )
        if devices and snap.accounts:
            # The GPU memory each rank held while it started up and ended (the window's GPU
            # samples; the final verdict's window is the whole run).
            snap.accounts = with_gpu_memory(
                snap.accounts, self._run, self._infos, snap.gpus_of, devices
            )
        return snap
