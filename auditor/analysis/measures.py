"""Measures shared by several rules: computed from the snapshot's reductions, decided by none.

A rule module imports these, never another rule module: what two rules both measure (peer
medians, the GPUs with enough samples, DataParallel's chunking and GPU order, memory fits, the
memory_imbalance finding two rules emit) lives here once.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.samples import DeviceSample, RankInfo, StepSample

from .devices import DeviceStats, linear_fit
from .findings import Finding
from .fixes import Fix
from .snapshot import RankView, Snapshot
from .stats import WEIGHT_CAP, RankStats, weighted_median

# Evidence code: the finding predicts no speed-up (the report words why, per rule).
NOT_PREDICTED = "not_predicted"


def ready(stats: Mapping[int, RankStats], min_steps: int) -> dict[int, RankStats]:
    """Ranks with at least ``min_steps`` steps in the window; rules stay silent on the rest.
    (:meth:`Snapshot.ready` is the same, kept per snapshot: what the rules call.)"""
    return {r: s for r, s in stats.items() if s.steps >= min_steps and s.step_s > 0}


def own_work(s: RankStats) -> float:
    """A rank's own work per step: its local time less its data wait (data_starvation's). That
    is its phases *and* its time in no phase (``StepSample.other_s``: the loop's own code
    between forward and backward or after the step, a metric, a debug check, a host-side
    transform): work its peers wait for all the same."""
    return max(0.0, s.local_s - s.data_wait_s)


def other_work(snapshot: Snapshot, ranks: Iterable[int]) -> dict[int, float]:
    """Each of ``ranks``' own work per step in no phase (``StepSample.other_s``: the loop's own
    code), as the rank statistics take every phase: the median over the window's steps, each
    weighted by its duration (capped at ``WEIGHT_CAP`` times the median step). Taken from the
    steps, not as :func:`own_work` less the phases: medians of separate figures do not add
    up, and on a noisy host their difference names the wrong phase. Kept per snapshot and
    ranks (shared, do not change it)."""
    wanted = tuple(sorted(ranks))
    return snapshot.kept(("other_work", wanted), lambda: _other_work(snapshot, wanted))


def mean_own_work(snapshot: Snapshot, ranks: Iterable[int]) -> dict[int, float]:
    """Each of ``ranks``' own work per step as a plain mean over the window's steps (step less
    data wait less collective wait, weighted by ``count``): the figure the whole window adds
    up to. On a busy host ranks take turns being late, and the medians of step and wait can
    then make one look slower by a margin its total time does not show; a straggler is past
    its peers in the sum as well. Kept per snapshot and ranks (shared, do not change it)."""
    wanted = tuple(sorted(ranks))
    return snapshot.kept(("mean_own_work", wanted), lambda: _mean_own_work(snapshot, wanted))


def _mean_own_work(snapshot: Snapshot, ranks: Sequence[int]) -> dict[int, float]:
    views = snapshot.view_of
    out: dict[int, float] = {}
    for r in ranks:
        view = views.get(r)
        steps = view.steps if view is not None else ()
        n = sum(s.count for s in steps)
        if n:
            total = sum(
                (s.step_s - s.data_wait_s - (s.collective_wait_s or 0.0)) * s.count for s in steps
            )
            out[r] = total / n
    return out


def _other_work(snapshot: Snapshot, ranks: Sequence[int]) -> dict[int, float]:
    views = snapshot.view_of
    out: dict[int, float] = {}
    for r in ranks:
        view = views.get(r)
        steps = view.steps if view is not None else ()
        if not steps:
            continue
        if len(steps) == 1:
            out[r] = steps[0].other_s
            continue
        cap = WEIGHT_CAP * statistics.median(s.step_s for s in steps)
        weights = [min(s.step_s, cap) * s.count for s in steps]
        out[r] = weighted_median([s.other_s for s in steps], weights)
    return out


# The median absolute deviation times this estimates the standard deviation of normal noise.
MAD_SCALE = 1.4826


def robust_spread(values: Iterable[float]) -> float:
    """The spread of ``values`` robust to the outliers a rule looks for: the median absolute
    deviation from their median, scaled to read as a standard deviation (0.0 under two
    values). A few spikes, or one straggler among eight ranks, do not move it."""
    xs = [float(v) for v in values]
    if len(xs) < 2:
        return 0.0
    middle = statistics.median(xs)
    return MAD_SCALE * float(statistics.median(abs(x - middle) for x in xs))


# The phases of a step as the straggler rules compare them: the exclusive phases, then the
# rank's own work in none of them (``other``: the loop's own code).
WORK_PHASES = ("h2d", "forward", "backward", "optimizer", "other")


@dataclass(frozen=True)
class TypicalStep:
    """A rank's typical step over the window: the plain median over its steps of each figure,
    each step counting once (the rank statistics weigh steps by their duration, so a rank that
    stalls now and then, a checkpoint every few steps, reads there as slower in every figure).
    ``phases_s`` in :data:`WORK_PHASES` order; ``wait_s`` None where no step measured it."""

    step_s: float
    local_s: float
    work_s: float
    wait_s: float | None
    phases_s: tuple[float, ...]


def typical_steps(snapshot: Snapshot, ranks: Iterable[int]) -> dict[int, TypicalStep]:
    """Each of ``ranks``' typical step over the snapshot's window (kept per snapshot and ranks:
    shared, do not change it). A rank without steps in the window has none."""
    wanted = tuple(sorted(ranks))
    return snapshot.kept(("typical_steps", wanted), lambda: _typical(snapshot, wanted))


def _typical(snapshot: Snapshot, ranks: Sequence[int]) -> dict[int, TypicalStep]:
    views = snapshot.view_of
    out: dict[int, TypicalStep] = {}
    for r in ranks:
        view = views.get(r)
        if view is None or not view.steps:
            continue
        steps = view.steps
        if len(steps) == 1:  # one (serve's mean) step: its figures are the medians
            out[r] = _one_typical(steps[0])
            continue
        waits = [s.collective_wait_s for s in steps if s.collective_wait_s is not None]
        local = [s.step_s - (s.collective_wait_s or 0.0) for s in steps]
        work = [max(0.0, x - s.data_wait_s) for x, s in zip(local, steps, strict=True)]
        phases = (
            [s.h2d_s for s in steps],
            [s.forward_s for s in steps],
            [s.backward_s for s in steps],
            [s.optimizer_s for s in steps],
            [max(0.0, w - s.compute_s) for w, s in zip(work, steps, strict=True)],
        )
        out[r] = TypicalStep(
            step_s=float(statistics.median(s.step_s for s in steps)),
            local_s=max(0.0, float(statistics.median(local))),
            work_s=float(statistics.median(work)),
            wait_s=float(statistics.median(waits)) if waits else None,
            phases_s=tuple(float(statistics.median(p)) for p in phases),
        )
    return out


def _one_typical(s: StepSample) -> TypicalStep:
    local = s.step_s - (s.collective_wait_s or 0.0)
    work = max(0.0, local - s.data_wait_s)
    return TypicalStep(
        step_s=float(s.step_s),
        local_s=max(0.0, float(local)),
        work_s=float(work),
        wait_s=None if s.collective_wait_s is None else float(s.collective_wait_s),
        phases_s=(s.h2d_s, s.forward_s, s.backward_s, s.optimizer_s, max(0.0, work - s.compute_s)),
    )


def with_peers_work(
    local_s: Mapping[int, float], work_s: Mapping[int, float], ranks: Collection[int]
) -> dict[int, float]:
    """The local times of ``ranks`` if each one's own work (:func:`own_work`, per rank in
    ``work_s``) were its unnamed peers' median: the what-if of a fix to their compute, whose
    data wait stays (a rule that took the peers' whole local time credited that fix with
    removing the data wait too)."""
    peers = {q: v for q, v in work_s.items() if q not in ranks}
    out: dict[int, float] = {}
    for r in ranks:
        median = peer_median(peers, r)
        if median is not None:
            out[r] = local_s[r] - max(0.0, work_s[r] - median)
    return out


def peer_median(values: Mapping[int, float], rank: int) -> float | None:
    """Median of every value but ``rank``'s (None without peers); for one rank. To ask for every
    rank, build :class:`PeerMedians` once: this is O(n) per call."""
    peers = [v for r, v in values.items() if r != rank]
    return float(statistics.median(peers)) if peers else None


class PeerMedians:
    """The median of each key's peers (every other key's value), for all keys in O(n log n).

    Rules compare every rank with its peers; doing that with a fresh median per rank is
    quadratic and took seconds at 4,096 ranks. Values are sorted once; a key's peer median is the
    median of that order without the key's own element, read off by index. ``None`` values are
    not measurements and count for nobody.
    """

    def __init__(self, values: Mapping[Any, float | None]) -> None:
        self._values = {k: float(v) for k, v in values.items() if v is not None}
        order = self._sorted = sorted(self._values.values())
        self._whole = float(statistics.median(order)) if order else None
        # Without one element at sorted position i, the median of the other m is one of at most
        # three values, set by where i falls against the middle: worked out once, not per key.
        m = self._m = len(order) - 1
        k = m // 2
        if m <= 0:
            self._below = self._at = self._above = 0.0
            self._first_at = self._last_at = 0
        elif m % 2:
            self._below, self._above = order[k + 1], order[k]
            self._at = 0.0
            self._first_at, self._last_at = k + 1, k  # (no position is "at")
        else:
            self._below = (order[k] + order[k + 1]) / 2
            self._at = (order[k - 1] + order[k + 1]) / 2
            self._above = (order[k - 1] + order[k]) / 2
            self._first_at = self._last_at = k

    def least(self) -> float | None:
        """The least any key's peer median can be (None where no key has peers): a rule that
        needs a value some multiple of its peers' median screens every key against it first,
        and asks :meth:`get` only of the few past it."""
        if self._m <= 0:
            return None
        if self._first_at > self._last_at:  # (m odd: no position is "at")
            return min(self._below, self._above)
        return min(self._below, self._at, self._above)

    def get(self, key: object) -> float | None:
        """Median of the values of every key but ``key`` (all of them if ``key`` has none)."""
        value = self._values.get(key)
        if value is None:
            return self._whole
        if self._m <= 0:
            return None
        # Removing any element equal to the key's value leaves the same multiset.
        i = bisect.bisect_left(self._sorted, value)
        if i < self._first_at:
            return self._below
        if i > self._last_at:
            return self._above
        return self._at


def measured_gpus(snapshot: Snapshot, min_samples: int) -> dict[str, DeviceStats]:
    """The snapshot's GPUs still on the bus with at least ``min_samples`` samples (kept per
    snapshot: five rules ask; shared, do not change it)."""
    return snapshot.kept(
        ("measured_gpus", min_samples),
        lambda: {
            u: d for u, d in snapshot.gpu_stats.items() if not d.lost and d.samples >= min_samples
        },
    )


def dp_gpu_order(
    info: RankInfo, owned: Sequence[str], dstats: Mapping[str, DeviceStats]
) -> list[str]:
    """A DataParallel rank's GPUs in ``device_ids`` order: the primary first.

    The rank's own ``device_uuids`` give the order; without them its GPUs are ordered by node
    and NVML index (CUDA's default order on a node of identical GPUs).
    """
    if info.device_uuids:
        return list(info.device_uuids)

    def key(u: str) -> tuple[str, int, str]:
        d = dstats.get(u)
        return (d.node, d.index, u) if d else ("", 1 << 30, u)

    return sorted(owned, key=key)


def torch_chunks(batch: int, n: int) -> list[int]:
    """Chunk sizes of ``torch.chunk`` (DataParallel's scatter): ``ceil(batch / n)`` each, the last
    smaller; fewer than ``n`` chunks when the batch is small, the missing GPUs get nothing."""
    if batch <= 0 or n <= 0:
        return [0] * max(n, 0)
    size = math.ceil(batch / n)
    out: list[int] = []
    left = batch
    while left > 0 and len(out) < n:
        out.append(min(size, left))
        left -= out[-1]
    return out + [0] * (n - len(out))


def heavy(
    values: Mapping[Any, float | None], min_ratio: float, min_extra: float
) -> dict[Any, float]:
    """Keys whose value is at least ``min_ratio`` x and ``min_extra`` above their peers' median.

    Returns each such key's ratio to that median. Needs at least two measured values.
    """
    present = {k: float(v) for k, v in values.items() if v is not None}
    out: dict[Any, float] = {}
    if len(present) < 2:
        return out
    of_peers = PeerMedians(present)
    for k, v in present.items():
        peer = of_peers.get(k) or 0.0
        if peer <= 0:
            continue
        if v >= min_ratio * peer and v - peer >= min_extra:
            out[k] = v / peer
    return out


def peer_median_bytes(values: Mapping[Any, float | None], key: Any) -> float:
    peers = [float(v) for k, v in values.items() if k != key and v is not None]
    return float(statistics.median(peers)) if peers else 0.0


@dataclass(frozen=True)
class GpuMemory:
    """Per GPU (UUID), what a memory finding names it by and says of it: its reference (uuid,
    node, index, model), its label, total memory, peak memory in use and that peak's share of
    the total, and the ranks that own it. Columns: built once per rule, for the GPUs it
    compares."""

    ref: Mapping[str, Mapping[str, Any]]
    label: Mapping[str, str]
    total: Mapping[str, int | None]
    peak: Mapping[str, int | None]
    fill: Mapping[str, float | None]
    owners: Mapping[str, tuple[int, ...]]

    @classmethod
    def of(cls, gpus: Iterable[DeviceStats], owners: Mapping[str, Sequence[int]]) -> GpuMemory:
        gpus = list(gpus)
        return cls(
            ref={d.uuid: d.ref for d in gpus},
            label={d.uuid: d.label for d in gpus},
            total={d.uuid: d.mem_total_bytes for d in gpus},
            peak={d.uuid: d.mem_used_max_bytes for d in gpus},
            fill={d.uuid: d.mem_ratio_max for d in gpus},
            owners={d.uuid: tuple(owners.get(d.uuid, ())) for d in gpus},
        )


def imbalance_finding(
    named: str,
    gpus: GpuMemory,
    compared: Iterable[str],
    mem: Mapping[str, float | None],
    *,
    ranks: tuple[int, ...],
    facts: object,
    near_full: float,
    fixes: Sequence[Fix] = (),
    cause: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Finding:
    """A ``memory_imbalance`` finding naming GPU ``named`` against the ``compared`` GPUs (their
    memory ``mem``), with the calling rule's ``facts`` and ``fixes`` (each rule words its own).

    Shared with ``dataparallel_gather``, which names GPU 0 of a DataParallel job this way.
    """
    peer = peer_median_bytes(mem, named)
    own = mem.get(named)
    full = gpus.fill[named]
    severity = "warning" if full is not None and full >= near_full else "info"
    ref = gpus.ref
    evidence: dict[str, Any] = {
        "gpus": [ref[named]],
        "per_gpu": {
            u: {
                **ref[u],
                "ranks": list(gpus.owners[u]),
                "mem_used_bytes": None if mem.get(u) is None else round(float(mem[u] or 0)),
                "mem_total_bytes": gpus.total[u],
                "mem_used_max_bytes": gpus.peak[u],
            }
            for u in sorted(compared, key=lambda u: (ref[u]["node"], ref[u]["index"]))
        },
        "peer_median_bytes": round(peer),
        "ratio_to_peers": None if own is None or peer <= 0 else round(float(own) / peer, 2),
        "excess_bytes": None if own is None else round(float(own) - peer),
        "speedup_model": NOT_PREDICTED,
    }
    evidence.update(extra or {})
    return Finding(
        kind="memory_imbalance",
        severity=severity,
        ranks=ranks,
        facts=facts,
        evidence=evidence,
        predicted_speedup=None,
        cause=cause,
        fixes=tuple(fixes),
        gpus=(named,),
    )


@dataclass(frozen=True)
class MemoryFit:
    """``memory = fixed + per_sample * batch (+ overhead)`` for one rank."""

    rank: int
    fixed_bytes: float
    per_sample_bytes: float
    r2: float
    points: int
    batches: tuple[int, ...]
    source: str
    # NVML's peak minus the fitted allocator peak (context, cache); 0 where not measured.
    overhead_bytes: float = 0.0

    def predict(self, batch: float) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch + self.overhead_bytes

    def largest_batch(self, budget: float, per_sample_factor: float = 1.0) -> int | None:
        """The largest batch whose predicted memory stays within ``budget``."""
        per = self.per_sample_bytes / per_sample_factor
        if per <= 0:
            return None
        return max(0, math.floor((budget - self.fixed_bytes - self.overhead_bytes) / per))

    def evidence(self) -> dict[str, Any]:
        return {
            "fixed_bytes": round(self.fixed_bytes),
            "per_sample_bytes": round(self.per_sample_bytes),
            "r2": round(self.r2, 4),
            "points": self.points,
            "batch_sizes": list(self.batches),
            "source": self.source,
            "overhead_bytes": round(self.overhead_bytes),
        }


def fit_memory(
    view: RankView, gpu: DeviceStats | None, samples: Sequence[DeviceSample] = ()
) -> MemoryFit | None:
    """Fit ``a + b * batch`` for one rank; None without two distinct batch sizes.

    ``gpu`` and ``samples`` are the rank's (heaviest) GPU and its NVML samples, if any.
    """
    # Against the micro-batch: under gradient accumulation one micro-batch's activations are
    # alive at a time (the step's batch without accumulation).
    sized = [s for s in view.steps if s.batch_size]
    for field in ("mem_peak_bytes", "mem_allocated_bytes"):
        pts = [
            (float(s.micro_batch_size or 0), float(v))
            for s in sized
            if (v := getattr(s, field)) is not None
        ]
        fit = _fit(view.info.rank, pts, f"probe {field}")
        if fit is not None:
            if gpu is not None and gpu.mem_used_max_bytes is not None:
                top = max(b for b, _ in pts)
                gap = gpu.mem_used_max_bytes - fit.predict(top)
                if gap > 0:
                    fit = _with_overhead(fit, gap)
            return fit
    if not samples or not sized:
        return None
    ordered = sorted(sized, key=lambda s: s.time)
    ends = [s.time for s in ordered]
    matched: list[tuple[float, float]] = []
    for d in samples:
        if d.mem_used_bytes is None or d.lost:
            continue
        i = bisect.bisect_left(ends, d.time)
        if i >= len(ordered) or (i == 0 and d.time < ends[0] - ordered[0].step_s):
            continue  # before the first step or after the last: no batch in progress
        matched.append((float(ordered[i].micro_batch_size or 0), float(d.mem_used_bytes)))
    return _fit(view.info.rank, matched, "nvml mem_used_bytes")


def latest_micro_batch(view: RankView | None) -> tuple[int | None, int]:
    """The rank's latest batch in the unit memory grows with and the user sets: the micro-batch
    (the step's batch without accumulation), and the micro-batches of that step; (None, 1)
    where no step had a known batch."""
    if view is not None:
        for s in reversed(view.steps):
            if s.batch_size:
                return round(s.micro_batch_size or 0) or None, max(1, s.micro_batches)
    return None, 1


def _fit(rank: int, pts: Sequence[tuple[float, float]], source: str) -> MemoryFit | None:
    batches = sorted({round(b) for b, _ in pts})
    if len(batches) < 2:
        return None
    fit = linear_fit([b for b, _ in pts], [m for _, m in pts])
    if fit is None:
        return None
    a, b, r2 = fit
    return MemoryFit(rank, a, b, r2, len(pts), tuple(batches), source)


def _with_overhead(fit: MemoryFit, overhead: float) -> MemoryFit:
    return MemoryFit(
        fit.rank,
        fit.fixed_bytes,
        fit.per_sample_bytes,
        fit.r2,
        fit.points,
        fit.batches,
        fit.source,
        overhead,
    )


def rank_memory_fits(
    snapshot: Snapshot, *, min_steps: int, min_samples: int
) -> dict[int, tuple[MemoryFit, DeviceStats | None]]:
    """Each ready rank's fit and its (heaviest) GPU, for the ranks that have a fit;
    memory_pressure and memory_headroom both read it (kept per snapshot: shared, do not change
    it). The only measure here that reads raw GPU samples: memory against the batch in progress
    when each was read."""
    return snapshot.kept(
        ("rank_memory_fits", min_steps, min_samples),
        lambda: _rank_memory_fits(snapshot, min_steps, min_samples),
    )


def _rank_memory_fits(
    snapshot: Snapshot, min_steps: int, min_samples: int
) -> dict[int, tuple[MemoryFit, DeviceStats | None]]:
    stats = snapshot.ready(min_steps)
    dstats = measured_gpus(snapshot, min_samples)
    gpus_of = snapshot.gpus_of
    samples_of: dict[str, list[DeviceSample]] = {}
    for d in snapshot.devices:
        samples_of.setdefault(d.uuid, []).append(d)
    out: dict[int, tuple[MemoryFit, DeviceStats | None]] = {}
    for view in snapshot.ranks:
        r = view.info.rank
        if r not in stats:
            continue
        if len(view.steps) < 2 and not samples_of:
            # One step sample (serve's window mean) and no GPU reads: not two batch sizes.
            continue
        mine = [dstats[u] for u in gpus_of.get(r, ()) if u in dstats]
        gpu = max(mine, key=lambda d: d.mem_used_max_bytes or 0, default=None)
        samples = samples_of.get(gpu.uuid, []) if gpu is not None else []
        fit = fit_memory(view, gpu, samples)
        if fit is not None:
            out[r] = (fit, gpu)
    return out
