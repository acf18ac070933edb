"""A DDP job of N ranks as ``auditor serve`` and ``auditor run`` would each see it.

One set of figures (:func:`job_figures`: 8 ranks per node, one GPU each, a 60 s window, one
starved rank) rendered two ways:

* :func:`answers`: what Prometheus answers :func:`auditor.service.promsnapshot.queries` with:
  the window aggregates, one value per series, labelled as the queries aggregate them (the GPUs'
  throttle reasons read, none active); :func:`as_prometheus_json` the bodies it sends.
* :func:`live_batches`: the samples the live path's store receives for the same window (one
  step sample per rank standing for the window's steps, GPU reads every scrape interval).

``bench/serve_scale.py`` times serve on the first; ``tests/service/test_serve_scale.py`` checks
both paths reach the same findings.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from auditor.metrics import catalog as C
from auditor.metrics.query import Series
from auditor.samples import (
    Batch,
    DeviceSample,
    LoaderConfig,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)
from auditor.service.promsnapshot import queries, sub_key

WINDOW_S = 60.0
JOB = "bench-job"
NOW = 1_800_000_000.0
STEP_S = 0.25
BATCH = 32
GPU_FIGURES: dict[str, float] = {
    "mem_used": 46e9,
    "mem_total": 141e9,
    "sm_clock": 1.98e9,
    "temperature": 45.0,
    "power": 300.0,
    "power_limit": 700.0,
    "pcie_gen": 5.0,
    "pcie_width": 16.0,
}
MEMORY = {"rss": 6e9, "allocated": 40e9, "reserved": 44e9, "peak": 42e9}


@dataclass(frozen=True)
class RankFigures:
    """One rank's window: ``steps`` steps of ``STEP_S``, seconds per phase over all of them."""

    rank: int
    node: str
    local: int
    starved: bool
    steps: float
    phase_seconds: Mapping[str, float]
    seen: float  # when Prometheus last scraped the rank
    workers_cpu: float
    gpu_util: float

    @property
    def uuid(self) -> str:
        return f"GPU-{self.rank:08x}-0000-0000-0000-000000000000"


def node_of(rank: int) -> str:
    return f"node-{rank // 8:04d}"


def job_figures(
    ranks: int, *, scrape_s: float, now: float = NOW, seed: int = 0
) -> list[RankFigures]:
    """Every rank's figures; rank ``ranks // 2`` is starved (it waits for data, everyone else
    waits for it at the all-reduce)."""
    rng = random.Random(seed)
    out = []
    for rank in range(ranks):
        starved = rank == ranks // 2
        wait = 0.005 if starved else 0.15
        per_step = {
            "data_wait": 0.15 if starved else 0.002,
            "h2d": 0.004,
            "forward": 0.03,
            "backward": 0.05 + wait,
            "optimizer": 0.006,
            "collective_wait": wait,
        }
        # Draw order kept from the first version, so the recorded findings still apply.
        n = WINDOW_S / STEP_S * rng.uniform(0.97, 1.03)
        seen = now - rng.uniform(0, scrape_s)
        phases = {p: n * v * rng.uniform(0.95, 1.05) for p, v in per_step.items()}
        out.append(
            RankFigures(
                rank=rank,
                node=node_of(rank),
                local=rank % 8,
                starved=starved,
                steps=n,
                phase_seconds=phases,
                seen=seen,
                workers_cpu=1.9 if starved else 0.8,
                gpu_util=0.15 if starved else 0.2,
            )
        )
    return out


def answers(
    ranks: int, *, scrape_s: float, now: float = NOW, seed: int = 0
) -> dict[str, list[Series]]:
    """What Prometheus answers :func:`queries` with for ``ranks`` ranks at ``now``."""
    out: dict[str, list[Series]] = {key: [] for key in queries(WINDOW_S)}

    def put(key: str, labels: dict[str, str], value: float) -> None:
        out[key].append(Series(labels, ((now, value),)))

    figures = job_figures(ranks, scrape_s=scrape_s, now=now, seed=seed)
    for f in figures:
        rank = str(f.rank)
        base = {"auditor_job": JOB, "node": f.node, "rank": rank, "local_rank": str(f.local)}
        # Figures come back aggregated by the labels the service reads (see queries()).
        key = {"auditor_job": JOB, "rank": rank}
        n = f.steps
        put(
            "rank_info",
            {**base, "device": f"cuda:{f.local}", "parallel_mode": "ddp", "world_size": str(ranks)},
            1.0,
        )
        put(
            "loader_info",
            {
                **base,
                "pin_memory": "true",
                "persistent_workers": "true",
                "prefetch_factor": "2",
                "batch_size": str(BATCH),
            },
            1.0,
        )
        put("config_workers", key, 2.0)
        put("rank_up", key, 1.0)
        put("rank_seen", key, f.seen)
        put("steps", key, n)
        put("step_seconds", key, n * STEP_S)
        for p, v in f.phase_seconds.items():
            put(sub_key("phase_seconds", p), key, v)
        put("samples", key, n * BATCH)
        put("micro_batches", key, n)  # one DataLoader batch a step: no accumulation
        for memory, value in MEMORY.items():
            if memory == "reserved":
                continue  # not asked for: no rule reads it
            put(sub_key("memory", memory), key, value)
        put(sub_key("cpu", "main"), key, 1.0)
        put(sub_key("cpu", "workers"), key, f.workers_cpu)
        put("workers", key, 2.0)
        gpu = {
            "node": f.node,
            "gpu": str(f.local),
            "uuid": f.uuid,
            "model": "NVIDIA H200",
            "auditor_job": JOB,
            "rank": rank,
        }
        put("gpu_up", gpu, 1.0)
        uuid = {"uuid": f.uuid}
        g = GPU_FIGURES
        for figure, value in (
            ("gpu_samples", WINDOW_S / scrape_s),
            ("gpu_span", WINDOW_S - scrape_s),
            ("gpu_lost", 0.0),
            ("gpu_mem_trend", 0.0),
            ("gpu_mem_recent", 0.0),
            ("gpu_util", f.gpu_util),
            ("gpu_mem_used", g["mem_used"]),
            ("gpu_mem_used_max", g["mem_used"]),
            ("gpu_mem_total", g["mem_total"]),
            ("gpu_sm_clock", g["sm_clock"]),
            ("gpu_sm_clock_max", g["sm_clock"]),
            ("gpu_temperature", g["temperature"]),
            ("gpu_power", g["power"]),
            ("gpu_power_limit", g["power_limit"]),
            ("gpu_pcie_gen", g["pcie_gen"]),
            ("gpu_pcie_gen_max", g["pcie_gen"]),
            ("gpu_pcie_width", g["pcie_width"]),
            ("gpu_pcie_width_max", g["pcie_width"]),
            # The driver reports all 12 reasons; none was active (so gpu_throttle is empty).
            ("gpu_throttle_read", float(len(C.THROTTLE_REASONS))),
        ):
            if figure in out:  # a figure the queries no longer ask for is not answered
                put(figure, uuid, value)
    for node in sorted({f.node for f in figures}):
        labels = {"auditor_job": JOB, "node": node}
        put("node_cores", labels, 96.0)
        put("node_busy", labels, 30.0)
        put("node_load", labels, 28.0)
        put("node_samples", labels, WINDOW_S / scrape_s)
    return out


