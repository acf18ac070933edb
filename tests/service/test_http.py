"""ServiceServer over a hand-built Published: /metrics series, the JSON API and /healthz.

The published state and the clock are plain holders the test swaps, as the service swaps its
Published after each evaluation; every request goes over a real socket.
"""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.analysis.findings import Finding
from auditor.analysis.loading import CPU
from auditor.analysis.rules import data_starvation
from auditor.analysis.rules.hardware_straggler import Facts, LowClock, SlowGpu
from auditor.audit import Verdict
from auditor.service.http import ENDPOINTS, ServiceServer
from auditor.service.service import Health, Published
from tests.helpers.tools import require_tool

T0 = 1_800_000_000.0
STALE_AFTER_S = 120.0
JOB = "vision/resnet 50"  # a slash and a space: must be URL-encoded in /api/v1/jobs/JOB
JOB_URL = "vision%2Fresnet%2050"
PROM = "http://127.0.0.1:9090"

STARVED = Finding(
    kind="data_starvation",
    severity="critical",
    ranks=(1,),
    facts=data_starvation.Facts(
        ranks={
            1: data_starvation.StarvedRank(
                num_workers=1,
                workers=8,
                limited_by=None,
                loading=CPU,
                loading_cores=0.9,
                set_pin_memory=False,
                set_persistent_workers=False,
            )
        },
        worst=data_starvation.Wait(rank=1, data_wait_s=0.150, step_s=0.250, data_wait_ratio=0.6),
        peers=None,
        cheaper_factor=2.0,
    ),
    evidence={"job_pace_ms": 98.0},
    predicted_speedup=4.2,
)


def hot_gpu(node: str, index: int) -> SlowGpu:
    """A GPU that slows down for heat, at a lower SM clock than its peers'."""
    return SlowGpu(
        label=f"{node} GPU {index}",
        uuid=f"GPU-{node}-{index}",
        index=index,
        node=node,
        slowdowns=(LowClock(ratio=0.7, mhz=1400.0, peer_ratio=0.95),),
        thermal=True,
        temperature_c=88.0,
        power=False,
        power_limit=None,
        hw_slowdown=False,
        pcie_degraded=False,
        pcie="gen 5/5 x16/16",
        compute_s=0.14,
    )


STRAGGLER = Finding(
    kind="hardware_straggler",
    severity="warning",
    ranks=(0, 2),
    facts=Facts({2: hot_gpu("node-c", 2), 0: hot_gpu("node-a", 0)}),
    predicted_speedup=1.2,
)
HEADROOM = Finding(
    kind="memory_headroom",
    severity="info",
    ranks=(),
)


def healthy(**changes: Any) -> Health:
    values: dict[str, Any] = {
        "prometheus_up": True,
        "last_success": T0,
        "last_attempt": T0,
        "evaluation_s": 0.5,
        "analysis_s": 0.125,
        "evaluations": 7,
        "failures": 2,
    }
    values.update(changes)
    return Health(**values)


def published(health: Health | None = None) -> Published:
    train = Verdict(
        job=JOB,
        ranks=3,
        world_size=4,
        nodes={0: "node-a", 1: "node-b", 2: "node-c"},
        # Not in order of severity: the findings endpoint sorts.
        findings=(HEADROOM, STRAGGLER, STARVED),
        imbalance_ratio=0.59,
        window=(T0 - 60.0, T0),
    )
    quiet = Verdict(
        job="quiet",
        ranks=1,
        world_size=1,
        nodes={0: "node-z"},
        findings=(),
        imbalance_ratio=None,  # one rank: nothing to compare
        window=(T0 - 60.0, T0),
    )
    return Published(results={JOB: train, "quiet": quiet}, health=health or healthy())


@dataclass
class State:
    published: Published
    now: float = T0 + 10.0


@dataclass
class Service:
    state: State
    server: ServiceServer

    def get(self, path: str) -> tuple[int, str, bytes]:
        try:
            with urllib.request.urlopen(self.server.url + path, timeout=10) as response:
                return response.status, response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.headers["Content-Type"], exc.read()

    def json(self, path: str, status: int = 200) -> Any:
        code, content_type, body = self.get(path)
        assert code == status, body
        assert content_type == "application/json"
        return json.loads(body)


@pytest.fixture(scope="module")
def running() -> Iterator[Service]:
    """One server for the module (each stop waits out serve_forever's poll interval)."""
    state = State(published())
    server = ServiceServer(
        lambda: state.published, clock=lambda: state.now, stale_after_s=STALE_AFTER_S
    ).start()
    try:
        yield Service(state, server)
    finally:
        server.stop()


@pytest.fixture
def service(running: Service) -> Service:
    """The module's server, its state and clock back to the defaults."""
    running.state.published = published()
    running.state.now = T0 + 10.0
    return running


