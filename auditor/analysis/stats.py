"""Per-rank metrics computed once per snapshot; the rules decide on these.

Medians, not means: on a shared machine a single descheduled step must not move a verdict.
Step figures are medians weighted by step duration: a job's cost is wall time, so 200 slow
steps that took 30 s outweigh 250 fast ones that took 7 s (an unweighted median would call
that job fast, and a fault that started midway would vanish from the verdict). A step's weight
is capped at ``WEIGHT_CAP`` times the plain median step, so one long stall (a checkpoint save,
an evaluation) counts like a few slow steps and never decides alone.

The pace of a rank whose DataLoader has ``w >= 2`` workers is a mean, not a median: workers that
cannot keep up deliver their batches in rounds of ``w`` (started together, they finish
together), so its steps alternate one long wait with ``w - 1`` short steps, and any median lands
on one kind of step, never on the pace (a real job: 2 workers, 200 ms a batch, steps of 36 ms
and 165 ms; the duration-weighted median said 155 ms, the pace is 100 ms). ``mean_step_s``,
``mean_data_wait_s`` and ``mean_collective_wait_s`` average each round of ``w`` consecutive
steps (one batch from each worker) and take the duration-weighted median of those rounds: the
mean within a round, where the bursts are; the median across rounds, so a rare outlier (an
evaluation, a checkpoint save) moves one round's mean and still cannot decide alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any, Protocol

from auditor.samples import LoaderConfig, ProcessCpu, RankInfo, StepSample

from .frozen import from_columns


class RankSamples(Protocol):
    """One rank's samples in a window (:class:`auditor.analysis.snapshot.RankView`; a protocol
    so this module imports no snapshot, which imports it)."""

    @property
    def info(self) -> RankInfo: ...

    @property
    def steps(self) -> Sequence[StepSample]: ...

    @property
    def cpu(self) -> Sequence[ProcessCpu]: ...


def local_time(step_s: float, collective_wait_s: float | None) -> float:
    """A rank's own work per step: the step less its wait for its peers (an unmeasured wait
    counts as work)."""
    return max(0.0, step_s - (collective_wait_s or 0.0))


@dataclass(frozen=True)
class RankStats:
    """Robust per-rank figures over a window (seconds per step unless named otherwise)."""

    rank: int
    host: str
    device: str
    steps: int
    step_s: float
    data_wait_s: float
    h2d_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    # Median wait at the gradient all-reduce; None where the probe could not measure it.
    collective_wait_s: float | None
    # Local work apart from data and waits: h2d + forward + backward + optimizer (exclusive
    # phases; read through StepSample.compute_s, so older recordings convert alike).
    compute_s: float
    batch_size: float | None
    main_cpu: float | None
    worker_cpu: float | None
    workers: int
    loader: LoaderConfig | None
    rss_bytes: float | None
    mem_allocated_bytes: float | None
    mem_peak_bytes: float | None
    # CPU seconds the main thread spent during the data wait (median per step; None: not
    # measured). With num_workers=0 this is the loading's CPU cost per batch.
    data_cpu_s: float | None = None
    # Median collective wait per step by operation (an op absent from a step counts 0 there);
    # None where no step reported its operations.
    collective_ops: Mapping[str, float] | None = field(default=None, compare=False)
    # Mean RSS of the rank's DataLoader workers together (node agent, psutil; shared pages
    # counted in each), and of its main process; None where never sampled.
    worker_rss_bytes: float | None = None
    main_rss_bytes: float | None = None
    # The pace per step: step, data wait and collective wait averaged over each round of the
    # loader's ``w`` workers (``w`` consecutive steps), the duration-weighted median over the
    # rounds (see the module docstring). The medians themselves where ``w <= 1`` (no rounds)
    # and where a window is one sample (already a mean); None where not computed (a RankStats
    # built by hand): the medians stand in (:meth:`paced`).
    mean_step_s: float | None = None
    mean_data_wait_s: float | None = None
    mean_collective_wait_s: float | None = None
    # ``collective_ops`` at the same pace (rounds' means by operation); None where not computed.
    mean_collective_ops: Mapping[str, float] | None = field(default=None, compare=False)
    # Mean time the main thread, and the DataLoader workers together, spent runnable but
    # waiting for a core, in seconds a second (node agent, the kernel's run-queue delay); None
    # where not measured.
    main_wait: float | None = None
    worker_wait: float | None = None
    # Starting DataLoader workers over the window (``StepSample.loader_start_s``): the share
    # of the steps' time it took and the seconds each start took (the mean over the starts);
    # None where no step started any (a persistent loader after its first epoch, serve).
    loader_start_share: float | None = None
    loader_start_each_s: float | None = None
    # The starts' time over the window's data wait (their first batches' waits are in it; the
    # iterators' creation is not, so it may pass 1).
    loader_start_of_wait: float | None = None
    # Time per step the rank spends on its own work, i.e. not waiting for its peers: derived
    # (step minus collective wait) and kept, as every rule's what-if arithmetic reads it for
    # every rank, several times (a property was 30,000 calls an evaluation at 4,096 ranks).
    local_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "local_s", local_time(self.step_s, self.collective_wait_s))

    def paced(self) -> RankStats:
        """These figures with the step, data wait and collective wait per step taken at the
        rank's pace (the ``mean_*`` figures): what a loader with workers that cannot keep up is
        judged by. The same figures where no mean was computed."""
        if self.mean_step_s is None:
            return self
        data = self.data_wait_s if self.mean_data_wait_s is None else self.mean_data_wait_s
        wait = (
            self.collective_wait_s
            if self.mean_collective_wait_s is None
            else self.mean_collective_wait_s
        )
        ops = self.collective_ops if self.mean_collective_ops is None else self.mean_collective_ops
        if (self.mean_step_s, data, wait, ops) == (
            self.step_s,
            self.data_wait_s,
            self.collective_wait_s,
            self.collective_ops,
        ):
            # The pace is the median (steady steps, no workers, a serve window): no copy, which
            # cost 16 us a rank, 67 ms at 4,096 ranks.
            return self
        return replace(
            self,
            step_s=self.mean_step_s,
            data_wait_s=data,
            collective_wait_s=wait,
            collective_ops=ops,
        )

    # Median micro-batches per step (gradient accumulation: DataLoader batches per optimizer
    # step); ``batch_size`` stays samples per step. 1 without accumulation.
    micro_batches: float = 1.0

    @property
    def accumulated(self) -> int:
        """Micro-batches per step as a whole number (1 without accumulation)."""
        return max(1, round(self.micro_batches))

    @property
    def micro_batch_size(self) -> float | None:
        """Samples per micro-batch: the DataLoader's batch, the unit the user sets and the one
        batch advice speaks in (the batch size itself without accumulation)."""
        if self.batch_size is None or self.micro_batches <= 1:
            return self.batch_size
        return self.batch_size / self.micro_batches

    @property
    def data_wait_ratio(self) -> float:
        return self.data_wait_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def busy_ratio(self) -> float:
        """Share of the step spent computing (the analogue of device busy time)."""
        return min(1.0, self.compute_s / self.step_s) if self.step_s > 0 else 0.0

    @property
    def wait_ratio(self) -> float:
        if self.collective_wait_s is None or self.step_s <= 0:
            return 0.0
        return min(1.0, self.collective_wait_s / self.step_s)

    @property
    def samples_per_s(self) -> float | None:
        if self.batch_size is None or self.step_s <= 0:
            return None
        return self.batch_size / self.step_s

    @property
    def compute_per_sample_s(self) -> float | None:
        if not self.batch_size:
            return None
        return self.compute_s / self.batch_size

    @property
    def worker_cpu_each(self) -> float | None:
        """Mean CPU (cores) of one DataLoader worker, where workers were seen."""
        if self.worker_cpu is None or self.workers <= 0:
            return None
        return self.worker_cpu / self.workers

    @property
    def worker_wait_each(self) -> float | None:
        """Mean run-queue wait (seconds a second) of one DataLoader worker, where measured."""
        if self.worker_wait is None or self.workers <= 0:
            return None
        return self.worker_wait / self.workers

    @property
    def worker_rss_each(self) -> float | None:
        """Mean RSS of one DataLoader worker (an upper bound: shared pages count in each)."""
        if self.worker_rss_bytes is None or self.workers <= 0:
            return None
        return self.worker_rss_bytes / self.workers

    def collective_ops_order(self) -> tuple[str, ...]:
        """The operations the rank waited in, largest first (``("all_gather",
        "ddp_allreduce")``); empty where none was reported."""
        return collective_ops_order([self])


def collective_ops_order(stats: Iterable[RankStats]) -> tuple[str, ...]:
    """The operations these ranks waited in, the largest wait (summed over the ranks) first:
    ``("all_gather", "ddp_allreduce")``; empty where none was reported. What a finding says its
    waiting ranks wait in."""
    return ops_order(s.collective_ops for s in stats)


def is_object_op(op: str) -> bool:
    """An object collective: every rank pickles its object and unpickles everyone's, so its
    time is serialisation as much as transfer (and its bytes are not known)."""
    return op.endswith(("_object", "_object_list"))


def object_ops_floor(per_rank: Iterable[Mapping[str, float] | None]) -> float:
    """The least any rank spends a step in object collectives (each rank's sum over them; a
    rank without them: 0): what every rank pays for them, whoever waits for whom."""
    return min(
        (sum(w for op, w in (ops or {}).items() if is_object_op(op)) for ops in per_rank),
        default=0.0,
    )


def ops_order(per_rank: Iterable[Mapping[str, float] | None]) -> tuple[str, ...]:
    """:func:`collective_ops_order` of the ranks' ``collective_ops`` themselves."""
    totals: dict[str, float] = {}
    for ops in per_rank:
        for op, wait in (ops or {}).items():
            totals[op] = totals.get(op, 0.0) + wait
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple(name for name, wait in ranked if wait > 0)


