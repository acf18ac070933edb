"""The endpoint of one ``auditor run``, kept by the process that judges the job."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.analysis.findings import Finding
from auditor.metrics.endpoint import RunEndpoint
from auditor.samples import Batch, RankInfo, StepSample
from tests.helpers.gpus import device_sample, gpu_uuid
from tests.helpers.scrape import scrape, value

JOB, NODE = "train", "node-a"


def starved() -> Finding:
    return Finding(
        kind="data_starvation",
        severity="warning",
        ranks=(1,),
        predicted_speedup=1.3,
    )


@pytest.fixture
def endpoint() -> Iterator[RunEndpoint]:
    e = RunEndpoint(JOB, "provisional")
    yield e
    e.close()


def test_batches_and_findings_are_served_as_judged(endpoint: RunEndpoint) -> None:
    endpoint.set_node(NODE)
    infos = tuple(RankInfo(rank=r, world_size=2, host=NODE, pid=100 + r) for r in (0, 1))
    steps = tuple(
        StepSample(rank=r, step=i, time=float(i), step_s=0.1, forward_s=0.05, batch_size=8)
        for r in (0, 1)
        for i in range(3)
    )
    endpoint.add(Batch(infos=infos, steps=steps))
    series = scrape(endpoint.url)
    rank1 = {"auditor_job": JOB, "node": NODE, "rank": "1"}
    assert value(series, "auditor_rank_up", **rank1) == 1
    assert value(series, "auditor_rank_samples_total", **rank1) == 24
    assert value(series, "auditor_finding", auditor_job=JOB, kind="data_starvation") is None

    endpoint.set_findings([starved()])  # the verdict just judged: served at the next scrape
    series = scrape(endpoint.url)
    labels = {"auditor_job": JOB, "kind": "data_starvation", "rank": "1", "severity": "warning"}
    assert value(series, "auditor_finding", **labels) == 1
    assert value(
        series,
        "auditor_finding_predicted_speedup",
        auditor_job=JOB,
        kind="data_starvation",
        rank="1",
    ) == pytest.approx(1.3)

    endpoint.add(Batch(ended=(0, 1)))  # samples after the verdict never drop it
    series = scrape(endpoint.url)
    assert value(series, "auditor_finding", **labels) == 1
    assert value(series, "auditor_rank_up", **rank1) == 0
    endpoint.set_findings([])
    assert value(scrape(endpoint.url), "auditor_finding", **labels) is None


def test_a_gpu_whose_monitor_stops_answering_reads_down_not_frozen(
    endpoint: RunEndpoint,
) -> None:
    endpoint.add(Batch(devices=(device_sample(NODE, 0, 10.0), device_sample(NODE, 1, 10.0))))
    gpus = {
        gpu_uuid(NODE, i): {"index": i, "model": "A100", "up": True, "last_sample_time": 10.0}
        for i in (0, 1)
    }
    endpoint.set_gpus(gpus)
    series = scrape(endpoint.url)
    assert value(series, "auditor_gpu_up", uuid=gpu_uuid(NODE, 1)) == 1
    assert value(series, "auditor_gpu_utilization_ratio", uuid=gpu_uuid(NODE, 1)) is not None

    gpus[gpu_uuid(NODE, 1)]["up"] = False
    endpoint.set_gpus(gpus)
    series = scrape(endpoint.url)
    assert value(series, "auditor_gpu_up", uuid=gpu_uuid(NODE, 0)) == 1
    assert value(series, "auditor_gpu_up", uuid=gpu_uuid(NODE, 1)) == 0
    assert value(series, "auditor_gpu_utilization_ratio", uuid=gpu_uuid(NODE, 1)) is None


def test_a_gpu_never_sampled_is_down() -> None:
    e = RunEndpoint(JOB, NODE)
    try:
        e.set_gpus({"GPU-x": {"index": 0, "model": "A100", "up": True}})
        assert value(scrape(e.url), "auditor_gpu_up", uuid="GPU-x") == 0
    finally:
        e.close()


def test_a_taken_port_is_refused_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError):
            RunEndpoint(JOB, NODE, port=s.getsockname()[1])


def test_run_refuses_a_taken_metrics_port_before_the_job_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from auditor.cli import main

    marker = tmp_path / "ran"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = main(["run", "--no-ray", "--metrics-port", str(port), "--", "touch", str(marker)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot serve metrics on 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1
    assert not marker.exists()  # the job never started
