"""AuditService end to end over a fake Prometheus: answers in, published verdicts and health out.

The fake is the client's opener: it reads the form-encoded query from each request, maps it back
to its key in :func:`queries` and answers with the JSON Prometheus would send for canned
:class:`Series` (or fails like an unreachable server). The clock is injected, so outages,
backoff and staleness are driven by hand; nothing sleeps.

The job (:func:`tests.helpers.prometheus.job_answers`): 2 ranks over a 60 s window, 0.25 s steps.
Rank 1 is data-starved (0.15 s of each step waiting for its batch, 5 ms at the all-reduce); rank 0
is fed and waits 0.15 s for rank 1 at the all-reduce. No GPU series: the rules under test here
read the ranks.
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from auditor.audit import Overrides, Verdict, imbalance_ratio
from auditor.cli.options import parse_overrides
from auditor.metrics.query import PrometheusClient
from auditor.report.phrasing import phrase
from auditor.service.promqueries import DCGM
from auditor.service.promsnapshot import build_snapshots
from auditor.service.service import DCGM_FIRST, AuditService, analyse_answers, backoff_s
from tests.helpers.clocks import Clock
from tests.helpers.prometheus import (
    FIRST_KEY,
    KEY_OF,
    NODES,
    QUERIES,
    WINDOW_S,
    Answers,
    job_answers,
    merged,
    vector,
)

URL = "http://prom.test:9090"
STALE_AFTER_S = 30.0
MAX_BACKOFF_S = 4.0
T0 = 1_800_000_000.0


class _Answer:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> bytes:
        return self._body


class FakePrometheus:
    """The client's opener. ``fail`` > 0: that many requests are refused; ``raw`` answers a key
    with a payload of its own; ``on_evaluation(n)`` runs as the n-th evaluation starts."""

    def __init__(self, answers: Answers) -> None:
        self.answers = answers
        self.raw: dict[str, Any] = {}
        self.fail = 0
        self.forms: list[dict[str, list[str]]] = []
        self.evaluations = 0
        self.on_evaluation: Callable[[int], None] | None = None

    def __call__(self, request: urllib.request.Request, timeout: float) -> _Answer:
        assert request.get_method() == "POST"
        assert request.full_url == URL + "/api/v1/query"
        assert isinstance(request.data, bytes)
        form = urllib.parse.parse_qs(request.data.decode())
        self.forms.append(form)
        key = KEY_OF[form["query"][0]]
        if key == FIRST_KEY:
            self.evaluations += 1
            if self.on_evaluation is not None:
                self.on_evaluation(self.evaluations)
        if self.fail:
            self.fail -= 1
            raise urllib.error.URLError(
                ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
            )
        payload = self.raw[key] if key in self.raw else vector(self.answers.get(key, []))
        return _Answer(json.dumps(payload).encode())


def make_service(
    fake: FakePrometheus,
    clock: Clock,
    *,
    overrides: Overrides | None = None,
    interval_s: float = 15.0,
    max_backoff_s: float = MAX_BACKOFF_S,
) -> AuditService:
    return AuditService(
        PrometheusClient(URL, opener=fake),
        window_s=WINDOW_S,
        interval_s=interval_s,
        stale_after_s=STALE_AFTER_S,
        max_backoff_s=max_backoff_s,
        overrides=overrides,
        clock=clock,
    )


def serve_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "auditor.serve"]


def starvation(result: Verdict) -> list[tuple[int, ...]]:
    return [f.ranks for f in result.findings if f.kind == "data_starvation"]


# ------------------------------------------------------------------------------------------------


def test_evaluation_publishes_the_starved_rank() -> None:
    clock = Clock(T0)
    fake = FakePrometheus(job_answers("train", T0))
    service = make_service(fake, clock)
    published = service.evaluate()
    assert service.published is published

    assert list(published.results) == ["train"]
    result = published.results["train"]
    assert (result.job, result.ranks, result.world_size) == ("train", 2, 2)
    assert result.nodes == NODES
    assert result.window == (T0 - WINDOW_S, T0)
    [finding] = [f for f in result.findings if f.kind == "data_starvation"]
    assert finding.ranks == (1,)
    # 1 worker loads a batch per 0.25 s step; the pace without stalls is 0.098 s (rank 0's
    # own work): ceil(1.25 * 0.25 / 0.098) = 4 workers, and the cores allow them.
    assert phrase(finding).fixes == {1: "num_workers 1 -> 4; expect about 2.4x"}
    assert finding.predicted_speedup == pytest.approx(2.381, abs=1e-3)
    assert finding.severity == "critical"
    assert result.predicted_speedup == max(
        f.predicted_speedup for f in result.findings if f.predicted_speedup is not None
    )
    # local step = step - all-reduce wait: rank 0 0.10 s, rank 1 0.245 s
    assert result.imbalance_ratio == pytest.approx(1 - 0.10 / 0.245)
    assert result.imbalance_ratio is not None and 0 < result.imbalance_ratio < 1

    health = published.health
    assert health.evaluations == 1
    assert health.prometheus_up is True
    assert health.last_success == T0 and health.last_attempt == T0
    assert health.last_error is None
    assert (health.failures, health.consecutive_failures) == (0, 0)
    assert health.evaluation_s is not None and health.analysis_s is not None
    assert 0 <= health.analysis_s <= health.evaluation_s

    # One query per key, all evaluated at the one "now" of the evaluation.
    # (Of dcgm-exporter's queries only the first: Prometheus has no DCGM series here.)
    asked = [k for k in QUERIES if not k.startswith(DCGM) or k == DCGM_FIRST]
    assert sorted(KEY_OF[f["query"][0]] for f in fake.forms) == sorted(asked)
    assert {f["time"][0] for f in fake.forms} == {f"{T0:.3f}"}
    assert service.client.requests == len(asked)


def test_published_job_serialises_to_json() -> None:
    """The HTTP side serves to_dict(); the rules' evidence must survive json.dumps."""
    result = analyse_answers(
        job_answers("train", T0), T0, window_s=WINDOW_S, stale_after_s=STALE_AFTER_S
    )["train"]
    document = json.loads(json.dumps(result.to_dict()))
    assert document["job"] == "train"
    assert document["window"] == {"start": T0 - WINDOW_S, "end": T0}
    assert document["imbalance_ratio"] == round(1 - 0.10 / 0.245, 4)
    [starved] = [f for f in document["findings"] if f["kind"] == "data_starvation"]
    assert starved["ranks"] == [1]
    assert list(starved["fixes"]) == ["1"]
    assert starved["nodes"] == {"1": "node-b"}
    assert starved["job"] == "train"