Key = tuple[str, tuple[tuple[str, str], ...]]


def samples(text: str) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = s.value
    return out


def of(series: dict[Key, float], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in series.items() if n == name}


def labels(**kv: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kv.items()))


# --- /metrics ------------------------------------------------------------------------------------


def metrics_text(service: Service) -> str:
    code, content_type, body = service.get("/metrics")
    assert code == 200
    assert content_type.startswith("text/plain")
    return body.decode()


def test_metrics_has_exactly_the_findings_series(service: Service) -> None:
    series = samples(metrics_text(service))
    assert of(series, "auditor_finding") == {
        labels(
            auditor_job=JOB, kind="data_starvation", rank="1", node="node-b", severity="critical"
        ): 1,
        labels(
            auditor_job=JOB, kind="hardware_straggler", rank="0", node="node-a", severity="warning"
        ): 1,
        labels(
            auditor_job=JOB, kind="hardware_straggler", rank="2", node="node-c", severity="warning"
        ): 1,
        labels(auditor_job=JOB, kind="memory_headroom", rank="", node="", severity="info"): 1,
    }
    assert of(series, "auditor_finding_predicted_speedup") == {
        labels(auditor_job=JOB, kind="data_starvation", rank="1"): 4.2,
        labels(auditor_job=JOB, kind="hardware_straggler", rank="0"): 1.2,
        labels(auditor_job=JOB, kind="hardware_straggler", rank="2"): 1.2,
    }


def test_metrics_has_the_per_job_series(service: Service) -> None:
    series = samples(metrics_text(service))
    assert of(series, "auditor_job_ranks") == {
        labels(auditor_job=JOB): 3,
        labels(auditor_job="quiet"): 1,
    }
    assert of(series, "auditor_job_predicted_speedup") == {
        labels(auditor_job=JOB): 4.2,
        labels(auditor_job="quiet"): 1.0,
    }
    # A job of one rank has no imbalance: no series rather than a made-up 0.
    assert of(series, "auditor_job_imbalance_ratio") == {labels(auditor_job=JOB): 0.59}


def test_metrics_has_the_service_health(service: Service) -> None:
    series = samples(metrics_text(service))
    service_own = {n: v for (n, lbl), v in series.items() if n.startswith("auditor_serve_")}
    assert service_own == {
        "auditor_serve_prometheus_up": 1,
        "auditor_serve_last_evaluation_timestamp_seconds": T0,
        "auditor_serve_evaluation_seconds": 0.5,
        "auditor_serve_analysis_seconds": 0.125,
        "auditor_serve_evaluations_total": 7,
        "auditor_serve_failures_total": 2,
        "auditor_serve_jobs": 2,
    }
    assert all(lbl == () for (n, lbl) in series if n.startswith("auditor_serve_"))


def test_metrics_before_the_first_success(service: Service) -> None:
    """No timestamp or durations yet (absent, not 0); Prometheus down reads 0."""
    service.state.published = Published(health=Health(failures=3, last_error="refused"))
    series = samples(metrics_text(service))
    assert {n: v for (n, _), v in series.items()} == {
        "auditor_serve_prometheus_up": 0,
        "auditor_serve_evaluations_total": 0,
        "auditor_serve_failures_total": 3,
        "auditor_serve_jobs": 0,
    }


def test_metrics_follow_the_latest_published_state(service: Service) -> None:
    service.state.published = published(healthy(prometheus_up=False, failures=5))
    series = samples(metrics_text(service))
    assert series[("auditor_serve_prometheus_up", ())] == 0
    assert series[("auditor_serve_failures_total", ())] == 5


