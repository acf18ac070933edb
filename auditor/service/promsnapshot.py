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
  a rank owns from the ``job``/``rank`` labels the node endpoint put on each GPU's series.
* **CPU and nodes**: window means (median for busy cores, as the live path); memory: medians.
* **GPUs**: :class:`DeviceStats` straight from ``quantile_over_time`` (medians), ``max_over_time``
  (peaks, PCIe), ``deriv`` (memory trend: the least-squares slope the live path fits),
  ``sum_over_time(auditor_gpu_up)`` (samples answered) and ``avg_over_time`` of each throttle
  reason (share of samples; the largest stands for "any reason", a lower bound).

Pure: no I/O and no clock (the caller says what "now" is), so it is tested with hand-written
answers and benchmarked at 4,096 ranks without a Prometheus server.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import isfinite
from typing import Any, TypeVar

import numpy as np

from auditor.analysis.devices import IDLE_REASONS, DeviceStats
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.analysis.stats import RankStats
from auditor.metrics import catalog as C
from auditor.samples import LoaderConfig, NodeCpu, ProcessCpu, RankInfo, StepSample

from .columns import GPU, RANK, Answer, Column, Columns, as_vector, optional

_MHZ = 1e6


def queries(window_s: float) -> dict[str, str]:
    """Every query of one evaluation, by the name its answer is filed under."""
    w = f"{max(2, round(window_s))}s"
    half = f"{max(1, round(window_s / 2))}s"
    # Figures are aggregated ``by`` the labels this module reads: smaller answers, fewer labels
    # to decode per series (a 4,096-rank job answers in about 200,000 series otherwise).
    r = "job, rank"
    g = "uuid"
    q = {
        # ranks: identity (all labels) ...
        "rank_info": f"last_over_time({C.RANK_INFO.name}[{w}])",
        "loader_info": f"last_over_time({C.RANK_DATALOADER_INFO.name}[{w}])",
        # ... and figures
        "config_workers": f"max by ({r}) "
        f"(last_over_time({C.RANK_DATALOADER_CONFIG_WORKERS.name}[{w}]))",
        "rank_up": f"max by ({r}) (last_over_time({C.RANK_UP.name}[{w}]))",
        # The scrape time of each rank's latest sample (the instant selector keeps it).
        "rank_seen": f"max by ({r}) (timestamp({C.RANK_UP.name}))",
        "steps": f"sum by ({r}) (increase({C.RANK_STEPS_TOTAL.name}[{w}]))",
        "step_seconds": f"sum by ({r}) (increase({C.RANK_STEP_SECONDS_TOTAL.name}[{w}]))",
        "phase_seconds": f"sum by ({r}, phase) (increase({C.RANK_PHASE_SECONDS_TOTAL.name}[{w}]))",
        "samples": f"sum by ({r}) (increase({C.RANK_SAMPLES_TOTAL.name}[{w}]))",
        # The kinds the rules read (reserved memory is the dashboards', not the rules').
        "memory": f"max by ({r}, memory) (quantile_over_time(0.5, "
        f'{C.RANK_MEMORY_BYTES.name}{{memory=~"{"|".join(_MEMORY_KINDS)}"}}[{w}]))',
        "cpu": f"max by ({r}, process) (avg_over_time({C.RANK_CPU_CORES.name}[{w}]))",
        "workers": f"max by ({r}) (max_over_time({C.RANK_DATALOADER_WORKERS.name}[{w}]))",
        # nodes
        "node_cores": f"max by (job, node) (max_over_time({C.NODE_CPU_CORES.name}[{w}]))",
        "node_busy": "max by (job, node) "
        f"(quantile_over_time(0.5, {C.NODE_CPU_BUSY_CORES.name}[{w}]))",
        "node_load": f"max by (job, node) (avg_over_time({C.NODE_LOAD1.name}[{w}]))",
        "node_samples": f"max by (job, node) (count_over_time({C.NODE_CPU_BUSY_CORES.name}[{w}]))",
        # GPUs: identity (all labels) ...
        "gpu_up": f"last_over_time({C.GPU_UP.name}[{w}])",
        # ... and figures
        "gpu_samples": f"max by ({g}) (sum_over_time({C.GPU_UP.name}[{w}]))",
        # Seconds between the first and the last GPU read in the window (one query, not two).
        "gpu_span": f"max by ({g}) "
        f"(max_over_time({C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name}[{w}])) - min by ({g}) "
        f"(min_over_time({C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name}[{w}]))",
        "gpu_lost": f"max by ({g}) (max_over_time({C.GPU_LOST.name}[{w}]))",
        "gpu_mem_trend": f"max by ({g}) (deriv({C.GPU_MEMORY_USED_BYTES.name}[{w}]))",
        "gpu_mem_recent": f"max by ({g}) (deriv({C.GPU_MEMORY_USED_BYTES.name}[{half}]))",
        # Only reasons that were active at all (usually none), and whether reasons are read.
        "gpu_throttle": f"max by ({g}, reason) "
        f"(avg_over_time({C.GPU_THROTTLE_ACTIVE.name}[{w}])) > 0",
        "gpu_throttle_read": f"count by ({g}) (last_over_time({C.GPU_THROTTLE_ACTIVE.name}[{w}]))",
    }
    for key, spec in _GPU_MEDIANS.items():
        q[key] = f"max by ({g}) (quantile_over_time(0.5, {spec.name}[{w}]))"
    for key, spec in _GPU_MAXIMA.items():
        q[key] = f"max by ({g}) (max_over_time({spec.name}[{w}]))"
    return q