def test_ended_and_silent_jobs_are_not_published() -> None:
    answers = merged(
        job_answers("train", T0),
        job_answers("ended", T0, up=(0.0, 0.0)),
        job_answers("silent", T0, seen_age_s=STALE_AFTER_S + 1),
        job_answers("half-ended", T0, up=(1.0, 0.0)),
    )
    # Each has a full window of steps: only being not running keeps a job out.
    assert set(build_snapshots(answers, T0, WINDOW_S)) == {"train", "ended", "silent", "half-ended"}
    service = make_service(FakePrometheus(answers), Clock(T0))
    published = service.evaluate()
    assert sorted(published.results) == ["half-ended", "train"]
    assert starvation(published.results["train"]) == [(1,)]


def test_outage_keeps_results_backs_off_logs_once_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="auditor.serve")
    clock = Clock(T0)
    fake = FakePrometheus(job_answers("train", T0))
    service = make_service(fake, clock)
    before = service.evaluate()
    assert service.next_delay() == 15.0
    assert serve_records(caplog) == []

    fake.fail = 4
    outage_start = clock.t = T0 + 15.0
    delays: list[float] = []
    for n in range(1, 5):
        published = service.evaluate()
        health = published.health
        assert published.results is before.results  # the last verdicts stay served
        assert health.prometheus_up is False
        assert (health.failures, health.consecutive_failures) == (n, n)
        assert health.evaluations == 1
        assert health.last_success == T0
        assert health.last_attempt == clock.t
        assert health.last_error == f"{URL} unreachable: [Errno 111] Connection refused"
        delay = service.next_delay()
        assert delay == backoff_s(n, max_s=MAX_BACKOFF_S)
        delays.append(delay)
        clock.t += delay
    assert delays == [1.0, 2.0, 4.0, 4.0]
    records = serve_records(caplog)
    assert [r.levelno for r in records] == [logging.WARNING] + [logging.INFO] * 3
    assert URL in records[0].getMessage()
    assert "retrying" in records[0].getMessage()
    assert [r.getMessage().split(":")[0] for r in records[1:]] == [
        f"still failing ({n} in a row)" for n in (2, 3, 4)
    ]

    # Prometheus is back, and a second job has started meanwhile.
    caplog.clear()
    fake.answers = merged(job_answers("train", clock.t), job_answers("other", clock.t))
    published = service.evaluate()
    health = published.health
    assert sorted(published.results) == ["other", "train"]
    assert health.prometheus_up is True
    assert health.consecutive_failures == 0
    assert health.failures == 4  # a counter: it never goes back
    assert health.evaluations == 2
    assert health.last_success == clock.t
    assert health.last_error is None
    assert service.next_delay() == 15.0
    [record] = serve_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"Prometheus answers again after 4 failed evaluation(s) over {clock.t - outage_start:.0f} s"
    )

    # A later outage is a new one: logged again.
    caplog.clear()
    fake.fail = 1
    service.evaluate()
    assert [r.levelno for r in serve_records(caplog)] == [logging.WARNING]
    assert service.published.health.consecutive_failures == 1


