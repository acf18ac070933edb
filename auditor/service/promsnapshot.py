"""PromQL answers -> :class:`Snapshot`: the operator path's half of "one snapshot, one rule set".

``auditor serve`` asks Prometheus for window aggregates (:func:`queries`), one instant query per
figure, and this module turns the answers into the snapshot the live path builds from its
actors, per running job. Prometheus does the per-sample work (it holds the samples, in Go); the
service handles one value per series, which is what keeps an evaluation of 4,096 ranks within
its budget (``bench/serve_scale.py``).

* **steps**: ``increase()`` of the step, phase and sample counters over the window gives the
  rank's mean step; it becomes one :class:`StepSample` with ``count`` = the steps taken, so the
  rules weigh it as those steps together. This is a window *mean* where the live path takes a
  median of single steps: a few very slow steps weigh more here.
* **rank identity**: ``auditor_rank_info`` and ``auditor_rank_dataloader_info`` labels; the GPUs
  a rank owns from the ``auditor_job``/``rank`` labels the node endpoint put on each GPU's series.
* **CPU and nodes**: window means (median for busy cores, as the live path); memory: medians.
* **GPUs**: :class:`DeviceStats` straight from ``quantile_over_time`` (medians), ``max_over_time``
  (peaks, PCIe), ``deriv`` (memory trend: the least-squares slope the live path fits),
  ``sum_over_time(auditor_gpu_up)`` (samples answered) and ``avg_over_time`` of each throttle
  reason (share of samples; the largest stands for "any reason", a lower bound).

Pure: no I/O and no clock (the caller says what "now" is), so it is tested with hand-written
answers and benchmarked at 4,096 ranks without a Prometheus server.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import compress, repeat
from operator import is_not, itemgetter, methodcaller
from typing import Any

import numpy as np

from auditor.analysis.devices import IDLE_REASONS, DeviceStats
from auditor.analysis.frozen import from_columns
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.analysis.stats import RankStats, rank_stats_from_columns
from auditor.metrics import catalog as C
from auditor.samples import PHASES, LoaderConfig, NodeCpu, ProcessCpu, RankInfo, StepSample

from .columns import (
    GPU,
    RANK,
    Answer,
    Column,
    Columns,
    as_vector,
    optional,
    optional_ints,
    rounded,
)
from .promqueries import DCGM, GPU_FIGURES, MEMORY_KINDS
from .promqueries import queries as queries
from .promqueries import sub_key as sub_key

_MHZ = 1e6
MODEL = "modelName"  # dcgm-exporter's model label (the highest SM clock per model is by it)


Answers = Mapping[str, Answer]


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
    numbers = map(_int, map(itemgetter(1), keys))
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
    wanted = None if jobs is None else set(jobs)
    rank_info = as_vector(answers.get("rank_info"))
    steps = as_vector(answers.get("steps"))
    loader_info = as_vector(answers.get("loader_info"))

    # The ranks: every (job, rank) with an identity or a step count, in the jobs asked for.
    infos: dict[Any, Mapping[str, str]] = {
        key: labels
        for key, labels in zip(RANK.all(rank_info), rank_info.labels, strict=True)
        if key[0] and (wanted is None or key[0] in wanted)
    }
    counted = [
        key
        for key, n in zip(RANK.all(steps), steps.values.tolist(), strict=True)
        if n == n and (wanted is None or key[0] in wanted)
    ]
    keys = list(dict.fromkeys([*infos, *counted]))
    ranked = sorted(
        (key[0], number, key)
        for key, number in zip(keys, _ints([key[1] for key in keys]), strict=True)
        if number is not None
    )
    index = {key: i for i, (_, _, key) in enumerate(ranked)}
    by_rank = Columns(index, RANK)

    def col(name: str) -> Column:
        return by_rank.column(as_vector(answers.get(name)))

    gpus = gpu_stats(answers, wanted)
    # The GPUs whose series name a rank, in index order: their indexes and UUIDs.
    owned = _owned(gpus)
    loaders = dict(zip(RANK.all(loader_info), loader_info.labels, strict=True))
    info_of = _rank_infos(ranked, infos, loaders, owned, optional(col("config_workers")))
    views, stats = _ranks(info_of, now, col)

    # Sorted by job: each job's ranks are one slice of the columns.
    jobs = [job for job, _, _ in ranked]
    numbers = [rank for _, rank, _ in ranked]
    hosts = [info.host for info in info_of]
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
            gpus=tuple(
                g
                for g, gjob, _ in gpus.values()
                if gjob == job or (not gjob and g.node in hosts_of)
            ),
            precomputed_stats=dict(zip(numbers[first:end], stats[first:end], strict=True)),
        )
    return out


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


def _int(text: str | None) -> int | None:
    """A label's whole number ("3", also "3.0"), None where absent or not a number."""
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    if not text:
        return None
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        return None


