"""What keeping each rank's run over time costs the node: per step and in memory.

The probe sends the same samples as before; the node's sample store now also folds each step
into the rank's history (``auditor.analysis.history``), and each snapshot holds a frozen copy
of it. This measures, in one run and side by side:

* the store's cost per step with the history (``SampleStore.add``) against the same store's
  other work (the window deque and the run's totals: ``RunTotals.add`` plus a deque append),
  as microseconds and as a share of a 28 ms step;
* the history's memory after 10^3 .. 10^6 steps of one rank (bounded: at most 512 buckets);
* the cost of one snapshot's frozen copy per rank (what every live verdict pays).

    python bench/history_cost.py [--steps 200000] [--repeats 5]

Results go to ``bench/results/history_cost.json`` (``BENCH_RESULTS_DIR`` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any

from auditor.analysis.accounting import RunTotals
from auditor.analysis.history import RankHistory
from auditor.analysis.snapshot import SampleStore
from auditor.samples import Batch, StepSample

STEP_S = 0.028


def _steps(n: int) -> list[StepSample]:
    return [
        StepSample(
            rank=0,
            step=i,
            time=1e9 + STEP_S * (i + 1),
            step_s=STEP_S,
            data_wait_s=0.001,
            forward_s=0.008,
            backward_s=0.012,
            optimizer_s=0.002,
            collective_wait_s=0.003,
            rss_bytes=2_000_000_000 + 1024 * i,
        )
        for i in range(n)
    ]


def _per_step_us(fn: Any, steps: list[StepSample]) -> float:
    t0 = time.perf_counter()
    fn(steps)
    return (time.perf_counter() - t0) / len(steps) * 1e6


def _store(steps: list[StepSample]) -> None:
    store = SampleStore("bench")
    for s in steps:
        store.add(Batch(steps=(s,)))


def _without_history(steps: list[StepSample]) -> None:
    # The store's per-step work before the history: the window deque and the run's totals,
    # behind the same Batch and loop.
    window: deque[StepSample] = deque(maxlen=20_000)
    totals = RunTotals()
    count: dict[int, int] = {}
    for s in steps:
        b = Batch(steps=(s,))
        for x in b.steps:
            window.append(x)
            count[x.rank] = count.get(x.rank, 0) + 1
            totals.add(x)


def _history_only(steps: list[StepSample]) -> None:
    h = RankHistory(0)
    for s in steps:
        h.add(s)


def _memory(n: int) -> int:
    steps = _steps(n)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    h = RankHistory.of(0, steps)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(h.buckets) <= 512
    return after - before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    steps = _steps(args.steps)
    rounds: dict[str, list[float]] = {"store": [], "without_history": [], "history": []}
    for _ in range(args.repeats):
        # Alternated within each round: the machine's load hits every arm alike.
        rounds["without_history"].append(_per_step_us(_without_history, steps))
        rounds["store"].append(_per_step_us(_store, steps))
        rounds["history"].append(_per_step_us(_history_only, steps))
    med = {k: statistics.median(v) for k, v in rounds.items()}
    hist = RankHistory.of(0, steps)
    t0 = time.perf_counter()
    copies = 50
    for _ in range(copies):
        hist.frozen()
    frozen_ms = (time.perf_counter() - t0) / copies * 1e3
    memory = {str(n): _memory(n) for n in (1_000, 10_000, 100_000, 1_000_000)}
    out = {
        "steps": args.steps,
        "repeats": args.repeats,
        "per_step_us": {k: round(v, 2) for k, v in med.items()},
        "history_share_of_28ms_step": round(med["history"] * 1e-6 / STEP_S, 6),
        "store_over_without_history": round(med["store"] / med["without_history"], 2),
        "frozen_copy_ms_per_rank": round(frozen_ms, 3),
        "history_bytes_after_steps": memory,
    }
    print(json.dumps(out, indent=2))
    results = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).parent / "results")
    results.mkdir(parents=True, exist_ok=True)
    (results / "history_cost.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