def test_prometheus_down_from_the_start_publishes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="auditor.serve")
    fake = FakePrometheus(job_answers("train", T0))
    fake.fail = 1
    published = make_service(fake, Clock(T0)).evaluate()
    assert published.results == {}
    assert published.health.last_success is None
    assert published.health.prometheus_up is False
    assert published.health.last_error is not None and URL in published.health.last_error
    assert [r.levelno for r in serve_records(caplog)] == [logging.WARNING]


def test_a_bug_in_the_analysis_is_logged_once_with_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="auditor.serve")
    clock = Clock(T0)
    fake = FakePrometheus(job_answers("train", T0))
    service = make_service(fake, clock)
    before = service.evaluate()

    # A label that is not a string (Prometheus never sends one): the snapshot builder trips.
    fake.raw["rank_info"] = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {"auditor_job": "train", "rank": "0", "world_size": ["2"]},
                    "value": [T0, "1"],
                }
            ],
        },
    }
    for n in (1, 2):
        clock.t += 15.0
        fake.answers = job_answers("train", clock.t)  # the job still runs
        published = service.evaluate()
        assert published.results is before.results
        assert published.health.prometheus_up is True  # Prometheus did answer
        assert published.health.consecutive_failures == n
        assert published.health.last_error is not None
        assert published.health.last_error.startswith("TypeError(")
    records = serve_records(caplog)
    assert [r.levelno for r in records] == [logging.ERROR, logging.INFO]
    assert records[0].exc_info is not None and records[0].exc_info[0] is TypeError
    assert records[1].exc_info is None

    del fake.raw["rank_info"]
    clock.t += service.next_delay()
    fake.answers = job_answers("train", clock.t)
    published = service.evaluate()
    assert published.health.consecutive_failures == 0
    assert published.health.last_success == clock.t
    assert starvation(published.results["train"]) == [(1,)]


@pytest.mark.parametrize("trouble", ["none", "down", "bug"])
def test_run_returns_once_stopped(trouble: str) -> None:
    """run() keeps evaluating through failures and returns when the stop is set; the stop is
    set by the fake as the 3rd evaluation starts, so exactly 3 happen."""
    fake = FakePrometheus(job_answers("train", T0))
    if trouble == "down":
        fake.fail = 10**6
    elif trouble == "bug":
        fake.raw["steps"] = {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": {"auditor_job": "x"}, "values": []}],
            },
        }
    stop = threading.Event()
    fake.on_evaluation = lambda n: stop.set() if n == 3 else None
    # Intervals and backoff far below a millisecond: the loop never waits in earnest.
    service = make_service(fake, Clock(T0), interval_s=1e-4, max_backoff_s=1e-4)
    runner = threading.Thread(target=service.run, args=(stop,), daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive()
    health = service.published.health
    assert fake.evaluations == 3
    if trouble == "none":
        assert (health.evaluations, health.failures) == (3, 0)
    else:
        assert (health.evaluations, health.failures) == (0, 3)


def test_run_returns_at_once_when_already_stopped() -> None:
    fake = FakePrometheus(job_answers("train", T0))
    stop = threading.Event()
    stop.set()
    make_service(fake, Clock(T0)).run(stop)
    assert fake.evaluations == 0


def test_set_overrides_reach_the_rules() -> None:
    overrides = parse_overrides("data_starvation.min_wait_ratio=0.99")
    assert overrides == {"data_starvation": {"min_wait_ratio": 0.99}}
    answers = job_answers("train", T0)
    plain = make_service(FakePrometheus(answers), Clock(T0)).evaluate()
    assert starvation(plain.results["train"]) == [(1,)]
    strict = make_service(FakePrometheus(answers), Clock(T0), overrides=overrides).evaluate()
    assert starvation(strict.results["train"]) == []
    assert strict.health.evaluations == 1


def test_the_starved_rank_is_the_one_blamed() -> None:
    """Swap the roles: the verdict follows the data, not the rank number."""
    results = analyse_answers(
        job_answers("train", T0, starved=0), T0, window_s=WINDOW_S, stale_after_s=STALE_AFTER_S
    )
    assert starvation(results["train"]) == [(0,)]


def test_imbalance_ratio_needs_two_ranks_with_steps() -> None:
    answers = job_answers("train", T0)
    snapshot = build_snapshots(answers, T0, WINDOW_S)["train"]
    assert imbalance_ratio(snapshot) == pytest.approx(1 - 0.10 / 0.245)
    # Rank 1 finished no step in the window: nothing to compare rank 0 with.
    answers["steps"] = [s for s in answers["steps"] if s.labels["rank"] == "0"]
    snapshot = build_snapshots(answers, T0, WINDOW_S)["train"]
    assert imbalance_ratio(snapshot) is None


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.0), (1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 60.0), (10**6, 60.0)],
)
def test_backoff_doubles_up_to_the_cap(failures: int, expected: float) -> None:
    assert backoff_s(failures) == expected


def test_backoff_honours_base_and_cap() -> None:
    assert [backoff_s(n, base_s=0.5, max_s=3.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
