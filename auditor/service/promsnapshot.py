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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from auditor.analysis.devices import IDLE_REASONS, DeviceStats
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.metrics import catalog as C
from auditor.metrics.query import Series
from auditor.samples import LoaderConfig, NodeCpu, ProcessCpu, RankInfo, StepSample

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
        "steps_total": f"max by ({r}) (last_over_time({C.RANK_STEPS_TOTAL.name}[{w}]))",
        "memory": f"max by ({r}, memory) "
        f"(quantile_over_time(0.5, {C.RANK_MEMORY_BYTES.name}[{w}]))",
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
        "gpu_first": f"min by ({g}) "
        f"(min_over_time({C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name}[{w}]))",
        "gpu_last": f"max by ({g}) "
        f"(max_over_time({C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS.name}[{w}]))",
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
    "gpu_processes": C.GPU_PROCESSES,
}

Answers = Mapping[str, Sequence[Series]]
RankKey = tuple[str, int]  # (job, rank)


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
    seen = {_rank_key(s.labels): v for s in answers.get("rank_seen", ()) if (v := _value(s))}
    jobs: dict[str, JobWindow] = {}
    for s in answers.get("rank_up", ()):
        key = _rank_key(s.labels)
        if key is None:
            continue
        job = key[0]
        at = seen.get(key, 0.0)
        alive = _value(s) == 1 and now - at <= stale_after_s
        prev = jobs.get(job)
        jobs[job] = JobWindow(
            job=job,
            running=alive or (prev is not None and prev.running),
            last_seen=max(at, prev.last_seen if prev else at),
        )
    return jobs


def build_snapshots(
    answers: Answers, now: float, window_s: float, *, jobs: Iterable[str] | None = None
) -> dict[str, Snapshot]:
    """One :class:`Snapshot` per job (``jobs``: only these), over ``(now - window_s, now]``."""
    wanted = None if jobs is None else set(jobs)
    start = now - window_s

    def flat(name: str) -> dict[tuple[str, str], float]:
        """``{(job, rank): value}`` of one answer (aggregated ``by (job, rank)``)."""
        # Comprehensions, not loops: this runs once per series, ~10^5 times at 4,096 ranks.
        return {
            (s.labels.get("job", ""), s.labels.get("rank", "")): x
            for s in answers.get(name, ())
            if (x := s.samples[-1][1]) == x  # NaN: no answer
            and (wanted is None or s.labels.get("job") in wanted)
        }

    def by_rank(name: str, sub: str) -> dict[tuple[str, str], dict[str, float]]:
        """``{(job, rank): {value of label sub: value}}`` of one answer."""
        out: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
        for s in answers.get(name, ()):
            labels = s.labels
            job = labels.get("job")
            value = s.samples[-1][1]
            if job and (wanted is None or job in wanted) and value == value:
                out[(job, labels.get("rank", ""))][labels.get(sub, "")] = value
        return out

    infos: dict[tuple[str, str], Mapping[str, str]] = {}
    for s in answers.get("rank_info", ()):
        job = s.labels.get("job")
        if job and (wanted is None or job in wanted):
            infos[(job, s.labels.get("rank", ""))] = s.labels
    loaders = {
        (s.labels.get("job", ""), s.labels.get("rank", "")): s.labels
        for s in answers.get("loader_info", ())
    }
    config_workers = flat("config_workers")
    up = flat("rank_up")
    steps = flat("steps")
    seconds = flat("step_seconds")
    phases = by_rank("phase_seconds", "phase")
    samples = flat("samples")
    totals = flat("steps_total")
    memory = by_rank("memory", "memory")
    cpu = by_rank("cpu", "process")
    workers = flat("workers")

    gpus = _gpu_stats(answers)
    owned: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for uuid, (g, owner_job, owner_rank) in gpus.items():
        if owner_job and owner_rank:
            owned[(owner_job, owner_rank)].append((g.index, uuid))
    nodes = _nodes(answers, now)

    by_job: dict[str, list[tuple[int, tuple[str, str]]]] = defaultdict(list)
    for key in set(infos) | set(steps):
        rank_number = _int(key[1])
        if rank_number is not None:
            by_job[key[0]].append((rank_number, key))
    out: dict[str, Snapshot] = {}
    for job, keys in by_job.items():
        views: list[RankView] = []
        total: dict[int, int] = {}
        hosts: set[str] = set()
        for rank, key in sorted(keys):
            info = _rank_info(
                rank,
                infos.get(key, {}),
                loaders.get(key, {}),
                config_workers.get(key),
                sorted(owned.get(key, ())),
                job,
            )
            hosts.add(info.host)
            if key in totals:
                total[rank] = int(totals[key])
            mem = memory.get(key, {})
            step = _step(
                rank,
                now,
                steps.get(key),
                seconds.get(key),
                phases.get(key, {}),
                samples.get(key),
                mem,
            )
            views.append(
                RankView(
                    info=info,
                    steps=() if step is None else (step,),
                    cpu=_process_cpu(rank, now, cpu.get(key, {}), workers.get(key), mem),
                    ended=up.get(key) == 0,
                )
            )
        out[job] = Snapshot(
            job=job,
            start=start,
            end=now,
            ranks=tuple(views),
            nodes=_job_nodes(nodes, job, hosts),
            gpus=tuple(
                g for g, gjob, _ in gpus.values() if gjob == job or (not gjob and g.node in hosts)
            ),
            total_steps=total,
        )
    return out


