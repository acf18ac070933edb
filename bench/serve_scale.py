"""Analysis cost of one ``auditor serve`` evaluation, by job size.

The answers Prometheus would give for a DDP job of N ranks (8 per node, one GPU each) over a 60 s
window are generated in memory, in the exact shape :class:`auditor.metrics.query.PrometheusClient`
returns for :func:`auditor.service.promsnapshot.queries`: the window aggregates, one value per
series, labelled as the queries aggregate them (the GPUs' throttle reasons read, none active).
One rank is starved, so the rules have something to find. The scrape interval only changes the
sample counts Prometheus reports.

Timed: :func:`auditor.service.service.analyse_answers` -- running-job discovery, snapshot
rebuilding and every rule -- which is the service's analysis. Decoding is timed separately
(``decode_s``: ``json.loads`` of the answers serialised as Prometheus sends them, plus their
conversion to Series) and reported, not gated.

Goal: at most 0.2 s of analysis for 4,096 ranks over a 60 s window. Growth with ranks is reported
as microseconds per rank at each size (flat = linear).

    python bench/serve_scale.py [--ranks 64,256,1024,2048,4096] [--scrape 15] [--repeats 5]

Writes bench/results/serve_scale.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import _common as c

from auditor.metrics import catalog as C
from auditor.metrics.query import Series
from auditor.service.promsnapshot import build_snapshots, queries
from auditor.service.service import analyse_answers, judge, no_cyclic_gc

GOAL_S = 0.2
WINDOW_S = 60.0
JOB = "bench-job"


def answers(ranks: int, *, scrape_s: float, now: float, seed: int = 0) -> dict[str, list[Series]]:
    """What Prometheus answers :func:`queries` with for ``ranks`` ranks at ``now``: one value
    per series (the window aggregates), every label as the node endpoints export it."""
    rng = random.Random(seed)
    out: dict[str, list[Series]] = {key: [] for key in queries(WINDOW_S)}

    def put(key: str, labels: dict[str, str], value: float) -> None:
        out[key].append(Series(labels, ((now, value),)))

    step_s = 0.25
    for rank in range(ranks):
        node = f"node-{rank // 8:04d}"
        local = rank % 8
        base = {"job": JOB, "node": node, "rank": str(rank), "local_rank": str(local)}
        # Figures come back aggregated by the labels the service reads (see queries()).
        key = {"job": JOB, "rank": str(rank)}
        starved = rank == ranks // 2
        # Per step: a starved rank waits for data; everyone else waits for it at the all-reduce.
        wait = 0.005 if starved else 0.15
        phases = {
            "data_wait": 0.15 if starved else 0.002,
            "h2d": 0.004,
            "forward": 0.03,
            "backward": 0.05 + wait,
            "optimizer": 0.006,
            "collective_wait": wait,
        }
        n = WINDOW_S / step_s * rng.uniform(0.97, 1.03)
        put(
            "rank_info",
            {**base, "device": f"cuda:{local}", "parallel_mode": "ddp", "world_size": str(ranks)},
            1.0,
        )
        put(
            "loader_info",
            {
                **base,
                "pin_memory": "true",
                "persistent_workers": "true",
                "prefetch_factor": "2",
                "batch_size": "32",
            },
            1.0,
        )
        put("config_workers", key, 2.0)
        put("rank_up", key, 1.0)
        put("rank_seen", key, now - rng.uniform(0, scrape_s))
        put("steps", key, n)
        put("step_seconds", key, n * step_s)
        for p, v in phases.items():
            put("phase_seconds", {**key, "phase": p}, n * v * rng.uniform(0.95, 1.05))
        put("samples", key, n * 32)
        put("steps_total", key, 1000 + n)
        for memory, value in (
            ("rss", 6e9),
            ("allocated", 40e9),
            ("reserved", 44e9),
            ("peak", 42e9),
        ):
            put("memory", {**key, "memory": memory}, value)
        put("cpu", {**key, "process": "main"}, 1.0)
        put("cpu", {**key, "process": "workers"}, 1.9 if starved else 0.8)
        put("workers", key, 2.0)
        gpu = {
            "node": node,
            "gpu": str(local),
            "uuid": f"GPU-{rank:08x}-0000-0000-0000-000000000000",
            "model": "NVIDIA H200",
            "job": JOB,
            "rank": str(rank),
        }
        put("gpu_up", gpu, 1.0)
        uuid = {"uuid": gpu["uuid"]}
        for figure, value in (
            ("gpu_samples", WINDOW_S / scrape_s),
            ("gpu_first", now - WINDOW_S + scrape_s),
            ("gpu_last", now),
            ("gpu_lost", 0.0),
            ("gpu_mem_trend", 0.0),
            ("gpu_mem_recent", 0.0),
            ("gpu_util", 0.15 if starved else 0.2),
            ("gpu_mem_used", 46e9),
            ("gpu_mem_used_max", 46e9),
            ("gpu_mem_total", 141e9),
            ("gpu_sm_clock", 1.98e9),
            ("gpu_sm_clock_max", 1.98e9),
            ("gpu_temperature", 45.0),
            ("gpu_power", 300.0),
            ("gpu_power_limit", 700.0),
            ("gpu_pcie_gen", 5.0),
            ("gpu_pcie_gen_max", 5.0),
            ("gpu_pcie_width", 16.0),
            ("gpu_pcie_width_max", 16.0),
            ("gpu_processes", 1.0),
            # The driver reports all 12 reasons; none was active (so gpu_throttle is empty).
            ("gpu_throttle_read", float(len(C.THROTTLE_REASONS))),
        ):
            put(figure, uuid, value)
    for node in sorted({f"node-{r // 8:04d}" for r in range(ranks)}):
        labels = {"job": JOB, "node": node}
        put("node_cores", labels, 96.0)
        put("node_busy", labels, 30.0)
        put("node_load", labels, 28.0)
        put("node_samples", labels, WINDOW_S / scrape_s)
    return out


def as_prometheus_json(ans: dict[str, list[Series]]) -> dict[str, bytes]:
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


def decode(raw: dict[str, bytes]) -> int:
    n = 0
    for body in raw.values():
        result = json.loads(body)["data"]["result"]
        series = [
            Series(dict(r["metric"]), ((float(r["value"][0]), float(r["value"][1])),))
            for r in result
        ]
        n += len(series)
    return n


def measure(ranks: int, scrape_s: float, repeats: int) -> dict[str, Any]:
    now = 1_800_000_000.0
    ans = answers(ranks, scrape_s=scrape_s, now=now)
    raw = as_prometheus_json(ans)
    analysis: list[float] = []
    decoding: list[float] = []
    rebuild: list[float] = []
    rules: list[float] = []
    results: dict[str, Any] = {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        with no_cyclic_gc():  # as the service decodes (AuditService.fetch)
            decode(raw)
        t1 = time.perf_counter()
        results = analyse_answers(ans, now, window_s=WINDOW_S, stale_after_s=60.0)
        t2 = time.perf_counter()
        decoding.append(t1 - t0)
        analysis.append(t2 - t1)
        # The same analysis in its two halves: the snapshot rebuilt from the answers, and the
        # rules (statistics included) judging it.
        with no_cyclic_gc():
            t3 = time.perf_counter()
            snapshot = build_snapshots(ans, now, WINDOW_S, jobs=[JOB])[JOB]
            t4 = time.perf_counter()
            judge(snapshot)
            t5 = time.perf_counter()
        rebuild.append(t4 - t3)
        rules.append(t5 - t4)
    job = results[JOB]
    found = sorted({(f.kind, r) for f in job.findings for r in f.ranks if f.severity != "info"})
    median = statistics.median(analysis)
    return {
        "ranks": ranks,
        "scrape_s": scrape_s,
        "series": sum(len(series) for series in ans.values()),
        "analysis_s": c.summary(analysis),
        "analysis_per_rank_us": round(median / ranks * 1e6, 2),
        "rebuild_s": c.summary(rebuild),
        "rules_s": c.summary(rules),
        "decode_s": c.summary(decoding),
        "answer_bytes": sum(len(b) for b in raw.values()),
        "findings": [f"{k} rank {r}" for k, r in found],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="64,256,1024,2048,4096")
    p.add_argument("--scrape", default="15", help="scrape intervals to try (seconds)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    rows = []
    for scrape in [float(s) for s in args.scrape.split(",")]:
        for n in [int(r) for r in args.ranks.split(",")]:
            row = measure(n, scrape, args.repeats)
            rows.append(row)
            print(
                f"ranks {n:5d}  scrape {scrape:4.0f} s  analysis median "
                f"{row['analysis_s']['median']:.3f} s ({row['analysis_per_rank_us']:.0f} us/rank; "
                f"rebuild {row['rebuild_s']['median']:.3f} s + "
                f"rules {row['rules_s']['median']:.3f} s)  "
                f"decode {row['decode_s']['median']:.3f} s  findings {row['findings']}",
                flush=True,
            )
    at_goal = [r for r in rows if r["ranks"] == 4096]
    worst = max((r["analysis_s"]["median"] for r in at_goal), default=None)
    path = c.write_result(
        "serve_scale",
        {
            "goal": f"analysis of 4096 ranks over a {WINDOW_S:.0f} s window <= {GOAL_S} s",
            "window_s": WINDOW_S,
            "rows": rows,
            "worst_4096_s": worst,
            "goal_met": worst is not None and worst <= GOAL_S,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
