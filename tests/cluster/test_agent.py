"""The node agent without Ray: a real intake on a Unix socket, a real HostSampler over a fake
process table, and the real Prometheus endpoint on a free port."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator

import pytest

from auditor.cluster.agent import NodeAgentCore
from auditor.probe.sink import encode, step_message
from auditor.samples import Batch, LoaderConfig, RankInfo, StepSample
from auditor.telemetry.host import HostSampler
from tests.helpers.scrape import scrape, value
from tests.helpers.waiting import wait_for
from tests.probe import short_dir
from tests.telemetry import ProcTable

JOB = "job-7"
NODE = "node-a"


def hello(rank: int, pid: int) -> bytes:
    loader = LoaderConfig(
        num_workers=2,
        pin_memory=False,
        prefetch_factor=2,
        persistent_workers=False,
        batch_size=8,
        drop_last=False,
        sampler="DistributedSampler",
    )
    info = RankInfo(
        rank=rank,
        world_size=2,
        local_rank=rank,
        host=NODE,
        pid=pid,
        parallel_mode="ddp",
        loader=loader,
        job=JOB,
    )
    return encode({"type": "hello", "version": 1, "info": info.to_dict()})


def steps(rank: int, n: int) -> bytes:
    rows = [
        StepSample(
            rank=rank,
            step=i,
            time=1000.0 + i,
            step_s=0.5,
            data_wait_s=0.1,
            forward_s=0.1,
            backward_s=0.2,
            optimizer_s=0.05,
            collective_wait_s=0.02,
            batch_size=8,
        )
        for i in range(n)
    ]
    return encode(step_message(rank, rows))


class Drained:
    def __init__(self, agent: NodeAgentCore) -> None:
        self.agent = agent
        self.batches: list[Batch] = []

    def poll(self) -> Drained:
        self.batches.append(self.agent.drain())
        return self

    def all(self, field: str) -> list:  # type: ignore[type-arg]
        return [x for b in self.batches for x in getattr(b, field)]


@pytest.fixture
def table() -> ProcTable:
    t = ProcTable()
    t.add(100, cpu=120.0, rss=4096, children=[])
    t.add(101, cpu=60.0, rss=100)
    t.add(102, cpu=40.0, rss=200)
    t.add(200, cpu=90.0, rss=8192)
    return t


@pytest.fixture
def sink_dir() -> Iterator[str]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def make_agent(sink_dir: str, table: ProcTable, **kw: object) -> NodeAgentCore:
    sampler = HostSampler(
        host=NODE,
        process=table,
        system_cpu_percent=lambda: 50.0,
        logical_cpus=lambda: 4,
        cores=lambda: 4.0,
        loadavg=lambda: (1.25, 1.0, 1.0),
        clock=lambda: 2000.0,
    )
    kw.setdefault("sample_interval_s", 0.1)
    return NodeAgentCore(
        job=JOB,
        sink_path=os.path.join(sink_dir, "a.sock"),
        host=NODE,
        sampler=sampler,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def agent(sink_dir: str, table: ProcTable) -> Iterator[NodeAgentCore]:
    a = make_agent(sink_dir, table, metrics_port=0)
    a.start()
    yield a
    a.stop()


def connect(agent: NodeAgentCore) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(agent.address()["sink"])
    return s


def test_drain_returns_infos_steps_process_and_node_cpu(agent: NodeAgentCore) -> None:
    addr = agent.address()
    assert addr["node"] == NODE and agent.ping() == NODE
    assert addr["metrics"].startswith("http://127.0.0.1:") and addr["metrics"].endswith("/metrics")
    got = Drained(agent)
    with connect(agent) as r0, connect(agent) as r1:
        r0.sendall(hello(0, 100) + encode({"type": "workers", "pids": [101, 102]}) + steps(0, 3))
        # what the real probe sends after its hello: its worker PIDs (none here)
        r1.sendall(hello(1, 200) + encode({"type": "workers", "pids": []}) + steps(1, 2))

        def complete() -> bool:
            got.poll()
            cpu = got.all("processes")
            return (
                len(got.all("steps")) == 5
                and any(p.rank == 0 and p.workers == 2 for p in cpu)
                and any(p.rank == 1 for p in cpu)
            )

        wait_for(complete)
    assert {i.rank: i.pid for i in got.all("infos")} == {0: 100, 1: 200}
    assert sorted((s.rank, s.step) for s in got.all("steps")) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (1, 1),
    ]
    p0 = [p for p in got.all("processes") if p.rank == 0 and p.workers == 2][-1]
    assert p0.pid == 100 and p0.main_cpu == pytest.approx(1.2)
    assert p0.worker_cpu == pytest.approx((0.6, 0.4))  # the declared workers
    assert p0.rss_bytes == 4096 and p0.worker_rss_bytes == 300
    node = got.all("nodes")[-1]
    assert node.host == NODE and node.cores == 4.0
    assert node.busy_cores == pytest.approx(2.0) and node.load1 == 1.25
    # both connections closed: both ranks ended, and the agent stops sampling them
    wait_for(lambda: set(got.poll().all("ended")) == {0, 1})
    time.sleep(0.25)
    assert got.poll().batches[-1].processes == ()


def test_metrics_endpoint_serves_the_ranks(agent: NodeAgentCore) -> None:
    url = agent.address()["metrics"]
    rank0 = {"auditor_job": JOB, "node": NODE, "rank": "0", "local_rank": "0"}
    with connect(agent) as r0:
        r0.sendall(hello(0, 100) + steps(0, 4))
        wait_for(lambda: value(scrape(url), "auditor_rank_steps_total", **rank0) == 4)
        wait_for(
            lambda: (
                value(scrape(url), "auditor_rank_cpu_cores", process="main", **rank0) is not None
            )
        )
        series = scrape(url)
        assert value(series, "auditor_rank_up", **rank0) == 1
        assert value(series, "auditor_rank_info", parallel_mode="ddp", world_size="2", **rank0) == 1
        assert value(series, "auditor_rank_phase_seconds_total", phase="backward", **rank0) == (
            pytest.approx(0.8)
        )
        assert value(series, "auditor_rank_samples_total", **rank0) == 32
        assert value(series, "auditor_rank_dataloader_config_workers", **rank0) == 2
        assert value(series, "auditor_rank_cpu_cores", process="main", **rank0) == (
            pytest.approx(1.2)
        )
        assert value(series, "auditor_node_cpu_cores", auditor_job=JOB, node=NODE) == 4.0
        assert value(series, "auditor_node_cpu_busy_cores", auditor_job=JOB, node=NODE) == 2.0

    wait_for(lambda: value(scrape(url), "auditor_rank_up", **rank0) == 0)


def test_no_metrics_port_means_no_endpoint(sink_dir: str, table: ProcTable) -> None:
    a = make_agent(sink_dir, table)
    a.start()
    try:
        assert a.address()["metrics"] is None
        assert a.drain() == Batch()
    finally:
        a.stop()


def test_rank_drained_before_the_host_sample_is_still_sampled(
    sink_dir: str, table: ProcTable
) -> None:
    # No sampling thread in the way: the host samples are taken by hand below.
    a = make_agent(sink_dir, table, sample_interval_s=3600)
    a.start()
    try:
        got = Drained(a)
        with connect(a) as r0:
            r0.sendall(hello(0, 100))
            wait_for(lambda: bool(got.poll().all("infos")))
            a._sample_once()  # what the sampling loop does each interval
            a._sample_once()
            assert [p.rank for p in a.drain().processes] == [0, 0]
    finally:
        a.stop()
