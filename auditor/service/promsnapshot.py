"""PromQL answers -> :class:`Snapshot`: the operator path's half of "one snapshot, one rule set".

``auditor serve`` asks Prometheus for window aggregates (:func:`queries`), one instant query per
figure, and this module turns the answers into the snapshot the live path builds from its
actors, per running job. Prometheus does the per-sample work (it holds the samples, in Go); the
service handles one value per series, which is what keeps an evaluation of 4,096 ranks within
its budget (``bench/serve_scale.py``).

* **steps**: the growth of the step, phase and sample counters between the window's first and
  last scrape (:func:`auditor.metrics.promql.growth`, not extrapolated) gives the rank's mean
  step; it becomes one :class:`StepSample` with ``count`` = the steps taken, so the rules
  weigh it as those steps together. This is a window *mean* where the live path takes a
  median of single steps: a few very slow steps weigh more here.
* **rank identity**: ``auditor_rank_info`` and ``auditor_rank_dataloader_info`` labels; the GPUs
  a rank owns from the ``auditor_job``/``rank`` labels the node endpoint put on each GPU's series.
* **CPU and nodes**: window means (median for busy cores, as the live path); memory: medians.
* **GPUs**: :class:`DeviceStats` straight from ``quantile_over_time`` (medians), ``max_over_time``
  (peaks, PCIe), ``deriv`` (memory trend: the least-squares slope the live path fits),
  ``sum_over_time(auditor_gpu_up)`` (samples answered) and ``avg_over_time`` of each throttle
  reason (share of samples; the largest stands for "any reason", a lower bound), in
  :mod:`.promgpus`.

Pure: no I/O and no clock (the caller says what "now" is), so it is tested with hand-written
answers and benchmarked at 4,096 ranks without a Prometheus server. What depends on labels
alone (the ranks and their order, each rank's :class:`RankInfo`, the GPUs' labels and owners)
is kept from one evaluation to the next while the client hands the same label tuples and the
few values it also reads (configured workers, which GPUs answered) are the same: a job's
identity does not change between evaluations, its figures do (:mod:`.kept`; :func:`forget` drops
it).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import attrgetter, is_not, itemgetter, methodcaller
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.analysis.devices import DeviceStats
from auditor.analysis.frozen import from_columns
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.analysis.stats import RankStats, rank_stats_from_columns
from auditor.metrics import catalog as C
from auditor.metrics.query import Vector
from auditor.samples import PHASES, LoaderConfig, NodeCpu, ProcessCpu, RankInfo, StepSample

from .columns import (
    RANK,
    Answers,
    Column,
    Columns,
    as_vector,
    int_label,
    int_label_or_0,
    int_labels,
    optional,
    optional_ints,
    rounded,
)
from .kept import LAST
from .kept import forget as forget
from .promgpus import all_gpus
from .promgpus import gpu_stats as gpu_stats
from .promqueries import MEMORY_KINDS
from .promqueries import queries as queries
from .promqueries import sub_key as sub_key


@dataclass(frozen=True)
class JobWindow:
    """Whether a job is running: a rank reported alive recently."""

    job: str
    running: bool
    last_seen: float


def running_jobs(answers: Answers, now: float, *, stale_after_s: float) -> dict[str, JobWindow]:
    """Jobs with a rank whose latest ``auditor_rank_up`` is 1 and was scraped at most
    ``stale_after_s`` ago. A job whose ranks all ended, or whose endpoints stopped answering,
    is not running."""
    seen_answer = as_vector(answers.get("rank_seen"))
    # NaN or 0: never seen.
    seen_at = np.nan_to_num(seen_answer.values, nan=0.0)
    seen = dict(zip(RANK.all(seen_answer), seen_at.tolist(), strict=True))
    up = as_vector(answers.get("rank_up"))
    keys = RANK.all(up)
    # Each rank's job, and whether it is a rank at all (a job name and a numeric rank).
    jobs = np.array([key[0] for key in keys], dtype=object)
    numbers = map(int_label, map(itemgetter(1), keys))
    ranked = np.fromiter(map(is_not, numbers, repeat(None)), dtype=bool, count=len(keys))
    ranked &= jobs != ""
    at = np.fromiter(map(seen.get, keys, repeat(0.0)), dtype=np.float64, count=len(keys))
    alive = (up.values == 1) & (now - at <= stale_after_s)
    out: dict[str, JobWindow] = {}
    for job in dict.fromkeys(jobs[ranked].tolist()):
        mine = ranked & (jobs == job)
        out[job] = JobWindow(job, bool(alive[mine].any()), float(at[mine].max()))
    return out


def build_snapshots(
    answers: Answers, now: float, window_s: float, *, jobs: Iterable[str] | None = None
) -> dict[str, Snapshot]:
    """One :class:`Snapshot` per job (``jobs``: only these), over ``(now - window_s, now]``.

    Column-wise: the ranks are indexed once, every figure becomes one column over that index
    (:mod:`.columns`), and each kind of object is built from its fields' columns at once
    (:func:`~auditor.analysis.frozen.from_columns`): no Python call per rank and field. The
    statistics the rules read come with each snapshot (``precomputed_stats``), built from the
    same columns by :func:`~auditor.analysis.stats.rank_stats_from_columns`.
    """
    wanted = None if jobs is None else frozenset(jobs)
    layout = _rank_layout(
        as_vector(answers.get("rank_info")), as_vector(answers.get("steps")), wanted
    )
    by_rank = layout.columns

    def col(name: str) -> Column:
        return by_rank.column(as_vector(answers.get(name)))

    gpus, owned = _gpus_and_owners(answers, wanted)
    identity = _identities(
        layout,
        as_vector(answers.get("loader_info")),
        owned,
        col("config_workers"),
    )
    views, stats = _ranks(identity, layout.numbers, now, col)

    # Sorted by job: each job's ranks are one slice of the columns.
    jobs, numbers, hosts = layout.jobs, layout.numbers, identity.hosts
    nodes = _nodes(answers, now)
    out: dict[str, Snapshot] = {}
    for job in dict.fromkeys(jobs):
        first, end = bisect_left(jobs, job), bisect_right(jobs, job)
        hosts_of = set(hosts[first:end])
        out[job] = Snapshot(
            job=job,
            start=now - window_s,
            end=now,
            ranks=tuple(views[first:end]),
            nodes=_job_nodes(nodes, job, hosts_of),
            gpus=gpus.of(job, hosts_of),
            precomputed_stats=dict(zip(numbers[first:end], stats[first:end], strict=True)),
        )
    return out


@dataclass(frozen=True, eq=False)  # kept ones compare by identity
class _RankLayout:
    """The ranks of an evaluation, in index order: by job, then rank number (``keys``: their
    ``(job, rank label)`` keys, ``infos``: their ``auditor_rank_info`` labels by key), and the
    answers' columns over them."""

    keys: list[Any]
    jobs: list[str]
    numbers: list[int]
    infos: dict[Any, Mapping[str, str]]
    columns: Columns