def collective_ops_ms(stats: Mapping[int, RankStats]) -> dict[str, dict[str, float]]:
    """Evidence: each rank's median collective wait per step by operation, in ms (ranks that
    reported no operations left out)."""
    return {
        str(r): {op: round(w * 1e3, 1) for op, w in sorted(s.collective_ops.items())}
        for r, s in sorted(stats.items())
        if s.collective_ops
    }


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
    """The value at half of the total weight (lower median on an exact tie); 0.0 when empty."""
    pairs = sorted(zip(values, weights, strict=True))
    if pairs and min(weights) <= 0:
        pairs = [(v, w) for v, w in pairs if w > 0]
    if not pairs:
        return median(values)
    half = sum(weights if len(pairs) == len(values) else [w for _, w in pairs]) / 2
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= half:
            return float(v)
    return float(pairs[-1][0])


WEIGHT_CAP = 5.0


def _wmed(steps: Sequence[Any], field: str, cap: float) -> float | None:
    """The duration-weighted median of ``field`` over step samples (or rounds of them); None
    where none has it."""
    if not steps:
        return None
    if len(steps) == 1:  # one (possibly aggregated) sample: its value is the median
        value = getattr(steps[0], field)
        return None if value is None else float(value)
    # A sample standing for several steps (their mean) weighs as much as those steps together.
    # Called for a dozen fields a rank on every live verdict: the loops stay in C where they can.
    values = list(map(attrgetter(field), steps))
    weights = [min(s.step_s, cap) * s.count for s in steps]
    if None in values:
        kept = [(v, w) for v, w in zip(values, weights, strict=True) if v is not None]
        if not kept:
            return None
        values, weights = [v for v, _ in kept], [w for _, w in kept]
    return weighted_median(values, weights)


