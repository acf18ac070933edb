"""Cost of one ``auditor serve`` evaluation, by job size: decoding Prometheus' answers, and the
analysis.

The answers Prometheus would give for a DDP job of N ranks (8 per node, one GPU each) over a 60 s
window come from :mod:`tests.helpers.servejob` (the job the serve tests check findings on): the
window aggregates, one value per series, labelled as :func:`auditor.service.promsnapshot.queries`
aggregates them, serialised as Prometheus sends them. One rank is starved, so the rules have
something to find. The scrape interval only changes the sample counts Prometheus reports.

Timed, each as the service runs it:

* ``decode_s``: :meth:`auditor.service.service.AuditService.fetch` -- every query through
  :class:`auditor.metrics.query.PrometheusClient`, whose opener hands back the bodies (no
  network): request building, JSON decoding, the answers' columns.
* ``analysis_s``: :func:`auditor.service.service.analyse_answers` on those decoded answers --
  running-job discovery, snapshot rebuilding and every rule; and the same in its two halves
  (``rebuild_s``, ``rules_s``).

Goals: at most 0.2 s of decoding and 0.2 s of analysis for 4,096 ranks over a 60 s window (both
gated: ``goal_met``), and at most 1 s of the two together for 16,384 ranks (``goal_16384_met``,
where that size is measured). Growth with ranks is reported as microseconds per rank at each size
(flat = linear).

The timed evaluations are the service's steady state: the labels of the answers, and what the
rebuild derives from them alone (the ranks' identities, the GPUs' labels), are kept from one
evaluation to the next while they do not change. The first evaluation of each size, with nothing
kept, is reported apart (``first_s``: decoding and analysis together).

Memory per evaluation (``memory``): one more evaluation, untimed, from a cold start (the client's
label cache and the rebuild's kept identities emptied) under :mod:`tracemalloc`: the peak it
allocated (``peak_mb``: the answers, the snapshot, the rules' working set), and what it left held
once its answers and results were dropped (``retained_mb``: what is kept for the next
evaluation).

    python bench/serve_scale.py [--ranks 64,256,1024,2048,4096,8192] [--scrape 15] [--repeats 5]
    python bench/serve_scale.py --against c91237e [--rounds 3] [--ranks 16384]  # with a commit

``--against REV`` checks ``REV`` out into a temporary worktree and times its serve and this
tree's at ``GOAL_RANKS`` ranks (or the one size ``--ranks`` names) in alternating rounds (each
arm in its own fresh interpreter, ``--repeats`` evaluations a round), so a shared machine's drift
hits both; the ratios go into ``bench/results/serve_scale_against.json``.

Writes bench/results/serve_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.parse
import urllib.request
from typing import Any

import _common as c

# The job's answers are shared with the tests (tests/helpers/servejob.py): one copy.
sys.path.insert(0, c.REPO)

from auditor.metrics.query import PrometheusClient
from auditor.service import promsnapshot
from auditor.service.promsnapshot import build_snapshots, queries
from auditor.service.service import AuditService, analyse_answers, judge, no_cyclic_gc
from tests.helpers.servejob import JOB, WINDOW_S, answers, as_prometheus_json

GOAL_S = 0.2
GOAL_RANKS = 4096
# Decoding and analysis together, at the largest size.
GOAL_16384_S = 1.0


class _Body:
    """An HTTP answer as the client's opener returns it."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> bytes:
        return self._body


def fake_prometheus(raw: dict[str, bytes]) -> PrometheusClient:
    """A client whose every query is answered with its body from ``raw`` (no network)."""
    key_of = {expr: key for key, expr in queries(WINDOW_S).items()}

    def opener(request: urllib.request.Request, timeout: float) -> _Body:
        assert isinstance(request.data, bytes)
        return _Body(raw[key_of[urllib.parse.parse_qs(request.data.decode())["query"][0]]])

    return PrometheusClient("http://prometheus.bench:9090", opener=opener)