def _rank_layout(rank_info: Vector, steps: Vector, wanted: frozenset[str] | None) -> _RankLayout:
    """The ranks: every (job, rank) with an identity or a step count, in the jobs asked for.
    The same from one evaluation to the next while the answers list the same series (the
    client's shared labels) and the same ranks counted steps: kept (:data:`LAST`)."""
    counted = ~np.isnan(steps.values)
    inputs = (rank_info.labels, steps.labels, wanted, counted)
    kept = LAST.get("ranks", inputs)
    if kept is not None:
        return kept
    infos: dict[Any, Mapping[str, str]] = {
        key: labels
        for key, labels in zip(RANK.all(rank_info), rank_info.labels, strict=True)
        if key[0] and (wanted is None or key[0] in wanted)
    }
    stepped = list(compress(RANK.all(steps), counted.tolist()))
    keys = list(dict.fromkeys([*infos, *(k for k in stepped if wanted is None or k[0] in wanted)]))
    ranked = sorted(
        (key[0], number, key)
        for key, number in zip(keys, int_labels([key[1] for key in keys]), strict=True)
        if number is not None
    )
    index = {key: i for i, (_, _, key) in enumerate(ranked)}
    layout = _RankLayout(
        keys=[key for _, _, key in ranked],
        jobs=[job for job, _, _ in ranked],
        numbers=[rank for _, rank, _ in ranked],
        infos=infos,
        columns=Columns(index, RANK),
    )
    LAST.keep("ranks", inputs, layout)
    return layout