_GPU_MEDIANS = {
    "gpu_util": C.GPU_UTILIZATION_RATIO,
    "gpu_mem_used": C.GPU_MEMORY_USED_BYTES,
    "gpu_sm_clock": C.GPU_SM_CLOCK_HERTZ,
    "gpu_sm_clock_max": C.GPU_SM_CLOCK_MAX_HERTZ,
    "gpu_temperature": C.GPU_TEMPERATURE_CELSIUS,
    "gpu_power": C.GPU_POWER_WATTS,
    "gpu_power_limit": C.GPU_POWER_LIMIT_WATTS,
}
_GPU_MAXIMA = {
    "gpu_mem_used_max": C.GPU_MEMORY_USED_BYTES,
    "gpu_mem_total": C.GPU_MEMORY_TOTAL_BYTES,
    "gpu_pcie_gen": C.GPU_PCIE_LINK_GENERATION,
    "gpu_pcie_gen_max": C.GPU_PCIE_LINK_GENERATION_MAX,
    "gpu_pcie_width": C.GPU_PCIE_LINK_WIDTH,
    "gpu_pcie_width_max": C.GPU_PCIE_LINK_WIDTH_MAX,
}
# Rank memory kinds the rules read (RankStats: rss, allocated, peak).
_MEMORY_KINDS = ("rss", "allocated", "peak")

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
    seen = {
        key: v
        for key, v in zip(RANK.all(seen_answer), seen_answer.values.tolist(), strict=True)
        if v == v and v  # NaN or 0: never seen
    }
    up = as_vector(answers.get("rank_up"))
    running: dict[str, bool] = {}
    last_seen: dict[str, float] = {}
    for key, value in zip(RANK.all(up), up.values.tolist(), strict=True):
        job = key[0]
        if not job or _int(key[1]) is None:
            continue
        at = seen.get(key, 0.0)
        running[job] = running.get(job, False) or (value == 1 and now - at <= stale_after_s)
        last_seen[job] = max(at, last_seen.get(job, at))
    return {job: JobWindow(job, running[job], last_seen[job]) for job in running}