def _ints(texts: list[str]) -> list[int | None]:
    """:func:`_int` of each label: in C where all are plain whole numbers (rank numbers)."""
    try:
        return list(map(int, texts))
    except (TypeError, ValueError):
        return list(map(_int, texts))


@lru_cache(maxsize=1024)
def _int_or_0(text: str | None) -> int:
    # Cached: a few distinct label values (world size, local rank, GPU index) recur on every
    # rank or GPU. (Rank numbers, all distinct, go through _int: a cache only churned.)
    return _int(text) or 0


def _loaders(
    ranked: Sequence[tuple[str, int, Any]],
    loaders: Mapping[Any, Mapping[str, str]],
    config_workers: Sequence[float | None],
) -> list[LoaderConfig | None]:
    """Each rank's DataLoader settings (None where no configured worker count was exported);
    ranks with the same settings share one (frozen) object."""
    labels = [loaders.get(key, _NO_LABELS) for _, _, key in ranked]
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
                prefetch_factor=_int(prefetch),
                persistent_workers=persistent == "true",
                batch_size=_int(batch),
                drop_last=False,
                sampler="",
            )
    return list(map(configs.__getitem__, keys))


_NO_LABELS: Mapping[str, str] = {}


def _rank_infos(
    ranked: Sequence[tuple[str, int, Any]],
    infos: Mapping[Any, Mapping[str, str]],
    loaders: Mapping[Any, Mapping[str, str]],
    owned: Mapping[Any, tuple[tuple[int, ...], tuple[str, ...]]],
    config_workers: Sequence[float | None],
) -> list[RankInfo]:
    """Each rank's identity, from its ``auditor_rank_info`` and dataloader labels and the GPUs
    whose series name it (``owned``: their indexes and UUIDs by rank key)."""
    n = len(ranked)
    keys = [key for _, _, key in ranked]
    labels = list(map(infos.get, keys, [_NO_LABELS] * n))

    def label(name: str, default: str) -> list[str]:
        return list(map(methodcaller("get", name, default), labels))

    devices = list(map(owned.get, keys, [((), ())] * n))
    return from_columns(
        RankInfo,
        {
            "rank": [rank for _, rank, _ in ranked],
            "world_size": list(map(_int_or_0, label("world_size", ""))),
            "local_rank": list(map(_int_or_0, label("local_rank", ""))),
            "host": label("node", ""),
            "pid": [0] * n,
            "device": label("device", "cpu"),
            "parallel_mode": label("parallel_mode", "none"),
            "devices": [d[0] for d in devices],
            "device_uuids": [d[1] for d in devices],
            "loader": _loaders(ranked, loaders, config_workers),
            "unmeasured": [()] * n,
            "job": [job for job, _, _ in ranked],
            "off_thread_collectives": [0] * n,
            "key": [None] * n,
        },
    )


def _ranks(
    infos: Sequence[RankInfo], now: float, col: Callable[[str], Column]
) -> tuple[list[RankView], list[RankStats]]:
    """Each rank's view (its mean step over the window, its CPU) and the statistics the rules
    read, which :func:`auditor.analysis.stats.rank_stats` would reduce that view to, built from
    the same columns at once (:func:`auditor.analysis.stats.rank_stats_from_columns`).

    A rank's mean step: ``n`` steps took ``dt`` seconds; no step sample where none finished in
    the window. Its CPU: a rank with any CPU series was seen by a node agent.
    """
    count = len(infos)
    n = col("steps")
    dt = col("step_seconds")
    stepped = ((n > 0) & (dt > 0)).tolist()  # NaN compares False: no step
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
    seen = (~np.isnan(main_col) | ~np.isnan(total_col)).tolist()
    main, total = optional(main_col), optional(total_col)
    workers = rounded(col("workers"), 0)
    # The endpoint exports the workers' sum; the rules read the sum and the count.
    each = [() if not w or t is None else (t / w,) * w for w, t in zip(workers, total, strict=True)]
    ranks = [info.rank for info in infos]
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
            "info": infos,
            "steps": [(s,) if ok else () for s, ok in zip(samples, stepped, strict=True)],
            "cpu": [(c,) if ok else () for c, ok in zip(cpus, seen, strict=True)],
            "ended": (col("rank_up") == 0).tolist(),
            "memory": nones,
        },
    )

    stats = rank_stats_from_columns(
        rank=ranks,
        host=[info.host for info in infos],
        device=[info.device for info in infos],
        loader=[info.loader for info in infos],
        # A rank with no step sample took no step (the rest of its step figures are moot).
        steps=[k if ok else 0 for k, ok in zip(steps_in, stepped, strict=True)],
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
        worker_cpu=[sum(e) for e in each],
        workers=[len(e) for e in each],
        main_rss_bytes=rss,
        # No pace given: per-step figures are window means (total / steps), the pace of a
        # loader with workers too.
    )
    return views, stats


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