def _owned(
    gpus: Mapping[str, tuple[DeviceStats, str, str]],
) -> dict[tuple[str, str], tuple[tuple[int, ...], tuple[str, ...]]]:
    """The GPUs whose series name a rank, by rank key: their indexes and UUIDs, in index
    order."""
    named = [(job, rank, g.index, uuid) for uuid, (g, job, rank) in gpus.items() if job and rank]
    keys = [(job, rank) for job, rank, _, _ in named]
    owned: dict[tuple[str, str], tuple[tuple[int, ...], tuple[str, ...]]] = {}
    if len(set(keys)) == len(keys):  # the usual job: one GPU a rank, built in C
        indexes = zip([i for _, _, i, _ in named])  # 1-tuples
        uuids = zip([u for _, _, _, u in named])
        owned.update(zip(keys, zip(indexes, uuids, strict=True), strict=True))
        return owned
    for key, (_, _, index, uuid) in zip(keys, named, strict=True):
        had = owned.get(key)
        if had is None:
            owned[key] = ((index,), (uuid,))
        else:
            pairs = sorted([*zip(*had, strict=True), (index, uuid)])
            owned[key] = (tuple(i for i, _ in pairs), tuple(u for _, u in pairs))
    return owned


# ------------------------------------------------------------------------------------------------
# ranks


def _loaders(
    keys: Sequence[Any],
    loaders: Mapping[Any, Mapping[str, str]],
    config_workers: Sequence[float | None],
) -> list[LoaderConfig | None]:
    """Each rank's DataLoader settings (None where no configured worker count was exported);
    ranks with the same settings share one (frozen) object."""
    labels = list(map(loaders.get, keys, repeat(_NO_LABELS)))
    keys = list(
        zip(
            config_workers,
            *(
                map(methodcaller("get", name), labels)
                for name in ("pin_memory", "prefetch_factor", "persistent_workers", "batch_size")
            ),
            strict=True,
        )
    )
    configs: dict[tuple[Any, ...], LoaderConfig | None] = dict.fromkeys(keys)
    for key in configs:
        workers, pin, prefetch, persistent, batch = key
        if workers is not None:
            configs[key] = LoaderConfig(
                num_workers=int(workers),
                pin_memory=pin == "true",
                prefetch_factor=int_label(prefetch),
                persistent_workers=persistent == "true",
                batch_size=int_label(batch),
                drop_last=False,
                sampler="",
            )
    return list(map(configs.__getitem__, keys))


_NO_LABELS: Mapping[str, str] = {}


@dataclass(frozen=True, eq=False)
class _Identities:
    """Each rank's :class:`RankInfo` in index order, and the fields the statistics take from
    it as columns."""

    infos: list[RankInfo]
    hosts: list[str]
    devices: list[str]
    loaders: list[LoaderConfig | None]


def _identities(
    layout: _RankLayout,
    loader_info: Vector,
    owned: Mapping[Any, tuple[tuple[int, ...], tuple[str, ...]]],
    config_workers: Column,
) -> _Identities:
    """:func:`_rank_infos`: kept while its inputs are the same (the ranks, their labels, the
    GPUs they own and their configured workers, which change when a job restarts, not from one
    evaluation to the next)."""
    inputs = (layout, loader_info.labels, owned, config_workers)
    kept = LAST.get("identities", inputs)
    if kept is not None:
        return kept
    loaders = dict(zip(RANK.all(loader_info), loader_info.labels, strict=True))
    infos = _rank_infos(layout, loaders, owned, optional(config_workers))
    found = _Identities(
        infos=infos,
        hosts=list(map(attrgetter("host"), infos)),
        devices=list(map(attrgetter("device"), infos)),
        loaders=list(map(attrgetter("loader"), infos)),
    )
    LAST.keep("identities", inputs, found)
    return found


def _rank_infos(
    layout: _RankLayout,
    loaders: Mapping[Any, Mapping[str, str]],
    owned: Mapping[Any, tuple[tuple[int, ...], tuple[str, ...]]],
    config_workers: Sequence[float | None],
) -> list[RankInfo]:
    """Each rank's identity, from its ``auditor_rank_info`` and dataloader labels and the GPUs
    whose series name it (``owned``: their indexes and UUIDs by rank key)."""
    keys = layout.keys
    n = len(keys)
    labels = list(map(layout.infos.get, keys, repeat(_NO_LABELS)))

    def label(name: str, default: str) -> list[str]:
        return list(map(methodcaller("get", name, default), labels))

    devices = list(map(owned.get, keys, repeat(((), ()))))
    return from_columns(
        RankInfo,
        {
            "rank": layout.numbers,
            "world_size": list(map(int_label_or_0, label("world_size", ""))),
            "local_rank": list(map(int_label_or_0, label("local_rank", ""))),
            "host": label("node", ""),
            "pid": [0] * n,
            "device": label("device", "cpu"),
            "parallel_mode": label("parallel_mode", "none"),
            "devices": list(map(itemgetter(0), devices)),
            "device_uuids": list(map(itemgetter(1), devices)),
            "loader": _loaders(keys, loaders, config_workers),
            "unmeasured": [()] * n,
            "job": layout.jobs,
            "off_thread_collectives": [0] * n,
            "key": [None] * n,
        },
    )