def test_metrics_pass_promtool(service: Service) -> None:
    promtool = require_tool("promtool")
    proc = subprocess.run(
        [promtool, "check", "metrics"],
        input=metrics_text(service),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


# --- JSON ----------------------------------------------------------------------------------------


def test_findings_most_severe_first_with_fixes_and_nodes(service: Service) -> None:
    document = service.json("/api/v1/findings")
    assert document["evaluated_at"] == T0
    assert document["age_seconds"] == 10.0
    assert document["health"]["prometheus_up"] is True
    assert document["health"]["evaluations"] == 7
    findings = document["findings"]
    assert [(f["job"], f["kind"], f["severity"]) for f in findings] == [
        (JOB, "data_starvation", "critical"),
        (JOB, "hardware_straggler", "warning"),
        (JOB, "memory_headroom", "info"),
    ]
    starved, straggler, headroom = findings
    assert starved["ranks"] == [1]
    assert starved["fixes"] == {"1": "num_workers 1 -> 8; expect about 4.2x"}
    assert starved["nodes"] == {"1": "node-b"}
    assert starved["predicted_speedup"] == 4.2
    assert starved["summary"] == "rank 1 waits for data: 150 ms of a 250 ms step (60%)"
    assert starved["evidence"] == {"job_pace_ms": 98.0}
    assert list(straggler["fixes"]) == ["0", "2"]
    assert straggler["nodes"] == {"0": "node-a", "2": "node-c"}
    assert headroom["ranks"] == [] and headroom["nodes"] == {} and headroom["fixes"] == {}
    assert headroom["predicted_speedup"] is None


def test_jobs_lists_every_job(service: Service) -> None:
    document = service.json("/api/v1/jobs")
    assert document["evaluated_at"] == T0
    jobs = {j["job"]: j for j in document["jobs"]}
    assert sorted(jobs) == ["quiet", JOB]
    train = jobs[JOB]
    assert (train["ranks"], train["world_size"]) == (3, 4)
    assert train["imbalance_ratio"] == 0.59
    assert train["predicted_speedup"] == 4.2
    assert train["window"] == {"start": T0 - 60.0, "end": T0}
    assert [f["kind"] for f in train["findings"]] == [
        "memory_headroom",
        "hardware_straggler",
        "data_starvation",
    ]
    assert jobs["quiet"]["imbalance_ratio"] is None
    assert jobs["quiet"]["predicted_speedup"] == 1.0
    assert jobs["quiet"]["findings"] == []


@pytest.mark.parametrize("path", [f"/api/v1/jobs/{JOB_URL}", f"/api/v1/jobs/{JOB_URL}/"])
def test_one_job_by_its_url_encoded_name(service: Service, path: str) -> None:
    document = service.json(path)
    assert document["job"] == JOB
    assert document["ranks"] == 3
    assert document["age_seconds"] == 10.0
    assert len(document["findings"]) == 3


def test_one_job_by_a_plain_name(service: Service) -> None:
    assert service.json("/api/v1/jobs/quiet")["job"] == "quiet"


def test_unknown_job_is_a_json_404(service: Service) -> None:
    document = service.json("/api/v1/jobs/nosuchjob", status=404)
    assert document == {"error": "no running job 'nosuchjob' in the latest evaluation"}


def test_unknown_path_is_a_json_404_listing_the_endpoints(service: Service) -> None:
    document = service.json("/api/v2/findings?x=1", status=404)
    assert document["error"] == "unknown path '/api/v2/findings'"
    assert document["endpoints"] == list(ENDPOINTS)
    assert service.json("/")["endpoints"] == list(ENDPOINTS)


def test_query_strings_are_ignored(service: Service) -> None:
    assert service.json("/api/v1/jobs?job=quiet")["jobs"][0]["job"] == "quiet"


# --- /healthz ------------------------------------------------------------------------------------


def test_healthz_ok_while_fresh(service: Service) -> None:
    assert service.json("/healthz") == {"status": "ok", "reason": "ok"}
    service.state.now = T0 + STALE_AFTER_S  # exactly at the bound: still fresh
    assert service.json("/healthz")["status"] == "ok"


@pytest.mark.parametrize(
    ("health", "now", "reason"),
    [
        (Health(), T0, "no evaluation has succeeded yet"),
        (
            Health(failures=1, last_error=f"{PROM} unreachable: refused"),
            T0,
            f"{PROM} unreachable: refused",
        ),
        (
            healthy(prometheus_up=False, last_error=f"{PROM}: no answer within 10 s"),
            T0 + 5.0,
            f"Prometheus unreachable: {PROM}: no answer within 10 s",
        ),
        (healthy(), T0 + STALE_AFTER_S + 1.0, "last evaluation 121 s ago"),
    ],
    ids=["never-evaluated", "down-from-start", "down-now", "stale"],
)
def test_healthz_503_with_the_reason(
    service: Service, health: Health, now: float, reason: str
) -> None:
    service.state.published = Published(health=health)
    service.state.now = now
    assert service.json("/healthz", status=503) == {"status": "unhealthy", "reason": reason}


# --- binding -------------------------------------------------------------------------------------


def test_binds_loopback_by_default(service: Service) -> None:
    assert service.server.url == f"http://127.0.0.1:{service.server.port}"
    assert service.server.port > 0
    # Another loopback address reaches a wildcard bind but not a 127.0.0.1 one.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", service.server.port), 5):
        pass


def test_stop_releases_the_port() -> None:
    server = ServiceServer(lambda: Published(), clock=lambda: T0).start()
    port = server.port
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as r:
        assert r.status == 200  # it was serving on that port
    server.stop()
    # Nothing answers there any more, and the port is free to bind again.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as s:
        # SO_REUSEADDR only lets the request's connection linger in TIME_WAIT: Linux still
        # refuses the bind while a listening socket holds the port.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        assert s.getsockname() == ("127.0.0.1", port)