def build_snapshots(
    answers: Answers, now: float, window_s: float, *, jobs: Iterable[str] | None = None
) -> dict[str, Snapshot]:
    """One :class:`Snapshot` per job (``jobs``: only these), over ``(now - window_s, now]``.

    Column-wise: the ranks are indexed once, every figure becomes one column over that index
    (:mod:`.columns`), and the per-rank samples are built from the columns in one pass.
    """
    wanted = None if jobs is None else set(jobs)
    vec = {name: as_vector(answers.get(name)) for name in _RANK_ANSWERS}

    # The ranks: every (job, rank) with an identity or a step count, in the jobs asked for.
    infos: dict[Any, Mapping[str, str]] = {
        key: labels
        for key, labels in zip(RANK.all(vec["rank_info"]), vec["rank_info"].labels, strict=True)
        if key[0] and (wanted is None or key[0] in wanted)
    }
    counted = [
        key
        for key, n in zip(RANK.all(vec["steps"]), vec["steps"].values.tolist(), strict=True)
        if n == n and (wanted is None or key[0] in wanted)
    ]
    ranked = sorted(
        (key[0], number, key)
        for key in dict.fromkeys([*infos, *counted])
        if (number := _int(key[1])) is not None
    )
    index = {key: i for i, (_, _, key) in enumerate(ranked)}

    by_rank = Columns(index, RANK)

    def col(name: str) -> Column:
        return by_rank.column(vec[name])

    loaders = dict(zip(RANK.all(vec["loader_info"]), vec["loader_info"].labels, strict=True))
    phases = by_rank.columns_by(vec["phase_seconds"], "phase")
    memory = by_rank.columns_by(vec["memory"], "memory")
    cpu = by_rank.columns_by(vec["cpu"], "process")
    nan = np.full(len(index), np.nan)

    gpus = _gpu_stats(answers, wanted)
    owned: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for uuid, (g, owner_job, owner_rank) in gpus.items():
        if owner_job and owner_rank:
            owned[(owner_job, owner_rank)].append((g.index, uuid))
    nodes = _nodes(answers, now)
    configs: dict[tuple[object, ...], LoaderConfig] = {}

    # Every per-rank figure as one list over the index (None: not measured), computed
    # column-wise; the loop below only assembles objects from them.
    rows = _rank_rows(col, phases, memory, cpu, nan)
    config_workers = optional(col("config_workers"))
    up = col("rank_up").tolist()

    by_job: dict[str, list[RankView]] = defaultdict(list)
    stats_of: dict[str, dict[int, RankStats]] = defaultdict(dict)
    hosts_of: dict[str, set[str]] = defaultdict(set)
    for i, (job, rank, key) in enumerate(ranked):
        info = _rank_info(
            rank,
            infos.get(key, {}),
            _loader(configs, loaders.get(key, {}), config_workers[i]),
            sorted(owned.get(key, ())),
            job,
        )
        hosts_of[job].add(info.host)
        view, stats = _rank(info, now, rows[i], ended=up[i] == 0)
        by_job[job].append(view)
        stats_of[job][rank] = stats
    return {
        job: Snapshot(
            job=job,
            start=now - window_s,
            end=now,
            ranks=tuple(views),
            nodes=_job_nodes(nodes, job, hosts_of[job]),
            gpus=tuple(
                g
                for g, gjob, _ in gpus.values()
                if gjob == job or (not gjob and g.node in hosts_of[job])
            ),
        ).with_stats(stats_of[job])
        for job, views in by_job.items()
    }


_RANK_ANSWERS = (
    "rank_info",
    "loader_info",
    "config_workers",
    "rank_up",
    "steps",
    "step_seconds",
    "phase_seconds",
    "samples",
    "memory",
    "cpu",
    "workers",
)

# ------------------------------------------------------------------------------------------------
# ranks


@lru_cache(maxsize=1024)
def _int(text: str | None) -> int | None:
    # Cached: a few distinct label values (world size, local rank, batch size) recur on every
    # rank, four reads per rank.
    if text is None or text == "":
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def _loader(
    cache: dict[tuple[object, ...], LoaderConfig],
    loader: Mapping[str, str],
    workers: float | None,
) -> LoaderConfig | None:
    """The rank's DataLoader settings; ranks with the same settings share one (frozen) object."""
    if workers is None:
        return None
    key = (
        workers,
        loader.get("pin_memory"),
        loader.get("prefetch_factor"),
        loader.get("persistent_workers"),
        loader.get("batch_size"),
    )
    config = cache.get(key)
    if config is None:
        config = cache[key] = LoaderConfig(
            num_workers=int(workers),
            pin_memory=loader.get("pin_memory") == "true",
            prefetch_factor=_int(loader.get("prefetch_factor")),
            persistent_workers=loader.get("persistent_workers") == "true",
            batch_size=_int(loader.get("batch_size")),
            drop_last=False,
            sampler="",
        )
    return config


