"""``auditor serve``: audits every running job from Prometheus, on a timer, and keeps the result.

One evaluation: ask Prometheus for the window aggregates of the catalog metrics (one instant
query each, all at one "now"), find the running jobs, rebuild each job's snapshot
(:mod:`.promsnapshot`), run the same rules as ``auditor run`` and publish the results at once.

When Prometheus is down, slow or answering errors the evaluation fails as a whole: the previous
results stay published (marked stale by their age, and ``auditor_serve_prometheus_up`` drops to
0), the failure is logged once per outage with the retry delay, and the next attempt comes after
an exponential backoff capped at ``max_backoff_s``. The first success logs the recovery. No
restart is ever needed.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from auditor.audit import Overrides, Verdict, judge
from auditor.metrics.query import PrometheusClient, PrometheusError, Vector

from .promqueries import DCGM
from .promsnapshot import Answers, build_snapshots, queries, running_jobs

DCGM_FIRST = DCGM + "gpu_up"

log = logging.getLogger("auditor.serve")


def analyse_answers(
    answers: Answers,
    now: float,
    *,
    window_s: float,
    stale_after_s: float,
    overrides: Overrides | None = None,
) -> dict[str, Verdict]:
    """The analysis half of an evaluation (what the benchmark times): running jobs, their
    snapshots and verdicts (:func:`auditor.audit.judge`, as every other path), from the
    answers already fetched."""
    with no_cyclic_gc():
        return _analyse(answers, now, window_s, stale_after_s, overrides)


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """An evaluation allocates some 10^5 acyclic objects that live until it ends; the cyclic
    collector kept rescanning them (up to half the time at 4,096 ranks). Reference counting
    still frees everything; the collector resumes afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _analyse(
    answers: Answers,
    now: float,
    window_s: float,
    stale_after_s: float,
    overrides: Overrides | None,
) -> dict[str, Verdict]:
    jobs = [
        j for j, w in running_jobs(answers, now, stale_after_s=stale_after_s).items() if w.running
    ]
    snapshots = build_snapshots(answers, now, window_s, jobs=jobs)
    return {job: judge(snap, overrides) for job, snap in sorted(snapshots.items())}


@dataclass
class Health:
    """The service's own state, exported as ``auditor_serve_*``."""

    prometheus_up: bool = False
    last_success: float | None = None
    last_attempt: float | None = None
    last_error: str | None = None
    evaluation_s: float | None = None
    analysis_s: float | None = None
    evaluations: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    outage_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prometheus_up": self.prometheus_up,
            "last_success": self.last_success,
            "last_attempt": self.last_attempt,
            "last_error": self.last_error,
            "evaluation_seconds": self.evaluation_s,
            "analysis_seconds": self.analysis_s,
            "evaluations": self.evaluations,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
        }


@dataclass(frozen=True)
class Published:
    """What readers (the exporter, the JSON API) see: swapped whole, never edited in place."""

    results: dict[str, Verdict] = field(default_factory=dict)
    health: Health = field(default_factory=Health)


def backoff_s(failures: int, *, base_s: float = 1.0, max_s: float = 60.0) -> float:
    """Delay before the next attempt after ``failures`` consecutive failures: 1, 2, 4 ... max."""
    if failures <= 0:
        return 0.0
    return min(max_s, base_s * 2 ** min(failures - 1, 30))