def gpu_stats(
    answers: Answers, wanted: set[str] | None = None
) -> dict[str, tuple[DeviceStats, str, str]]:
    """Every GPU that answered in the window (see :func:`_gpu_stats`), from the auditor's own
    monitors and from dcgm-exporter (answers prefixed :data:`~.promqueries.DCGM`): a GPU both
    export is read from the monitors. dcgm-exporter's GPUs take their job, rank and node from the
    rank that reported using them (``auditor_gpu_owner_info``, joined by UUID)."""
    out = _gpu_stats(answers, wanted)
    if as_vector(answers.get(DCGM + "gpu_up")).labels:
        owners: dict[str, Mapping[str, str]] = {}
        for series in as_vector(answers.get(DCGM + "gpu_owner")).labels:
            uuid = series.get("uuid", "")
            had = owners.get(uuid)
            # Two ranks naming one GPU: the lowest rank owns it, as the node agent decides.
            if uuid and (had is None or _int_or_0(series.get("rank")) < _int_or_0(had.get("rank"))):
                owners[uuid] = series
        for uuid, found in _gpu_stats(answers, wanted, prefix=DCGM, owners=owners).items():
            out.setdefault(uuid, found)
    return out


def _gpu_stats(
    answers: Answers,
    wanted: set[str] | None = None,
    *,
    prefix: str = "",
    owners: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, tuple[DeviceStats, str, str]]:
    """Every GPU that answered in the window: its figures, owning job and rank ("" if none);
    with ``wanted``, only the GPUs of those jobs and the GPUs no job owns. ``prefix``: whose
    answers (:data:`~.promqueries.DCGM`: dcgm-exporter's); ``owners``: the owning rank's labels
    (job, rank, node) by UUID, for a source whose series do not carry them.

    A GPU whose monitor never answered (``sum_over_time(auditor_gpu_up)`` 0) is left out: a
    missing GPU must not read as an idle one.
    """
    identity: dict[str, Mapping[str, str]] = {}
    up = as_vector(answers.get(prefix + "gpu_up"))
    uuids = GPU.all(up)
    if not owners and "" not in uuids and len(set(uuids)) == len(uuids):
        # The usual answer: a series per GPU, nothing to join (built in C).
        identity.update(zip(uuids, up.labels, strict=True))
    for series in () if identity else up.labels:
        uuid = series.get("uuid", "")
        owner = (owners or {}).get(uuid)
        if owner is not None and not series.get(C.JOB_LABEL):
            series = {**series, **owner}
        # A GPU that changed owner in the window has a series per owner; an owner beats none.
        if uuid and (uuid not in identity or series.get(C.JOB_LABEL)):
            identity[uuid] = series
    if wanted is not None:
        identity = {
            u: x
            for u, x in identity.items()
            if x.get(C.JOB_LABEL, "") in wanted or not x.get(C.JOB_LABEL)
        }
    index = {uuid: i for i, uuid in enumerate(identity)}
    # One column over the GPUs per figure (None where Prometheus had none).
    by_gpu = Columns(index, GPU)
    v = {key: by_gpu.column(as_vector(answers.get(prefix + key))) for key in GPU_FIGURES}
    clock_max = v["gpu_sm_clock_max"]
    peak = as_vector(answers.get(prefix + "gpu_sm_clock_peak"))
    if len(peak.values) and np.isnan(clock_max).any():
        # No maximum exported (dcgm-exporter's default fields): the highest SM clock a GPU of the
        # same model reached in the last hour stands for it, so a GPU clocked below its peers'
        # still reads low.
        top = dict(zip(peak.label(MODEL), peak.values.tolist(), strict=True))
        models = [x.get("model", "") for x in identity.values()]
        fill = np.array([top.get(m, np.nan) for m in models], dtype=np.float64) * _MHZ
        clock_max = np.where(np.isnan(clock_max), fill, clock_max)
    with np.errstate(divide="ignore", invalid="ignore"):
        used, total = v["gpu_mem_used"], v["gpu_mem_total"]
        clock = v["gpu_sm_clock"]
        # x / y where both are known and y is not 0 (nor NaN), else None.
        mem_ratio = optional(np.where(total != 0, used / total, np.nan))
        clock_ratio = optional(np.where(clock_max != 0, clock / clock_max, np.nan))
    # Every figure as one list over the GPUs, by DeviceStats field; each GPU's fields are then
    # one dict(zip(...)) (C-level), not a dict built field by field.
    figures: dict[str, list[Any]] = {
        "samples": rounded(v["gpu_samples"], 0),
        "lost": (v["gpu_lost"] == 1).tolist(),
        "span_s": [max(0.0, x) if x == x else 0.0 for x in v["gpu_span"].tolist()],
    }
    for field, key in (
        ("gpu_util", "gpu_util"),
        ("mem_used_bytes", "gpu_mem_used"),
        ("mem_trend_bytes_per_s", "gpu_mem_trend"),
        ("mem_recent_trend_bytes_per_s", "gpu_mem_recent"),
        ("temperature_c", "gpu_temperature"),
        ("power_w", "gpu_power"),
        ("power_limit_w", "gpu_power_limit"),
    ):
        figures[field] = optional(v[key])
    figures["sm_clock_mhz"] = optional(clock / _MHZ)
    figures["sm_clock_max_mhz"] = optional(clock_max / _MHZ)
    for field, key in (
        ("mem_used_max_bytes", "gpu_mem_used_max"),
        ("mem_total_bytes", "gpu_mem_total"),
        ("pcie_gen", "gpu_pcie_gen"),
        ("pcie_gen_max", "gpu_pcie_gen_max"),
        ("pcie_width", "gpu_pcie_width"),
        ("pcie_width_max", "gpu_pcie_width_max"),
    ):
        figures[field] = optional_ints(v[key])
    figures["mem_ratio"] = mem_ratio
    figures["sm_clock_ratio"] = clock_ratio
    throttle: dict[str, dict[str, float]] = defaultdict(dict)
    answer = as_vector(answers.get(prefix + "gpu_throttle"))
    for labels, value in zip(answer.labels, answer.values.tolist(), strict=True):
        if value == value:
            throttle[labels.get("uuid", "")][labels.get("reason", "other")] = value
    # GPUs whose driver reports reasons at all: the others' throttle share is unknown, not 0.
    read = set(as_vector(answers.get(prefix + "gpu_throttle_read")).label("uuid"))
    share: dict[str, float] = {}
    ordered: dict[str, tuple[str, ...]] = {}
    for uuid, mine in throttle.items():
        reasons = {r: x for r, x in mine.items() if r not in IDLE_REASONS}
        share[uuid] = max(reasons.values(), default=0.0)
        ordered[uuid] = tuple(
            sorted((r for r, x in reasons.items() if x > 0), key=lambda r: -reasons[r])
        )

    uuids = list(identity)
    identities = list(identity.values())

    def label(name: str) -> list[str]:
        return list(map(methodcaller("get", name, ""), identities))

    count = len(uuids)
    figures |= {
        "uuid": uuids,
        "node": label("node"),
        "index": list(map(_int_or_0, label("gpu"))),
        "model": label("model"),
        "throttle_share": [share.get(u, 0.0) if u in read else None for u in uuids],
        "throttle_reasons": [ordered.get(u, ()) for u in uuids],
        "process_count": [0] * count,  # no rule reads it; the dashboards have auditor_gpu_processes
        "processes": [()] * count,
    }
    jobs, ranks = label(C.JOB_LABEL), label("rank")
    answered = [n > 0 for n in figures["samples"]]
    if not all(answered):
        figures = {k: list(compress(v, answered)) for k, v in figures.items()}
        uuids, jobs, ranks = (list(compress(v, answered)) for v in (uuids, jobs, ranks))
    stats = from_columns(DeviceStats, figures)
    return dict(zip(uuids, zip(stats, jobs, ranks, strict=True), strict=True))