def _rank_info(
    rank: int,
    labels: Mapping[str, str],
    config: LoaderConfig | None,
    devices: Sequence[tuple[int, str]],
    job: str,
) -> RankInfo:
    # Built as the steps are (:func:`_new`): the constructor's per-field setattr was ~20% of
    # the rebuild's own work at 4,096 ranks.
    return _new(
        RankInfo,
        {
            "rank": rank,
            "world_size": _int(labels.get("world_size")) or 0,
            "local_rank": _int(labels.get("local_rank")) or 0,
            "host": labels.get("node", ""),
            "pid": 0,
            "device": labels.get("device", "cpu"),
            "parallel_mode": labels.get("parallel_mode", "none"),
            "devices": tuple(index for index, _ in devices),
            "device_uuids": tuple(uuid for _, uuid in devices),
            "loader": config,
            "unmeasured": (),
            "job": job,
            "off_thread_collectives": 0,
            "key": None,
        },
    )


_T = TypeVar("_T")


def _new(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` from every one of its ``fields``, without
    its generated ``__init__`` (one ``object.__setattr__`` per field: a third of the rebuild at
    4,096 ranks). Only for classes with no ``__post_init__``; the tests check that every field
    is given and that the result equals the constructor's."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)
    return obj


def _bytes(value: float | None) -> int | None:
    """An integral figure (bytes, a count, a PCIe generation), None where unknown."""
    return None if value is None else int(value)


def _nones(values: Column) -> list[Any]:
    return [None if x != x else x for x in values.tolist()]


def _ints(values: Column) -> list[int | None]:
    """An integral figure (bytes, a count), None where unknown."""
    return [None if x != x else int(x) for x in values.tolist()]


def _rank_rows(
    col: Callable[[str], Column],
    phases: Mapping[str, Column],
    memory: Mapping[str, Column],
    cpu: Mapping[str, Column],
    nan: Column,
) -> list[tuple[Any, ...]]:
    """Each rank's figures: the window's mean step (``n`` steps took ``dt`` seconds; step
    figures None where no step finished in it) and its CPU, one tuple per rank (see
    :func:`_rank`)."""
    n = col("steps")
    dt = col("step_seconds")
    stepped = ((n > 0) & (dt > 0)).tolist()  # NaN compares False: no step
    with np.errstate(divide="ignore", invalid="ignore"):

        def per_step(phase: str) -> list[float]:
            c = phases.get(phase, nan)
            return (np.where(np.isnan(c), 0.0, c) / n).tolist()  # unmeasured: 0

        step_s = (dt / n).tolist()
        wait = _nones(phases.get("collective_wait", nan) / n)
        # (infinite where no step was taken: those ranks get no step sample)
        batch = [round(x) if isfinite(x) else None for x in (col("samples") / n).tolist()]
        data, h2d, fwd, bwd, opt = (
            per_step(p) for p in ("data_wait", "h2d", "forward", "backward", "optimizer")
        )
    count = [max(1, round(x)) if x == x else 1 for x in n.tolist()]
    rss, allocated, peak = (_ints(memory.get(k, nan)) for k in _MEMORY_KINDS)
    # A rank with any CPU series was seen by a node agent.
    seen = np.zeros(len(n), dtype=bool)
    for c in cpu.values():
        seen |= ~np.isnan(c)
    main = _nones(cpu.get("main", nan))
    total = _nones(cpu.get("workers", nan))
    workers = [round(x) if x == x else 0 for x in col("workers").tolist()]
    return list(
        zip(
            stepped, step_s, data, h2d, fwd, bwd, opt, wait, batch, rss, allocated, peak, count,
            seen.tolist(), main, total, workers, strict=True,
        )
    )  # fmt: skip


def _rank(
    info: RankInfo, now: float, row: tuple[Any, ...], *, ended: bool
) -> tuple[RankView, RankStats]:
    """One rank's view (its mean step, its CPU) and the statistics the rules read, which
    :func:`auditor.analysis.stats.rank_stats` would reduce that view to, built from the same
    figures at once."""
    (
        stepped, step_s, data, h2d, fwd, bwd, opt, wait, batch, rss, allocated, peak, count,
        seen, main, total, n,
    ) = row  # fmt: skip
    rank = info.rank
    # The endpoint exports the workers' sum; the rules read the sum and the count.
    each = () if not n or total is None else (total / n,) * n
    cpu = (
        (
            _new(
                ProcessCpu,
                {
                    "rank": rank,
                    "time": now,
                    "pid": 0,
                    "main_cpu": main,
                    "worker_cpu": each,
                    "rss_bytes": rss,
                    "worker_rss_bytes": None,
                },
            ),
        )
        if seen
        else ()
    )
    if stepped:
        step = _new(
            StepSample,
            {
                "rank": rank,
                "step": 0,
                "time": now,
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
                "mem_reserved_bytes": None,
                "mem_peak_bytes": peak,
                "data_cpu_s": None,
                "collective_ops": None,
                # Serve carries no micro-batch count (no metric for it): one per step.
                "micro_batches": 1,
                "count": count,
            },
        )
        figures = {
            "steps": count,
            "step_s": step_s or 0.0,
            "data_wait_s": data or 0.0,
            "h2d_s": h2d or 0.0,
            "forward_s": fwd or 0.0,
            "backward_s": bwd or 0.0,
            "optimizer_s": opt or 0.0,
            "collective_wait_s": wait,
            "compute_s": (h2d + fwd + bwd + opt) or 0.0,
            # Per-step figures here are means already (total / steps over the window): the pace
            # of a loader with workers too (RankStats.mean_step_s).
            "mean_step_s": step_s or 0.0,
            "mean_data_wait_s": data or 0.0,
            "mean_collective_wait_s": wait,
            "batch_size": None if batch is None else float(batch),
            "rss_bytes": None if rss is None else float(rss),
            "mem_allocated_bytes": None if allocated is None else float(allocated),
            "mem_peak_bytes": None if peak is None else float(peak),
        }
    else:
        figures = _NO_STEP
    workers = len(each) if seen else 0
    view = _new(
        RankView,
        {
            "info": info,
            "steps": (step,) if stepped else (),
            "cpu": cpu,
            "ended": ended,
            "memory": None,
        },
    )
    stats = _new(
        RankStats,
        {
            "rank": rank,
            "host": info.host,
            "device": info.device,
            **figures,
            "loader": info.loader,
            "data_cpu_s": None,
            "collective_ops": None,
            "mean_collective_ops": None,
            "main_cpu": main if seen else None,
            "worker_cpu": sum(each) if workers else None,
            "workers": workers,
            "worker_rss_bytes": None,
            "main_rss_bytes": None if not seen or rss is None else float(rss),
            "micro_batches": 1.0,
        },
    )
    return view, stats


# A rank with no step in the window: what reducing no samples gives.
_NO_STEP: dict[str, Any] = {
    "steps": 0,
    "step_s": 0.0,
    "data_wait_s": 0.0,
    "h2d_s": 0.0,
    "forward_s": 0.0,
    "backward_s": 0.0,
    "optimizer_s": 0.0,
    "collective_wait_s": None,
    "compute_s": 0.0,
    "mean_step_s": 0.0,
    "mean_data_wait_s": 0.0,
    "mean_collective_wait_s": None,
    "batch_size": None,
    "rss_bytes": None,
    "mem_allocated_bytes": None,
    "mem_peak_bytes": None,
}


# ------------------------------------------------------------------------------------------------
# nodes and GPUs


def _nodes(answers: Answers, now: float) -> dict[tuple[str, str], NodeCpu]:
    """Node CPU by ``(job, node)``. ``job`` is "" from a fleet agent, which serves every job on
    its node: such a node counts for each job with ranks there (see :func:`_job_nodes`)."""
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name in ("node_cores", "node_busy", "node_load", "node_samples"):
        answer = as_vector(answers.get(name))
        for labels, value in zip(answer.labels, answer.values.tolist(), strict=True):
            if value == value:  # NaN: no answer
                values[(labels.get("job", ""), labels.get("node", ""))][name] = value
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


def _gpu_stats(
    answers: Answers, wanted: set[str] | None = None
) -> dict[str, tuple[DeviceStats, str, str]]:
    """Every GPU that answered in the window: its figures, owning job and rank ("" if none);
    with ``wanted``, only the GPUs of those jobs and the GPUs no job owns.

    A GPU whose monitor never answered (``sum_over_time(auditor_gpu_up)`` 0) is left out: a
    missing GPU must not read as an idle one.
    """
    identity: dict[str, Mapping[str, str]] = {}
    for labels in as_vector(answers.get("gpu_up")).labels:
        uuid = labels.get("uuid", "")
        # A GPU that changed owner in the window has a series per owner; an owner beats none.
        if uuid and (uuid not in identity or labels.get("job")):
            identity[uuid] = labels
    if wanted is not None:
        identity = {
            u: x for u, x in identity.items() if x.get("job", "") in wanted or not x.get("job")
        }
    index = {uuid: i for i, uuid in enumerate(identity)}
    # One column over the GPUs per figure (None where Prometheus had none).
    by_gpu = Columns(index, GPU)
    v = {key: by_gpu.column(as_vector(answers.get(key))) for key in _GPU_FIGURES}
    with np.errstate(divide="ignore", invalid="ignore"):
        used, total = v["gpu_mem_used"], v["gpu_mem_total"]
        clock, clock_max = v["gpu_sm_clock"], v["gpu_sm_clock_max"]
        # x / y where both are known and y is not 0 (nor NaN), else None.
        mem_ratio = _nones(np.where(total != 0, used / total, np.nan))
        clock_ratio = _nones(np.where(clock_max != 0, clock / clock_max, np.nan))
    # Every figure as one list over the GPUs, by DeviceStats field; each GPU's fields are then
    # one dict(zip(...)) (C-level), not a dict built field by field.
    figures: dict[str, list[Any]] = {
        "samples": [round(x) if x == x else 0 for x in v["gpu_samples"].tolist()],
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
        figures[field] = _nones(v[key])
    figures["sm_clock_mhz"] = _nones(clock / _MHZ)
    figures["sm_clock_max_mhz"] = _nones(clock_max / _MHZ)
    for field, key in (
        ("mem_used_max_bytes", "gpu_mem_used_max"),
        ("mem_total_bytes", "gpu_mem_total"),
        ("pcie_gen", "gpu_pcie_gen"),
        ("pcie_gen_max", "gpu_pcie_gen_max"),
        ("pcie_width", "gpu_pcie_width"),
        ("pcie_width_max", "gpu_pcie_width_max"),
    ):
        figures[field] = _ints(v[key])
    figures["mem_ratio"] = mem_ratio
    figures["sm_clock_ratio"] = clock_ratio
    names = tuple(figures)
    throttle: dict[str, dict[str, float]] = defaultdict(dict)
    answer = as_vector(answers.get("gpu_throttle"))
    for labels, value in zip(answer.labels, answer.values.tolist(), strict=True):
        if value == value:
            throttle[labels.get("uuid", "")][labels.get("reason", "other")] = value
    # GPUs whose driver reports reasons at all: the others' throttle share is unknown, not 0.
    read = set(as_vector(answers.get("gpu_throttle_read")).label("uuid"))

    out: dict[str, tuple[DeviceStats, str, str]] = {}
    per_gpu = zip(*figures.values(), strict=True)
    for (uuid, labels), row in zip(identity.items(), per_gpu, strict=True):
        fields = dict(zip(names, row, strict=True))
        if fields["samples"] <= 0:
            continue
        mine = throttle.get(uuid)
        reasons = {r: x for r, x in mine.items() if r not in IDLE_REASONS} if mine else {}
        ordered = tuple(sorted((r for r, x in reasons.items() if x > 0), key=lambda r: -reasons[r]))
        fields.update(
            {
                "uuid": uuid,
                "node": labels.get("node", ""),
                "index": _int(labels.get("gpu")) or 0,
                "model": labels.get("model", ""),
                "throttle_share": max(reasons.values(), default=0.0) if uuid in read else None,
                "throttle_reasons": ordered,
                "process_count": 0,  # no rule reads it; the dashboards have auditor_gpu_processes
                "processes": (),
            }
        )
        stats = _new(DeviceStats, fields)
        out[uuid] = (stats, labels.get("job", ""), labels.get("rank", ""))
    return out


_GPU_FIGURES = (
    "gpu_samples",
    "gpu_span",
    "gpu_lost",
    "gpu_mem_trend",
    "gpu_mem_recent",
    *_GPU_MEDIANS,
    *_GPU_MAXIMA,
)