class AuditService:
    """Evaluates on a timer and publishes :class:`Published` for the HTTP side to read."""

    def __init__(
        self,
        client: PrometheusClient,
        *,
        window_s: float = 60.0,
        interval_s: float = 15.0,
        stale_after_s: float | None = None,
        max_backoff_s: float = 60.0,
        overrides: Overrides | None = None,
        clock: Callable[[], float] = time.time,
        gpu_source: str = "auto",
    ) -> None:
        self.client = client
        self.gpu_source = gpu_source
        self.window_s = window_s
        self.interval_s = interval_s
        # A rank endpoint silent for longer than this is not running (scrapes every 5-15 s).
        self.stale_after_s = stale_after_s if stale_after_s is not None else max(30.0, window_s / 2)
        self.max_backoff_s = max_backoff_s
        self.overrides = overrides or {}
        self._clock = clock
        self._lock = threading.Lock()
        self._published = Published()

    @property
    def published(self) -> Published:
        with self._lock:
            return self._published

    def fetch(self, now: float) -> dict[str, Vector]:
        """Every answer of one evaluation, all evaluated at ``now``, decoded column-wise
        (with the cyclic collector paused, as the analysis: some 10^5 series at 4,096 ranks)."""
        with no_cyclic_gc():
            asked = queries(self.window_s, self.gpu_source)
            answers: dict[str, Vector] = {}
            for key, expr in asked.items():
                if key.startswith(DCGM) and key != DCGM_FIRST and not len(answers[DCGM_FIRST]):
                    # dcgm-exporter's GPUs are asked first of its queries: where Prometheus
                    # has none, the rest are not asked (a fleet of the auditor's monitors).
                    continue
                answers[key] = self.client.vector(expr, at=now)
            return answers

    def evaluate(self) -> Published:
        """One evaluation; on failure the previous results stay and the health says why."""
        now = self._clock()
        started = time.perf_counter()
        old = self.published
        health = Health(**{k: v for k, v in vars(old.health).items()})
        health.last_attempt = now
        try:
            # One pause of the cyclic collector for the whole evaluation, and the answers freed
            # within it: paused for the fetch alone, it resumed with some 10^5 fresh label dicts
            # alive and scanned them all at the analysis' first allocation (~15% of it at 4,096
            # ranks).
            with no_cyclic_gc():
                answers = self.fetch(now)
                fetched = time.perf_counter()
                results = analyse_answers(
                    answers,
                    now,
                    window_s=self.window_s,
                    stale_after_s=self.stale_after_s,
                    overrides=self.overrides,
                )
                del answers
        except Exception as exc:  # a service outlives any one evaluation
            health.prometheus_up = not isinstance(exc, PrometheusError) and health.prometheus_up
            health.failures += 1
            health.consecutive_failures += 1
            health.last_error = str(exc) if isinstance(exc, PrometheusError) else repr(exc)
            if health.outage_since is None:
                health.outage_since = now
            delay = backoff_s(health.consecutive_failures, max_s=self.max_backoff_s)
            if health.consecutive_failures == 1:
                if isinstance(exc, PrometheusError):
                    log.warning("evaluation failed: %s; retrying with backoff", exc)
                else:
                    log.exception("evaluation failed (a bug: please report it)")
            else:
                log.info(
                    "still failing (%d in a row): %s; next try in %.0f s",
                    health.consecutive_failures,
                    health.last_error,
                    delay,
                )
            published = Published(results=old.results, health=health)
        else:
            done = time.perf_counter()
            if health.consecutive_failures:
                log.warning(
                    "%s after %d failed evaluation(s) over %.0f s",
                    "evaluations succeed again"
                    if health.prometheus_up
                    else "Prometheus answers again",
                    health.consecutive_failures,
                    now - (health.outage_since or now),
                )
            health.prometheus_up = True
            health.last_success = now
            health.last_error = None
            health.consecutive_failures = 0
            health.outage_since = None
            health.evaluations += 1
            health.evaluation_s = done - started
            health.analysis_s = done - fetched
            published = Published(results=results, health=health)
        with self._lock:
            self._published = published
        return published

    def next_delay(self) -> float:
        health = self.published.health
        if health.consecutive_failures:
            return backoff_s(health.consecutive_failures, max_s=self.max_backoff_s)
        return self.interval_s

    def run(self, stop: threading.Event) -> None:
        """Evaluate until ``stop`` is set: every ``interval_s``; after failures, on the backoff."""
        while not stop.is_set():
            began = time.monotonic()
            self.evaluate()
            delay = self.next_delay()
            if not self.published.health.consecutive_failures:
                delay = max(0.0, delay - (time.monotonic() - began))
            stop.wait(delay)