def median_or_none(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _ops_median(steps: Sequence[Any], cap: float) -> dict[str, float] | None:
    """Per-operation weighted median wait over the steps that reported their operations."""
    rows = [s for s in steps if s.collective_ops is not None]
    if not rows:
        return None
    names = sorted({name for s in rows for name in s.collective_ops or {}})
    weights = [min(s.step_s, cap) * s.count if len(rows) > 1 else 1.0 for s in rows]
    return {
        name: weighted_median(
            [float((s.collective_ops or {}).get(name, 0.0)) for s in rows], weights
        )
        for name in names
    }


@dataclass(frozen=True)
class _Round:
    """The mean of consecutive steps (one round of the loader's workers), as a sample of
    ``count`` steps for :func:`_wmed`."""

    step_s: float
    data_wait_s: float
    collective_wait_s: float | None
    # Mean wait by operation over the steps that reported theirs; None where none did.
    collective_ops: Mapping[str, float] | None
    count: int


def _rounds(steps: Sequence[StepSample], workers: int) -> list[_Round]:
    """The steps in rounds of ``workers`` consecutive steps (counted by ``count``), each round
    their mean. The oldest steps that fill no round are left out; all of them make one round
    where they fill none."""
    out: list[_Round] = []
    group: list[StepSample] = []
    n = 0
    for s in reversed(steps):  # newest first: a partial round is the oldest
        group.append(s)
        n += s.count
        if n >= workers:
            out.append(_round(group))
            group, n = [], 0
    if group and not out:
        out.append(_round(group))
    out.reverse()
    return out


def _round(group: Sequence[StepSample]) -> _Round:
    n = sum(s.count for s in group)
    waits = [(s.collective_wait_s, s.count) for s in group if s.collective_wait_s is not None]
    rows = [s for s in group if s.collective_ops is not None]
    ops: dict[str, float] | None = None
    if rows:
        total = sum(s.count for s in rows)
        ops = {}
        for s in rows:
            for name, wait in (s.collective_ops or {}).items():
                ops[name] = ops.get(name, 0.0) + float(wait) * s.count / total
    return _Round(
        step_s=sum(s.step_s * s.count for s in group) / n,
        data_wait_s=sum(s.data_wait_s * s.count for s in group) / n,
        collective_wait_s=sum(w * c for w, c in waits) / sum(c for _, c in waits)
        if waits
        else None,
        collective_ops=ops,
        count=n,
    )


def _loader_workers(view: RankSamples) -> int:
    """The rank's DataLoader workers: its setting, else the most the node agent saw."""
    loader = view.info.loader
    if loader is not None:
        return loader.num_workers
    return max((c.workers for c in view.cpu), default=0)


def _paces(steps: Sequence[StepSample], workers: int, medians: tuple[Any, ...]) -> tuple[Any, ...]:
    """``mean_step_s``, ``mean_data_wait_s``, ``mean_collective_wait_s``,
    ``mean_collective_ops``: the duration-weighted median over rounds of ``workers`` steps of
    each round's mean; ``medians`` (the step, data wait, collective wait and per-operation
    medians) where there are no rounds (``workers <= 1``)."""
    rounds = _rounds(steps, workers) if workers > 1 else []
    if not rounds:
        return medians
    # The weight cap as for steps: a round holding an evaluation counts like a few slow ones.
    cap = WEIGHT_CAP * median([r.step_s for r in rounds])
    return (
        _wmed(rounds, "step_s", cap) or 0.0,
        _wmed(rounds, "data_wait_s", cap) or 0.0,
        _wmed(rounds, "collective_wait_s", cap),
        _ops_median(rounds, cap),
    )


def rank_stats(view: RankSamples) -> RankStats:
    steps = view.steps
    if len(steps) == 1:
        return _one_sample_stats(view, steps[0])
    cap = WEIGHT_CAP * median([s.step_s for s in steps]) if steps else 0.0
    step_s = _wmed(steps, "step_s", cap) or 0.0
    data_wait_s = _wmed(steps, "data_wait_s", cap) or 0.0
    collective_wait_s = _wmed(steps, "collective_wait_s", cap)
    collective_ops = _ops_median(steps, cap)
    mean_step_s, mean_data_wait_s, mean_collective_wait_s, mean_collective_ops = _paces(
        steps, _loader_workers(view), (step_s, data_wait_s, collective_wait_s, collective_ops)
    )
    return RankStats(
        rank=view.info.rank,
        host=view.info.host,
        device=view.info.device,
        steps=sum(s.count for s in steps),
        step_s=step_s,
        data_wait_s=data_wait_s,
        h2d_s=_wmed(steps, "h2d_s", cap) or 0.0,
        forward_s=_wmed(steps, "forward_s", cap) or 0.0,
        backward_s=_wmed(steps, "backward_s", cap) or 0.0,
        optimizer_s=_wmed(steps, "optimizer_s", cap) or 0.0,
        collective_wait_s=collective_wait_s,
        compute_s=_wmed(steps, "compute_s", cap) or 0.0,
        batch_size=_wmed(steps, "batch_size", cap),
        loader=view.info.loader,
        rss_bytes=median_or_none([s.rss_bytes for s in steps]),
        mem_allocated_bytes=median_or_none([s.mem_allocated_bytes for s in steps]),
        mem_peak_bytes=median_or_none([s.mem_peak_bytes for s in steps]),
        data_cpu_s=_wmed(steps, "data_cpu_s", cap),
        collective_ops=collective_ops,
        micro_batches=_wmed(steps, "micro_batches", cap) or 1.0,
        **_cpu_stats(view),
        **_loader_starts(steps),
        mean_step_s=mean_step_s,
        mean_data_wait_s=mean_data_wait_s,
        mean_collective_wait_s=mean_collective_wait_s,
        mean_collective_ops=mean_collective_ops,
    )


def rank_stats_from_columns(
    *,
    rank: Sequence[int],
    host: Sequence[str],
    device: Sequence[str],
    loader: Sequence[LoaderConfig | None],
    steps: Sequence[int],
    step_s: Sequence[float],
    data_wait_s: Sequence[float],
    h2d_s: Sequence[float],
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    optimizer_s: Sequence[float],
    collective_wait_s: Sequence[float | None],
    batch_size: Sequence[float | None],
    micro_batches: Sequence[float],
    rss_bytes: Sequence[float | None],
    mem_allocated_bytes: Sequence[float | None],
    mem_peak_bytes: Sequence[float | None],
    cpu_sampled: Sequence[bool],
    main_cpu: Sequence[float | None],
    worker_cpu: Sequence[float | None],
    workers: Sequence[int],
    main_rss_bytes: Sequence[float | None],
    mean_step_s: Sequence[float] | None = None,
    mean_data_wait_s: Sequence[float] | None = None,
    mean_collective_wait_s: Sequence[float | None] | None = None,
    data_cpu_s: Sequence[float | None] | None = None,
    collective_ops: Sequence[Mapping[str, float] | None] | None = None,
    worker_rss_bytes: Sequence[float | None] | None = None,
) -> list[RankStats]:
    """Many ranks' statistics at once, column-wise (one sequence per field, one value per rank):
    the twin of :func:`rank_stats` for figures reduced elsewhere, ``auditor serve``'s window
    figures from Prometheus. The same construction rules, so both paths give equal statistics
    (tested against :func:`rank_stats` of the same window as one sample):

    * ``steps`` is each rank's steps in the window; a rank with none (0) has the figures of an
      empty window whatever its step columns say (0 s, None, one micro-batch);
    * ``cpu_sampled`` says whether a node agent sampled the rank; one that never did has no
      CPU figures (None, no workers) whatever its CPU columns say;
    * derived here: ``compute_s`` (h2d + forward + backward + optimizer), ``local_s``; counts
      and bytes become floats, as the reduction of samples gives them;
    * the pace (``mean_*``): the figures themselves where not given, as for a window of one
      sample: a figure per window (total / steps) is a mean already;
    * what is not given (``data_cpu_s``, ``collective_ops``, ``worker_rss_bytes``) is None:
      not measured.

    Built without each instance's ``__init__`` (:func:`~.frozen.from_columns`): the rebuild of
    4,096 ranks spent most of its time there.
    """
    count = len(rank)
    stepped = [n > 0 for n in steps]
    # The usual window: every rank stepped, and was sampled; the columns are then taken whole
    # (built in C), not rank by rank.
    all_stepped, all_sampled = all(stepped), all(cpu_sampled)

    def stepping(values: Sequence[Any], otherwise: Any) -> list[Any]:
        """A statistic over the window's steps: ``otherwise`` for a rank with none."""
        if all_stepped and len(values) == count:
            return list(values)
        return [v if ok else otherwise for v, ok in zip(values, stepped, strict=True)]

    def stepping_floats(values: Sequence[float | None]) -> list[float | None]:
        if all_stepped and len(values) == count and None not in values:
            return list(map(float, values))  # type: ignore[arg-type]
        return [
            None if not ok or v is None else float(v) for v, ok in zip(values, stepped, strict=True)
        ]

    def sampled(values: Sequence[Any], otherwise: Any) -> list[Any]:
        if all_sampled and len(values) == count:
            return list(values)
        return [v if ok else otherwise for v, ok in zip(values, cpu_sampled, strict=True)]

    nones: list[Any] = [None] * count
    step_f, data_f = stepping(step_s, 0.0), stepping(data_wait_s, 0.0)
    wait_f = stepping(collective_wait_s, None)
    phases = zip(h2d_s, forward_s, backward_s, optimizer_s, strict=True)
    compute = [(a + b + c + d) or 0.0 for a, b, c, d in phases]
    return from_columns(
        RankStats,
        {
            "rank": rank,
            "host": host,
            "device": device,
            "steps": stepping(steps, 0),
            "step_s": step_f,
            "data_wait_s": data_f,
            "h2d_s": stepping(h2d_s, 0.0),
            "forward_s": stepping(forward_s, 0.0),
            "backward_s": stepping(backward_s, 0.0),
            "optimizer_s": stepping(optimizer_s, 0.0),
            "collective_wait_s": wait_f,
            "compute_s": stepping(compute, 0.0),
            "mean_step_s": step_f if mean_step_s is None else stepping(mean_step_s, 0.0),
            "mean_data_wait_s": data_f
            if mean_data_wait_s is None
            else stepping(mean_data_wait_s, 0.0),
            "mean_collective_wait_s": wait_f
            if mean_collective_wait_s is None
            else stepping(mean_collective_wait_s, None),
            "batch_size": stepping_floats(batch_size),
            "rss_bytes": stepping_floats(rss_bytes),
            "mem_allocated_bytes": stepping_floats(mem_allocated_bytes),
            "mem_peak_bytes": stepping_floats(mem_peak_bytes),
            "loader": loader,
            "data_cpu_s": nones if data_cpu_s is None else stepping(data_cpu_s, None),
            "collective_ops": nones if collective_ops is None else stepping(collective_ops, None),
            "mean_collective_ops": nones
            if collective_ops is None
            else stepping(collective_ops, None),
            "main_cpu": sampled(main_cpu, None),
            # Worker CPU where workers were seen (as over samples: only those that saw some).
            "worker_cpu": [
                c if ok and n else None
                for c, n, ok in zip(worker_cpu, workers, cpu_sampled, strict=True)
            ],
            "workers": sampled(workers, 0),
            "worker_rss_bytes": nones
            if worker_rss_bytes is None
            else [
                r if ok and n else None
                for r, n, ok in zip(worker_rss_bytes, workers, cpu_sampled, strict=True)
            ],
            "main_rss_bytes": list(map(float, main_rss_bytes))  # type: ignore[arg-type]
            if all_sampled and len(main_rss_bytes) == count and None not in main_rss_bytes
            else [
                None if not ok or r is None else float(r)
                for r, ok in zip(main_rss_bytes, cpu_sampled, strict=True)
            ],
            "micro_batches": list(map(float, micro_batches))
            if all_stepped and len(micro_batches) == count
            else [float(m) if ok else 1.0 for m, ok in zip(micro_batches, stepped, strict=True)],
            "local_s": list(map(local_time, step_f, wait_f)),
        },
    )


def _one_sample_stats(view: RankSamples, s: StepSample) -> RankStats:
    """A window of one sample (``auditor serve`` rebuilds each rank's window as its mean): its
    figures are the medians. The same values as the general path, without its per-field
    median machinery, which cost most of the rules' time at 4,096 ranks."""
    ops = (
        None
        if s.collective_ops is None
        else {name: float(s.collective_ops[name]) for name in sorted(s.collective_ops)}
    )
    return RankStats(
        rank=view.info.rank,
        host=view.info.host,
        device=view.info.device,
        steps=s.count,
        step_s=_float(s.step_s) or 0.0,
        data_wait_s=_float(s.data_wait_s) or 0.0,
        h2d_s=_float(s.h2d_s) or 0.0,
        forward_s=_float(s.forward_s) or 0.0,
        backward_s=_float(s.backward_s) or 0.0,
        optimizer_s=_float(s.optimizer_s) or 0.0,
        collective_wait_s=_float(s.collective_wait_s),
        compute_s=_float(s.compute_s) or 0.0,
        batch_size=_float(s.batch_size),
        loader=view.info.loader,
        rss_bytes=_float(s.rss_bytes),
        mem_allocated_bytes=_float(s.mem_allocated_bytes),
        mem_peak_bytes=_float(s.mem_peak_bytes),
        data_cpu_s=_float(s.data_cpu_s),
        collective_ops=ops,
        micro_batches=float(s.micro_batches),
        **_cpu_stats(view),
        # One sample is a mean already (``auditor serve``: total / steps over the window).
        mean_step_s=_float(s.step_s) or 0.0,
        mean_data_wait_s=_float(s.data_wait_s) or 0.0,
        mean_collective_wait_s=_float(s.collective_wait_s),
        mean_collective_ops=ops,
    )


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _loader_starts(steps: Sequence[StepSample]) -> dict[str, Any]:
    """The window's worker starts (:attr:`RankStats.loader_start_share`,
    ``loader_start_each_s`` and ``loader_start_of_wait``); nothing where none started."""
    starts = [s.loader_start_s for s in steps if s.loader_start_s]
    total = sum(s.step_s * s.count for s in steps)
    if not starts or total <= 0:
        return {}
    started = sum(starts)
    waited = sum(s.data_wait_s * s.count for s in steps)
    return {
        "loader_start_share": min(1.0, started / total),
        "loader_start_each_s": started / len(starts),
        "loader_start_of_wait": started / waited if waited > 0 else math.inf,
    }


def _cpu_stats(view: RankSamples) -> dict[str, Any]:
    """The rank's CPU figures over the window: means of the node agent's samples."""
    cpu = view.cpu
    main = [c.main_cpu for c in cpu if c.main_cpu is not None]
    workers = [c.worker_cpu_total for c in cpu if c.workers]
    worker_rss = [c.worker_rss_bytes for c in cpu if c.workers and c.worker_rss_bytes is not None]
    main_rss = [c.rss_bytes for c in cpu if c.rss_bytes is not None]
    main_wait = [c.main_wait for c in cpu if c.main_wait is not None]
    worker_wait = [c.worker_wait for c in cpu if c.workers and c.worker_wait is not None]
    return {
        "main_wait": statistics.fmean(main_wait) if main_wait else None,
        "worker_wait": statistics.fmean(worker_wait) if worker_wait else None,
        "main_cpu": statistics.fmean(main) if main else None,
        # Mean worker CPU over samples that saw workers; None if never seen.
        "worker_cpu": statistics.fmean(workers) if workers else None,
        "workers": max((c.workers for c in cpu), default=0),
        "worker_rss_bytes": statistics.fmean(worker_rss) if worker_rss else None,
        "main_rss_bytes": statistics.fmean(main_rss) if main_rss else None,
    }
