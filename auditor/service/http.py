"""The service's HTTP side: ``/metrics`` for Prometheus and the findings as JSON.

GET /metrics            auditor_finding, speed-ups, per-job imbalance, the service's own health
GET /api/v1/findings    every current finding with its per-rank fixes, most severe first
GET /api/v1/jobs        per job: ranks, imbalance ratio, best predicted speed-up, findings
GET /api/v1/jobs/JOB    one job (404 if the latest evaluation did not see it)
GET /healthz            200 while evaluations succeed and are recent, else 503 (with the reason)

Everything is rendered from the one :class:`Published` the service swapped in last, so a reader
never sees half an evaluation. Binds to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import CollectorRegistry

from auditor.analysis.findings import finding_order
from auditor.audit import finding_dict
from auditor.metrics import catalog as C
from auditor.metrics.exporter import SeriesSet, add_findings, registry_for

from .service import Published

PublishedFn = Callable[[], Published]


def render(published: Published) -> list[Metric]:
    """All metric families of one published state."""
    out = SeriesSet()
    h = published.health
    out.add(C.SERVE_PROMETHEUS_UP, {}, 1 if h.prometheus_up else 0)
    if h.last_success is not None:
        out.add(C.SERVE_LAST_EVALUATION_TIMESTAMP_SECONDS, {}, h.last_success)
    if h.evaluation_s is not None:
        out.add(C.SERVE_EVALUATION_SECONDS, {}, h.evaluation_s)
    if h.analysis_s is not None:
        out.add(C.SERVE_ANALYSIS_SECONDS, {}, h.analysis_s)
    out.add(C.SERVE_EVALUATIONS_TOTAL, {}, h.evaluations)
    out.add(C.SERVE_FAILURES_TOTAL, {}, h.failures)
    out.add(C.SERVE_JOBS, {}, len(published.results))
    for job, result in sorted(published.results.items()):
        add_findings(out, job, result.findings, _node_lookup(result.nodes))
        out.add(C.JOB_RANKS, {C.JOB_LABEL: job}, result.ranks)
        out.add(C.JOB_PREDICTED_SPEEDUP, {C.JOB_LABEL: job}, result.predicted_speedup)
        if result.imbalance_ratio is not None:
            out.add(C.JOB_IMBALANCE_RATIO, {C.JOB_LABEL: job}, result.imbalance_ratio)
    return list(out.families())


def _node_lookup(nodes: Mapping[int, str]) -> Callable[[int], str]:
    return lambda rank: nodes.get(rank, "")


def make_registry(published: PublishedFn) -> CollectorRegistry:
    return registry_for(lambda: render(published()))


def findings_document(published: Published, now: float) -> dict[str, Any]:
    results = published.results
    ordered = sorted(
        ((r, f) for r in results.values() for f in r.findings),
        key=lambda rf: (*finding_order(rf[1]), rf[0].job),
    )
    return {
        **_meta(published, now),
        "findings": [finding_dict(r, f) for r, f in ordered],
    }


def _meta(published: Published, now: float) -> dict[str, Any]:
    h = published.health
    return {
        "evaluated_at": h.last_success,
        "age_seconds": None if h.last_success is None else round(now - h.last_success, 3),
        "health": h.to_dict(),
    }


def health_status(published: Published, now: float, stale_after_s: float) -> tuple[int, str]:
    h = published.health
    if h.last_success is None:
        return 503, h.last_error or "no evaluation has succeeded yet"
    if not h.prometheus_up:
        return 503, f"Prometheus unreachable: {h.last_error}"
    if now - h.last_success > stale_after_s:
        return 503, f"last evaluation {now - h.last_success:.0f} s ago"
    return 200, "ok"


class ServiceServer:
    """A threaded HTTP server over one :class:`~.service.AuditService`'s published state."""

    def __init__(
        self,
        published: PublishedFn,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float],
        stale_after_s: float = 120.0,
    ) -> None:
        registry = make_registry(published)
        handler = _handler(published, registry, clock, stale_after_s)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="auditor-serve-http", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServiceServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    published: PublishedFn,
    registry: CollectorRegistry,
    clock: Callable[[], float],
    stale_after_s: float,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "auditor-serve"

        def do_GET(self) -> None:  # http.server's naming
            path = urllib.parse.urlsplit(self.path).path.rstrip("/") or "/"
            state = published()
            now = clock()
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/api/v1/findings":
                self._json(200, findings_document(state, now))
            elif path == "/api/v1/jobs":
                jobs = [r.to_dict() for _, r in sorted(state.results.items())]
                self._json(200, {**_meta(state, now), "jobs": jobs})
            elif path.startswith("/api/v1/jobs/"):
                job = urllib.parse.unquote(path.removeprefix("/api/v1/jobs/"))
                result = state.results.get(job)
                if result is None:
                    self._json(404, {"error": f"no running job {job!r} in the latest evaluation"})
                else:
                    self._json(200, {**_meta(state, now), **result.to_dict()})
            elif path == "/healthz":
                code, reason = health_status(state, now, stale_after_s)
                self._json(code, {"status": "ok" if code == 200 else "unhealthy", "reason": reason})
            elif path == "/":
                self._json(200, {"endpoints": ENDPOINTS})
            else:
                self._json(404, {"error": f"unknown path {path!r}", "endpoints": ENDPOINTS})

        def _json(self, code: int, body: dict[str, Any]) -> None:
            self._send(code, json.dumps(body, indent=1).encode(), "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # scrapes every few seconds would drown the service's own log

    return Handler


ENDPOINTS = ("/metrics", "/api/v1/findings", "/api/v1/jobs", "/api/v1/jobs/JOB", "/healthz")