def _ranks(
    identity: _Identities, ranks: list[int], now: float, col: Callable[[str], Column]
) -> tuple[list[RankView], list[RankStats]]:
    """Each rank's view (its mean step over the window, its CPU) and the statistics the rules
    read, which :func:`auditor.analysis.stats.rank_stats` would reduce that view to, built from
    the same columns at once (:func:`auditor.analysis.stats.rank_stats_from_columns`).

    A rank's mean step: ``n`` steps took ``dt`` seconds; no step sample where none finished in
    the window. Its CPU: a rank with any CPU series was seen by a node agent.
    """
    count = len(ranks)
    n = col("steps")
    dt = col("step_seconds")
    stepping = (n > 0) & (dt > 0)  # NaN compares False: no step
    phase = {p: col(sub_key("phase_seconds", p)) for p in PHASES}
    with np.errstate(divide="ignore", invalid="ignore"):
        step_s = (dt / n).tolist()
        wait = optional(phase["collective_wait"] / n)
        # Unmeasured phases count 0.
        data, h2d, fwd, bwd, opt = (
            (np.where(np.isnan(phase[p]), 0.0, phase[p]) / n).tolist()
            for p in ("data_wait", "h2d", "forward", "backward", "optimizer")
        )
        # (infinite where no step was taken: those ranks get no step sample)
        batch = rounded(col("samples") / n, None)
        # At least one micro-batch a step (none reported: one).
        micro = rounded(np.fmax(col("micro_batches") / n, 1.0), 1)
    steps_in = rounded(np.fmax(n, 1.0), 1)  # at least 1 (NaN: 1)
    rss, allocated, peak = (optional_ints(col(sub_key("memory", k))) for k in MEMORY_KINDS)
    main_col, total_col = (col(sub_key("cpu", p)) for p in C.CPU_PROCESSES)
    sampled = ~np.isnan(main_col) | ~np.isnan(total_col)
    seen = sampled.tolist()
    main, total = optional(main_col), optional(total_col)
    workers = rounded(col("workers"), 0)
    # The endpoint exports the workers' sum; the rules read the sum and the count.
    each = _per_worker(workers, total_col, total)
    nones = [None] * count
    at = [now] * count

    samples = from_columns(
        StepSample,
        {
            "rank": ranks,
            "step": [0] * count,
            "time": at,
            "step_s": step_s,
            "data_wait_s": data,
            "h2d_s": h2d,
            "forward_s": fwd,
            "backward_s": bwd,
            "optimizer_s": opt,
            "collective_wait_s": wait,
            "batch_size": batch,
            "rss_bytes": rss,
            "mem_allocated_bytes": allocated,
            "mem_reserved_bytes": nones,
            "mem_peak_bytes": peak,
            "data_cpu_s": nones,
            "collective_ops": nones,
            "micro_batches": micro,
            "count": steps_in,
        },
    )
    cpus = from_columns(
        ProcessCpu,
        {
            "rank": ranks,
            "time": at,
            "pid": [0] * count,
            "main_cpu": main,
            "worker_cpu": each,
            "rss_bytes": rss,
            "worker_rss_bytes": nones,
        },
    )
    views = from_columns(
        RankView,
        {
            "info": identity.infos,
            "steps": _ones(samples, stepping),
            "cpu": _ones(cpus, sampled),
            "ended": (col("rank_up") == 0).tolist(),
            "memory": nones,
        },
    )

    stats = rank_stats_from_columns(
        rank=ranks,
        host=identity.hosts,
        device=identity.devices,
        loader=identity.loaders,
        # A rank with no step sample took no step (the rest of its step figures are moot).
        steps=rounded(np.where(stepping, np.fmax(n, 1.0), 0.0), 1),
        step_s=step_s,
        data_wait_s=data,
        h2d_s=h2d,
        forward_s=fwd,
        backward_s=bwd,
        optimizer_s=opt,
        collective_wait_s=wait,
        batch_size=batch,
        micro_batches=micro,
        rss_bytes=rss,
        mem_allocated_bytes=allocated,
        mem_peak_bytes=peak,
        cpu_sampled=seen,
        main_cpu=main,
        worker_cpu=list(map(sum, each)),
        workers=list(map(len, each)),
        main_rss_bytes=rss,
        # No pace given: per-step figures are window means (total / steps), the pace of a
        # loader with workers too.
    )
    return views, stats


