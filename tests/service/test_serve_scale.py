"""``auditor serve`` at benchmark size: the same findings as the live path and as before.

The job of ``bench/serve_scale.py`` (:mod:`tests.helpers.servejob`: 4,096 ranks, rank 2,048
starved) goes through what serve really runs -- Prometheus' JSON bodies decoded by the client,
the snapshot rebuilt, the rules -- and through the live path (the same window as samples in an
:class:`Audit`'s store). Both must blame the same ranks with the same fixes, and match the
findings recorded from the code before the column-wise rebuild (``tests/data/serve_4096``).
No wall time is asserted: the benchmark measures that.
"""

from __future__ import annotations

import hashlib
import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis.findings import Finding
from auditor.audit import Audit, Verdict
from auditor.metrics.query import PrometheusClient
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.service.promsnapshot import queries
from auditor.service.service import AuditService
from tests.helpers import servejob

RECORDED = Path(__file__).resolve().parents[1] / "data" / "serve_4096" / "findings.json"
RANKS = 4096
SCRAPE_S = 15.0


class _Body:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> bytes:
        return self._body


def serve_result(ranks: int) -> Verdict:
    """One evaluation of the service over a Prometheus that answers with the job's bodies."""
    bodies = servejob.as_prometheus_json(servejob.answers(ranks, scrape_s=SCRAPE_S))
    key_of = {expr: key for key, expr in queries(servejob.WINDOW_S).items()}

    def opener(request: urllib.request.Request, timeout: float) -> _Body:
        assert isinstance(request.data, bytes)
        expr = urllib.parse.parse_qs(request.data.decode())["query"][0]
        return _Body(bodies[key_of[expr]])

    service = AuditService(
        PrometheusClient("http://prom.test:9090", opener=opener),
        window_s=servejob.WINDOW_S,
        stale_after_s=60.0,
        clock=lambda: servejob.NOW,
    )
    published = service.evaluate()
    assert published.health.prometheus_up, published.health.last_error
    return published.results[servejob.JOB]


def live_verdict(ranks: int) -> Verdict:
    audit = Audit(servejob.JOB, window_s=servejob.WINDOW_S, warmup_steps=0)
    audit.add_all(servejob.live_batches(ranks, scrape_s=SCRAPE_S))
    return audit.judge(servejob.NOW)[1]


def live_findings(ranks: int) -> tuple[Finding, ...]:
    return live_verdict(ranks).findings


def verdict(findings: Any) -> list[tuple[str, str, tuple[int, ...], dict[int, str]]]:
    return [(f.kind, f.severity, tuple(f.ranks), dict(phrase(f).fixes)) for f in findings]


def _digest(evidence: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(evidence, sort_keys=True).encode()).hexdigest()


@pytest.fixture(scope="module")
def served() -> Verdict:
    return serve_result(RANKS)


def test_serve_finds_the_starved_rank_as_the_live_path_does(served: Verdict) -> None:
    live = live_findings(RANKS)
    assert verdict(served.findings) == verdict(live)
    assert [f.kind for f in served.findings] == ["data_starvation", "utilization_imbalance"]
    assert all(f.ranks == (RANKS // 2,) for f in served.findings)
    # Same figures too: the evidence of both paths is the same document.
    assert [f.to_dict() for f in served.findings] == [f.to_dict() for f in live]
    words = [ReportFinding.of(f).to_dict() for f in served.findings]
    assert words == [ReportFinding.of(f).to_dict() for f in live]


def test_serve_findings_match_those_recorded_before_the_rebuild(served: Verdict) -> None:
    recorded = json.loads(RECORDED.read_text())["findings"]
    got = []
    for f in served.findings:
        d = ReportFinding.of(f).to_dict()
        evidence = d.pop("evidence")
        # Newer than the recording: what the starved rank's host allows once it is fed.
        assert f.kind != "data_starvation" or "host_bound" in evidence
        evidence.pop("host_bound", None)
        d.pop("actions")  # the typed fixes, newer than the recording: asserted below
        # Newer than the recording too: serve judges no parts of its window, so no range.
        assert d.pop("predicted_range") is None
        got.append({**d, "evidence_keys": sorted(evidence), "evidence_sha256": _digest(evidence)})
    assert got == recorded
    starved, symptom = served.findings
    assert [(x.rank, x.lever, x.current, x.proposed) for x in starved.fixes] == [
        (RANKS // 2, "num_workers", 2, 6)
    ]
    assert [x.answers for x in symptom.fixes] == [("data_starvation", "utilization_imbalance")]


def test_every_rank_is_judged(served: Verdict) -> None:
    assert served.ranks == RANKS
    assert served.world_size == RANKS
    assert served.nodes[RANKS - 1] == servejob.node_of(RANKS - 1)


@pytest.mark.parametrize("ranks", [2, 64, 1024])
def test_serve_and_live_agree_at_every_size(ranks: int) -> None:
    """Smaller jobs of the benchmark's shape: the same findings, figures and words both ways,
    and the same verdict (one type, one document: what serve answers for the job)."""
    served, live = serve_result(ranks), live_verdict(ranks)
    assert served.to_dict() == live.to_dict()
    assert [f.to_dict() for f in served.findings] == [f.to_dict() for f in live.findings]
    assert verdict(served.findings) == verdict(live.findings)
    assert [f.kind for f in served.findings] == ["data_starvation", "utilization_imbalance"]
    assert all(f.ranks == (ranks // 2,) for f in served.findings)