def as_prometheus_json(ans: Mapping[str, Sequence[Series]]) -> dict[str, bytes]:
    """The body Prometheus sends for each answer (values as strings, as it sends them)."""
    return {
        name: json.dumps(
            {
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [
                        {"metric": s.labels, "value": [s.samples[-1][0], repr(s.samples[-1][1])]}
                        for s in series
                    ],
                },
            }
        ).encode()
        for name, series in ans.items()
    }


def live_batches(ranks: int, *, scrape_s: float, now: float = NOW, seed: int = 0) -> list[Batch]:
    """The same window as the live path's store receives it: per rank its info, one step
    sample standing for the window's steps (their mean), its CPU; per node its CPU; per GPU one
    read every ``scrape_s`` seconds (constant figures, none throttled)."""
    figures = job_figures(ranks, scrape_s=scrape_s, now=now, seed=seed)
    loader = LoaderConfig(
        num_workers=2,
        pin_memory=True,
        prefetch_factor=2,
        persistent_workers=True,
        batch_size=BATCH,
        drop_last=False,
        sampler="",
    )
    reads = [now - WINDOW_S + scrape_s * (i + 1) for i in range(round(WINDOW_S / scrape_s))]
    g = GPU_FIGURES
    batches = []
    for f in figures:
        n = f.steps
        ph = f.phase_seconds
        info = RankInfo(
            rank=f.rank,
            world_size=ranks,
            local_rank=f.local,
            host=f.node,
            device=f"cuda:{f.local}",
            parallel_mode="ddp",
            devices=(f.local,),
            device_uuids=(f.uuid,),
            loader=loader,
            job=JOB,
        )
        step = StepSample(
            rank=f.rank,
            step=1000,
            time=now,
            step_s=STEP_S,
            data_wait_s=ph["data_wait"] / n,
            h2d_s=ph["h2d"] / n,
            forward_s=ph["forward"] / n,
            backward_s=ph["backward"] / n,
            optimizer_s=ph["optimizer"] / n,
            collective_wait_s=ph["collective_wait"] / n,
            batch_size=BATCH,
            rss_bytes=int(MEMORY["rss"]),
            mem_allocated_bytes=int(MEMORY["allocated"]),
            mem_reserved_bytes=int(MEMORY["reserved"]),
            mem_peak_bytes=int(MEMORY["peak"]),
            count=max(1, round(n)),
        )
        cpu = ProcessCpu(
            rank=f.rank,
            time=now,
            pid=0,
            main_cpu=1.0,
            worker_cpu=(f.workers_cpu / 2,) * 2,
            rss_bytes=int(MEMORY["rss"]),
        )
        devices = tuple(
            DeviceSample(
                node=f.node,
                index=f.local,
                uuid=f.uuid,
                time=t,
                model="NVIDIA H200",
                gpu_util=f.gpu_util,
                mem_used_bytes=int(g["mem_used"]),
                mem_total_bytes=int(g["mem_total"]),
                sm_clock_mhz=g["sm_clock"] / 1e6,
                sm_clock_max_mhz=g["sm_clock"] / 1e6,
                throttle_reasons=(),
                power_w=g["power"],
                power_limit_w=g["power_limit"],
                temperature_c=g["temperature"],
                pcie_gen=int(g["pcie_gen"]),
                pcie_gen_max=int(g["pcie_gen"]),
                pcie_width=int(g["pcie_width"]),
                pcie_width_max=int(g["pcie_width"]),
            )
            for t in reads
        )
        batches.append(Batch(infos=(info,), steps=(step,), processes=(cpu,), devices=devices))
    nodes = tuple(
        NodeCpu(host=node, time=now, cores=96.0, busy_cores=30.0, load1=28.0)
        for node in sorted({f.node for f in figures})
    )
    batches.append(Batch(nodes=nodes))
    return batches