def _ones(objects: list[Any], present: npt.NDArray[np.bool_]) -> list[tuple[Any, ...]]:
    """Each object alone in a tuple where ``present``, else an empty tuple."""
    if present.all():
        return list(zip(objects))  # 1-tuples, built in C
    return [(x,) if ok else () for x, ok in zip(objects, present.tolist(), strict=True)]


def _per_worker(
    workers: list[int], total: Column, totals: list[float | None]
) -> list[tuple[float, ...]]:
    """Each rank's CPU per DataLoader worker, once per worker (``total / workers``): none
    where it has no workers or no CPU figure (``totals``: ``total`` with None for NaN)."""
    count = workers[0] if workers else 0
    if count > 0 and workers.count(count) == len(workers) and None not in totals:
        # The usual job: as many workers on every rank (the same tuples, built in C).
        each = (total / count).tolist()
        return list(zip(*([each] * count), strict=True))
    return [
        () if not w or t is None else (t / w,) * w for w, t in zip(workers, totals, strict=True)
    ]


# ------------------------------------------------------------------------------------------------
# nodes and GPUs


def _nodes(answers: Answers, now: float) -> dict[tuple[str, str], NodeCpu]:
    """Node CPU by ``(auditor_job, node)``. ``auditor_job`` is "" from a fleet agent, which serves
    every job on its node: such a node counts for each job with ranks there (see
    :func:`_job_nodes`)."""
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name in ("node_cores", "node_busy", "node_load", "node_samples"):
        answer = as_vector(answers.get(name))
        for labels, value in zip(answer.labels, answer.values.tolist(), strict=True):
            if value == value:  # NaN: no answer
                values[(labels.get(C.JOB_LABEL, ""), labels.get("node", ""))][name] = value
    return {
        key: NodeCpu(
            host=key[1],
            time=now,
            cores=v["node_cores"],
            busy_cores=v["node_busy"],
            load1=v.get("node_load", 0.0),
            samples=max(1, round(v.get("node_samples", 1.0))),
        )
        for key, v in sorted(values.items())
        if "node_cores" in v and "node_busy" in v
    }


def _job_nodes(
    nodes: Mapping[tuple[str, str], NodeCpu], job: str, hosts: Iterable[str]
) -> tuple[NodeCpu, ...]:
    """The CPU of each node a job has ranks on: its own endpoint's, else the fleet agent's."""
    found = (nodes.get((job, host)) or nodes.get(("", host)) for host in sorted(hosts))
    return tuple(n for n in found if n is not None)


@dataclass(frozen=True, eq=False)
class _Gpus:
    """Every GPU of an evaluation (:func:`gpu_stats`) as columns: its figures, owning job
    (and rank) and node."""

    found: dict[str, tuple[DeviceStats, str, str]]

    def of(self, job: str, hosts: Collection[str]) -> tuple[DeviceStats, ...]:
        """A job's GPUs: those it owns, and those no job owns on its hosts."""
        found = self.found.values()
        jobs = set(map(itemgetter(1), found))
        if jobs == {job}:  # the usual answer: every GPU is the job's
            return tuple(map(itemgetter(0), found))
        return tuple(g for g, gjob, _ in found if gjob == job or (not gjob and g.node in hosts))


def _gpus_and_owners(
    answers: Answers, wanted: Collection[str] | None
) -> tuple[_Gpus, dict[tuple[str, str], tuple[tuple[int, ...], tuple[str, ...]]]]:
    """:func:`gpu_stats`, and the GPUs each rank owns by its labels (:func:`_owned`): kept
    while the same GPUs answered with the same labels (:data:`LAST`)."""
    found, used = all_gpus(answers, wanted)
    # The owners depend on the GPUs' labels (their identities, kept: the same objects while
    # the labels are) and on which GPUs answered.
    inputs = (used, tuple(found))
    owned = LAST.get("owned", inputs)
    if owned is None:
        owned = _owned(found)
        if all(u.kept for u in used):
            LAST.keep("owned", inputs, owned)
    return _Gpus(found), owned