# ------------------------------------------------------------------------------------------------
# ranks


def _rank_key(labels: Mapping[str, str]) -> RankKey | None:
    job = labels.get("job", "")
    rank = _int(labels.get("rank"))
    return None if not job or rank is None else (job, rank)


def _value(s: Series) -> float | None:
    last = s.last
    if last is None or last[1] != last[1]:  # NaN: no answer for this series
        return None
    return last[1]


def _int(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def _rank_info(
    rank: int,
    labels: Mapping[str, str],
    loader: Mapping[str, str],
    workers: float | None,
    devices: Sequence[tuple[int, str]],
    job: str,
) -> RankInfo:
    config = None
    if workers is not None:
        config = LoaderConfig(
            num_workers=int(workers),
            pin_memory=loader.get("pin_memory") == "true",
            prefetch_factor=_int(loader.get("prefetch_factor")),
            persistent_workers=loader.get("persistent_workers") == "true",
            batch_size=_int(loader.get("batch_size")),
            drop_last=False,
            sampler="",
        )
    return RankInfo(
        rank=rank,
        world_size=_int(labels.get("world_size")) or 0,
        local_rank=_int(labels.get("local_rank")) or 0,
        host=labels.get("node", ""),
        device=labels.get("device", "cpu"),
        parallel_mode=labels.get("parallel_mode", "none"),
        devices=tuple(index for index, _ in devices),
        device_uuids=tuple(uuid for _, uuid in devices),
        loader=config,
        job=job,
    )


def _step(
    rank: int,
    now: float,
    n: float | None,
    dt: float | None,
    phases: Mapping[str, float],
    samples: float | None,
    mem: Mapping[str, float],
) -> StepSample | None:
    """The rank's mean step over the window (``n`` steps took ``dt`` seconds); None if no
    step finished in it."""
    if not n or n <= 0 or not dt or dt <= 0:
        return None
    wait = phases.get("collective_wait")
    return StepSample(
        rank=rank,
        step=0,
        time=now,
        step_s=dt / n,
        data_wait_s=phases.get("data_wait", 0.0) / n,
        h2d_s=phases.get("h2d", 0.0) / n,
        forward_s=phases.get("forward", 0.0) / n,
        backward_s=phases.get("backward", 0.0) / n,
        optimizer_s=phases.get("optimizer", 0.0) / n,
        collective_wait_s=None if wait is None else wait / n,
        batch_size=None if samples is None else round(samples / n),
        rss_bytes=_bytes(mem.get("rss")),
        mem_allocated_bytes=_bytes(mem.get("allocated")),
        mem_reserved_bytes=_bytes(mem.get("reserved")),
        mem_peak_bytes=_bytes(mem.get("peak")),
        count=max(1, round(n)),
    )


def _bytes(value: float | None) -> int | None:
    """An integral figure (bytes, a count, a PCIe generation), None where unknown."""
    return None if value is None else int(value)


def _process_cpu(
    rank: int,
    now: float,
    cpu: Mapping[str, float],
    workers: float | None,
    mem: Mapping[str, float],
) -> tuple[ProcessCpu, ...]:
    if not cpu:
        return ()
    n = round(workers or 0.0)
    total = cpu.get("workers")
    # The endpoint exports the workers' sum; the rules read the sum and the count.
    each = () if not n or total is None else (total / n,) * n
    return (
        ProcessCpu(
            rank=rank,
            time=now,
            pid=0,
            main_cpu=cpu.get("main"),
            worker_cpu=each,
            rss_bytes=_bytes(mem.get("rss")),
        ),
    )


# ------------------------------------------------------------------------------------------------
# nodes and GPUs


def _nodes(answers: Answers, now: float) -> dict[tuple[str, str], NodeCpu]:
    """Node CPU by ``(job, node)``. ``job`` is "" from a fleet agent, which serves every job on
    its node: such a node counts for each job with ranks there (see :func:`_job_nodes`)."""
    values: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for name in ("node_cores", "node_busy", "node_load", "node_samples"):
        for s in answers.get(name, ()):
            value = _value(s)
            if value is not None:
                values[(s.labels.get("job", ""), s.labels.get("node", ""))][name] = value
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


def _gpu_stats(answers: Answers) -> dict[str, tuple[DeviceStats, str, str]]:
    """Every GPU that answered in the window: its figures, owning job and rank ("" if none).

    A GPU whose monitor never answered (``sum_over_time(auditor_gpu_up)`` 0) is left out: a
    missing GPU must not read as an idle one.
    """
    identity: dict[str, Mapping[str, str]] = {}
    for s in answers.get("gpu_up", ()):
        uuid = s.labels.get("uuid", "")
        # A GPU that changed owner in the window has a series per owner; an owner beats none.
        if uuid and (uuid not in identity or s.labels.get("job")):
            identity[uuid] = s.labels
    # One {uuid: value} column per figure (a comprehension per answer, not a loop per series).
    col = {
        key: {
            s.labels.get("uuid", ""): x
            for s in answers.get(key, ())
            if (x := s.samples[-1][1]) == x  # NaN: no answer
        }
        for key in (
            "gpu_samples",
            "gpu_first",
            "gpu_last",
            "gpu_lost",
            "gpu_mem_trend",
            "gpu_mem_recent",
            *_GPU_MEDIANS,
            *_GPU_MAXIMA,
        )
    }
    throttle: dict[str, dict[str, float]] = defaultdict(dict)
    for s in answers.get("gpu_throttle", ()):
        value = _value(s)
        if value is not None:
            throttle[s.labels.get("uuid", "")][s.labels.get("reason", "other")] = value
    # GPUs whose driver reports reasons at all: the others' throttle share is unknown, not 0.
    read = {s.labels.get("uuid", "") for s in answers.get("gpu_throttle_read", ())}

    out: dict[str, tuple[DeviceStats, str, str]] = {}
    samples_of = col["gpu_samples"]
    for uuid, labels in identity.items():
        answered = round(samples_of.get(uuid, 0.0))
        if answered <= 0:
            continue

        # This GPU's figure of each column (None where Prometheus had none).
        v = {key: c.get(uuid) for key, c in col.items()}
        used = v["gpu_mem_used"]
        total = v["gpu_mem_total"]
        clock = v["gpu_sm_clock"]
        clock_max = v["gpu_sm_clock_max"]
        reasons = {r: share for r, share in throttle.get(uuid, {}).items() if r not in IDLE_REASONS}
        ordered = tuple(sorted((r for r, x in reasons.items() if x > 0), key=lambda r: -reasons[r]))
        stats = DeviceStats(
            uuid=uuid,
            node=labels.get("node", ""),
            index=_int(labels.get("gpu")) or 0,
            model=labels.get("model", ""),
            samples=answered,
            lost=v["gpu_lost"] == 1,
            span_s=max(0.0, (v["gpu_last"] or 0.0) - (v["gpu_first"] or 0.0)),
            gpu_util=v["gpu_util"],
            mem_used_bytes=used,
            mem_used_max_bytes=_bytes(v["gpu_mem_used_max"]),
            mem_total_bytes=_bytes(total),
            mem_ratio=used / total if used is not None and total else None,
            mem_trend_bytes_per_s=v["gpu_mem_trend"],
            mem_recent_trend_bytes_per_s=v["gpu_mem_recent"],
            sm_clock_mhz=None if clock is None else clock / _MHZ,
            sm_clock_max_mhz=None if clock_max is None else clock_max / _MHZ,
            sm_clock_ratio=clock / clock_max if clock is not None and clock_max else None,
            throttle_share=max(reasons.values(), default=0.0) if uuid in read else None,
            throttle_reasons=ordered,
            temperature_c=v["gpu_temperature"],
            power_w=v["gpu_power"],
            power_limit_w=v["gpu_power_limit"],
            pcie_gen=_bytes(v["gpu_pcie_gen"]),
            pcie_gen_max=_bytes(v["gpu_pcie_gen_max"]),
            pcie_width=_bytes(v["gpu_pcie_width"]),
            pcie_width_max=_bytes(v["gpu_pcie_width_max"]),
            process_count=_bytes(v["gpu_processes"]) or 0,
            processes=(),
        )
        out[uuid] = (stats, labels.get("job", ""), labels.get("rank", ""))
    return out
