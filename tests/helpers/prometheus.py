"""What Prometheus answers the service's queries with, for a canned 2-rank job.

The job: 2 ranks over a 60 s window, 0.25 s steps. Rank ``starved`` (1 by default) is
data-starved (0.15 s of each step waiting for its batch, 5 ms at the all-reduce); the other is fed
and waits 0.15 s for it at the all-reduce. No GPU series.

:func:`job_answers` gives the series per query key of :func:`queries`; :func:`vector` the JSON
body Prometheus sends for them; :data:`KEY_OF` maps a query's text back to its key.
"""

from __future__ import annotations

import math
from typing import Any

from auditor.metrics.query import Series
from auditor.service.promsnapshot import queries, sub_key

WINDOW_S = 60.0
QUERIES = queries(WINDOW_S)
KEY_OF = {expr: key for key, expr in QUERIES.items()}
FIRST_KEY = next(iter(QUERIES))  # each evaluation asks this first

STEP_S = 0.25
STEPS = WINDOW_S / STEP_S  # 240 steps in the window
NODES = {0: "node-a", 1: "node-b"}

Answers = dict[str, list[Series]]


def job_answers(
    job: str,
    now: float,
    *,
    up: tuple[float, float] = (1.0, 1.0),
    seen_age_s: float = 5.0,
    starved: int = 1,
) -> Answers:
    """What Prometheus answers :func:`queries` with for the 2-rank job at ``now``."""
    out: Answers = {key: [] for key in QUERIES}

    def put(key: str, labels: dict[str, str], value: float) -> None:
        out[key].append(Series(labels, ((now, value),)))

    for rank in (0, 1):
        node = NODES[rank]
        base = {"auditor_job": job, "node": node, "rank": str(rank), "local_rank": "0"}
        key = {"auditor_job": job, "rank": str(rank)}
        is_starved = rank == starved
        wait = 0.005 if is_starved else 0.15  # at the all-reduce
        phases = {
            "data_wait": 0.15 if is_starved else 0.002,
            "h2d": 0.004,
            "forward": 0.03,
            "backward": 0.05,  # exclusive: the wait is its own phase
            "optimizer": 0.006,
            "collective_wait": wait,
        }
        put(
            "rank_info",
            {**base, "device": "cuda:0", "parallel_mode": "ddp", "world_size": "2"},
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
        put("config_workers", key, 1.0)
        put("rank_up", key, up[rank])
        put("rank_seen", key, now - seen_age_s)
        put("steps", key, STEPS)
        put("step_seconds", key, STEPS * STEP_S)
        for phase, seconds in phases.items():
            put(sub_key("phase_seconds", phase), key, STEPS * seconds)
        put("samples", key, STEPS * 32)
        for memory, value in (("rss", 6e9), ("allocated", 20e9)):
            put(sub_key("memory", memory), key, value)
        put(sub_key("cpu", "main"), key, 1.0)
        put(sub_key("cpu", "workers"), key, 0.95 if is_starved else 0.4)
        put("workers", key, 1.0)
    for node in NODES.values():
        labels = {"auditor_job": job, "node": node}
        put("node_cores", labels, 32.0)
        put("node_busy", labels, 4.0)
        put("node_load", labels, 3.5)
        put("node_samples", labels, 12.0)
    return out


def merged(*parts: Answers) -> Answers:
    out: Answers = {key: [] for key in QUERIES}
    for part in parts:
        for key, series in part.items():
            out[key].extend(series)
    return out


def value_text(value: float) -> str:
    """Prometheus sends sample values as strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def vector(series: list[Series]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": s.labels, "value": [s.samples[-1][0], value_text(s.samples[-1][1])]}
                for s in series
            ],
        },
    }