def measure(ranks: int, scrape_s: float, repeats: int, *, memory: bool = False) -> dict[str, Any]:
    now = 1_800_000_000.0
    raw = as_prometheus_json(answers(ranks, scrape_s=scrape_s, now=now))
    service = AuditService(fake_prometheus(raw), window_s=WINDOW_S, clock=lambda: now)
    promsnapshot.forget()  # nothing kept from another size
    analysis: list[float] = []
    decoding: list[float] = []
    rebuild: list[float] = []
    rules: list[float] = []
    results: dict[str, Any] = {}
    series = 0
    for _ in range(repeats):
        # As AuditService.evaluate runs them: one pause of the cyclic collector over the fetch
        # and the analysis, the answers freed before it resumes.
        with no_cyclic_gc():
            t0 = time.perf_counter()
            ans = service.fetch(now)
            t1 = time.perf_counter()
            results = analyse_answers(ans, now, window_s=WINDOW_S, stale_after_s=60.0)
            t2 = time.perf_counter()
            decoding.append(t1 - t0)
            analysis.append(t2 - t1)
            # The same analysis in its two halves: the snapshot rebuilt from the answers, and
            # the rules (statistics included) judging it.
            t3 = time.perf_counter()
            snapshot = build_snapshots(ans, now, WINDOW_S, jobs=[JOB])[JOB]
            t4 = time.perf_counter()
            judge(snapshot)
            t5 = time.perf_counter()
            rebuild.append(t4 - t3)
            rules.append(t5 - t4)
            series = sum(len(a) for a in ans.values())
            del ans, snapshot  # freed outside the timings, as the service drops them
    job = results[JOB]
    held = _memory(service, now) if memory else None
    found = sorted({(f.kind, r) for f in job.findings for r in f.ranks if f.severity != "info"})
    median = statistics.median(analysis)
    return {
        "ranks": ranks,
        "scrape_s": scrape_s,
        "series": series,
        "analysis_s": c.summary(analysis),
        "analysis_per_rank_us": round(median / ranks * 1e6, 2),
        "rebuild_s": c.summary(rebuild),
        "rules_s": c.summary(rules),
        "decode_s": c.summary(decoding),
        "decode_per_rank_us": round(statistics.median(decoding) / ranks * 1e6, 2),
        "total_s": round(statistics.median(decoding) + median, 4),
        "total_per_rank_us": round((statistics.median(decoding) + median) / ranks * 1e6, 2),
        # The first evaluation: nothing kept from an earlier one.
        "first_s": round(decoding[0] + analysis[0], 4),
        "answer_bytes": sum(len(b) for b in raw.values()),
        "findings": [f"{k} rank {r}" for k, r in found],
        "memory": held,
    }


def _memory(service: AuditService, now: float) -> dict[str, float]:
    """One evaluation from a cold start (the client's label cache emptied) under tracemalloc,
    numpy's buffers included: the peak it allocated, and what it left held once its answers and
    results were dropped (the label cache), in MB."""
    service.client.labels.clear()
    promsnapshot.forget()
    tracemalloc.start()
    try:
        with no_cyclic_gc():
            ans = service.fetch(now)
            results = analyse_answers(ans, now, window_s=WINDOW_S, stale_after_s=60.0)
            del ans, results
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"peak_mb": round(peak / 2**20, 1), "retained_mb": round(held / 2**20, 1)}


def _arm(tree: str, ranks: int, repeats: int) -> dict[str, float]:
    """One round of one arm: ``tree``'s own benchmark in a fresh interpreter, its medians."""
    code = (
        "import json, os, sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/bench'];"
        "import serve_scale as s, auditor;"
        # Each arm times its own tree's code, not an installed (editable) copy of another.
        "here = os.path.realpath(sys.argv[1]) + os.sep;"
        "assert all(os.path.realpath(m.__file__).startswith(here) for m in (s, auditor)),"
        " (s.__file__, auditor.__file__);"
        "r = s.measure(int(sys.argv[2]), 15.0, int(sys.argv[3]));"
        "print(json.dumps({k: r[k + '_s']['median'] for k in "
        "('analysis', 'rebuild', 'rules', 'decode')}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, tree, str(ranks), str(repeats)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # neither tree on the path but the one named
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def against(rev: str, rounds: int, repeats: int, ranks: int = GOAL_RANKS) -> int:
    """This tree's serve against ``rev``'s, side by side at ``ranks`` ranks."""
    here = c.REPO
    with tempfile.TemporaryDirectory(prefix="serve-against-") as tmp:
        base = os.path.join(tmp, "tree")
        subprocess.run(
            ["git", "-C", here, "worktree", "add", "--detach", "-f", base, rev],
            check=True,
            capture_output=True,
        )
        try:
            arms: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
            for n in range(rounds):
                for arm, tree in (("base", base), ("this", here)):
                    arms[arm].append(_arm(tree, ranks, repeats))
                    print(f"round {n + 1}/{rounds} {arm:4s} {arms[arm][-1]}", flush=True)
        finally:
            subprocess.run(
                ["git", "-C", here, "worktree", "remove", "--force", base], capture_output=True
            )
    for arm in arms.values():
        for r in arm:
            r["total"] = r["decode"] + r["analysis"]
    ratios = {
        k: c.summary([t[k] / b[k] for t, b in zip(arms["this"], arms["base"], strict=True)])
        for k in ("analysis", "rebuild", "rules", "decode", "total")
    }
    path = c.write_result(
        "serve_scale_against",
        {
            "what": f"serve at {ranks} ranks, this tree against {rev}, alternated rounds of "
            f"{repeats} evaluations each (medians per round)",
            "against": rev,
            "loadavg": c.loadavg(),
            "rounds": arms,
            "ratio_this_over_base": ratios,
        },
    )
    for k, r in ratios.items():
        print(f"{k:8s} this/base {c.fmt_ratio(r, 3)}")
    print(f"wrote {c.shown(path)}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--ranks", help="sizes (default 64,256,1024,2048,4096,8192; with --against one size)"
    )
    p.add_argument("--scrape", default="15", help="scrape intervals to try (seconds)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--against", metavar="REV", help="time this tree side by side with REV's")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds with --against")
    args = p.parse_args()
    if args.against:
        return against(args.against, args.rounds, args.repeats, int(args.ranks or GOAL_RANKS))
    rows = []
    for scrape in [float(s) for s in args.scrape.split(",")]:
        for n in [int(r) for r in (args.ranks or "64,256,1024,2048,4096,8192").split(",")]:
            row = measure(n, scrape, args.repeats, memory=True)
            rows.append(row)
            print(
                f"ranks {n:5d}  scrape {scrape:4.0f} s  analysis median "
                f"{row['analysis_s']['median']:.3f} s ({row['analysis_per_rank_us']:.0f} us/rank; "
                f"rebuild {row['rebuild_s']['median']:.3f} s + "
                f"rules {row['rules_s']['median']:.3f} s)  "
                f"decode {row['decode_s']['median']:.3f} s "
                f"({row['decode_per_rank_us']:.0f} us/rank)  "
                f"total {row['total_s']:.3f} s ({row['total_per_rank_us']:.0f} us/rank; "
                f"first {row['first_s']:.3f} s)  "
                f"memory peak {row['memory']['peak_mb']:.0f} MB "
                f"(retained {row['memory']['retained_mb']:.0f} MB)  findings {row['findings']}",
                flush=True,
            )
    at_goal = [r for r in rows if r["ranks"] == GOAL_RANKS]
    worst = max((r["analysis_s"]["median"] for r in at_goal), default=None)
    worst_decode = max((r["decode_s"]["median"] for r in at_goal), default=None)
    met = worst is not None and worst_decode is not None and max(worst, worst_decode) <= GOAL_S
    at_16384 = [r["total_s"] for r in rows if r["ranks"] == 16384]
    met_16384 = max(at_16384) <= GOAL_16384_S if at_16384 else None
    path = c.write_result(
        "serve_scale",
        {
            "goal": f"analysis and decoding of {GOAL_RANKS} ranks over a {WINDOW_S:.0f} s window "
            f"<= {GOAL_S} s each",
            "window_s": WINDOW_S,
            "loadavg": c.loadavg(),
            "rows": rows,
            "worst_4096_s": worst,
            "worst_4096_decode_s": worst_decode,
            "goal_met": met,
            "goal_16384": f"decoding and analysis of 16384 ranks <= {GOAL_16384_S} s together",
            "worst_16384_total_s": max(at_16384) if at_16384 else None,
            "goal_16384_met": met_16384,
        },
    )
    print(
        f"wrote {c.shown(path)}; goal {'met' if met else 'NOT met'}"
        + ("" if met_16384 is None else f"; 16384-rank goal {'met' if met_16384 else 'NOT met'}")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
