"""The ranks' counted work on the run's endpoint: FLOPs per step, FLOP/s and MFU per rank and the
job's MFU, rendered from :func:`auditor.analysis.mfu.rank_flops` / :func:`~auditor.analysis.mfu.
job_mfu` of the verdict's snapshot. A figure that was not measured is no series, never a zero:
no count, a CPU (FLOP/s only), an ended rank (no present pace)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from auditor.analysis import SampleStore
from auditor.analysis.mfu import job_mfu, rank_flops
from auditor.analysis.snapshot import Snapshot
from auditor.metrics import catalog as C
from auditor.metrics.endpoint import RunEndpoint
from auditor.metrics.exporter import make_registry
from auditor.metrics.state import ExportState, apply_batch, with_work
from auditor.samples import Batch, FlopCount, RankInfo, StepSample
from auditor.telemetry.recorded import Recording, read_recording
from tests.helpers.scrape import scrape, value

DATA = Path(__file__).resolve().parents[1] / "data"
H100_PEAK_BF16 = 989.4e12  # the table's dense bf16 peak of an H100 SXM
WORK = {
    C.RANK_FLOPS_PER_STEP.name,
    C.RANK_FLOPS_PER_SECOND.name,
    C.RANK_MFU_RATIO.name,
    C.JOB_MFU_RATIO.name,
}
Key = tuple[str, frozenset[tuple[str, str]]]


def _count(rank: int, flops: float, device: str = "cuda", dtype: str = "bf16") -> FlopCount:
    return FlopCount(
        rank=rank,
        time=0.0,
        step=10,
        flops=flops,
        by_dtype={dtype: flops},
        micro_batches=1,
        samples=64,
        device=device,
        cost_s=0.02,
    )


def _recorded(flops: float) -> tuple[Recording, Snapshot]:
    """The recorded H100 run (two ranks sharing one GPU) with each rank's count of ``flops``
    bf16 FLOPs per step, and the snapshot a verdict would judge."""
    rec = read_recording(DATA / "h100_live" / "verdict_none.jsonl")
    store = SampleStore(job=rec.job)
    store.add(rec.batch)
    store.add(Batch(flops=tuple(_count(r, flops) for r in (0, 1))))
    now = store.latest_time()
    assert now is not None
    return rec, store.snapshot(now=now, window_s=10.0)


def _work(state: ExportState) -> dict[Key, float]:
    text = generate_latest(make_registry(lambda: state)).decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in WORK
    }


def _rank(job: str, node: str, rank: int) -> frozenset[tuple[str, str]]:
    return frozenset(
        {"auditor_job": job, "node": node, "rank": str(rank), "local_rank": str(rank)}.items()
    )


def test_a_recorded_h100_run_exports_each_ranks_work_and_the_jobs_mfu() -> None:
    rec, snap = _recorded(2.4e12)
    # The ranks still run: the recording's end is left out, so their pace is the present.
    state = apply_batch(ExportState(job=rec.job, node="vm"), replace(rec.batch, ended=()))
    flops = rank_flops(snap)
    job = job_mfu(snap, flops=flops)
    assert job is not None and job.mfu is not None
    got = _work(with_work(state, flops, job))
    expected: dict[Key, float] = {
        (C.JOB_MFU_RATIO.name, frozenset({("auditor_job", rec.job)})): job.mfu
    }
    for r in (0, 1):
        f = flops[r]
        assert f.flops_per_s is not None and f.mfu is not None
        labels = _rank(rec.job, "vm", r)
        expected[(C.RANK_FLOPS_PER_STEP.name, labels)] = 2.4e12
        expected[(C.RANK_FLOPS_PER_SECOND.name, labels)] = f.flops_per_s
        expected[(C.RANK_MFU_RATIO.name, labels)] = f.mfu
        # What the series say, against the table by hand: the two ranks share the H100.
        step = snap.paced[r].step_s
        assert got[(C.RANK_MFU_RATIO.name, labels)] == pytest.approx(
            2.4e12 / step / (H100_PEAK_BF16 / 2)
        )
    assert got == pytest.approx(expected)
    assert 0 < job.mfu < 1


def test_an_ended_rank_keeps_its_flops_per_step_and_loses_its_pace() -> None:
    rec, snap = _recorded(2.4e12)
    state = apply_batch(ExportState(job=rec.job, node="vm"), replace(rec.batch, ended=(1,)))
    flops = rank_flops(snap)
    got = _work(with_work(state, flops, None))
    assert {(name, dict(labels)["rank"]) for name, labels in got} == {
        (C.RANK_FLOPS_PER_STEP.name, "0"),
        (C.RANK_FLOPS_PER_SECOND.name, "0"),
        (C.RANK_MFU_RATIO.name, "0"),
        (C.RANK_FLOPS_PER_STEP.name, "1"),
    }


def _cpu_snapshot(counted: bool) -> tuple[Batch, Snapshot]:
    infos = tuple(
        RankInfo(rank=r, local_rank=r, world_size=2, host="h0", device="cpu") for r in (0, 1)
    )
    steps = tuple(
        StepSample(rank=r, step=i, time=100.0 + 0.5 * i, step_s=0.5, forward_s=0.2, backward_s=0.25)
        for r in (0, 1)
        for i in range(40)
    )
    batch = Batch(infos=infos, steps=steps)
    store = SampleStore(job="cpu-job")
    store.add(batch)
    if counted:
        store.add(Batch(flops=tuple(_count(r, 3e9, device="cpu", dtype="fp32") for r in (0, 1))))
    return batch, store.snapshot(now=120.0, window_s=10.0)


def test_a_cpu_job_exports_flops_per_second_and_no_mfu() -> None:
    batch, snap = _cpu_snapshot(counted=True)
    flops = rank_flops(snap)
    job = job_mfu(snap, flops=flops)
    assert job is not None and job.mfu is None
    got = _work(with_work(apply_batch(ExportState(job="cpu-job", node="h0"), batch), flops, job))
    for r in (0, 1):
        labels = _rank("cpu-job", "h0", r)
        assert got[(C.RANK_FLOPS_PER_STEP.name, labels)] == 3e9
        assert got[(C.RANK_FLOPS_PER_SECOND.name, labels)] == pytest.approx(3e9 / 0.5)
    assert {name for name, _ in got} == {C.RANK_FLOPS_PER_STEP.name, C.RANK_FLOPS_PER_SECOND.name}


def test_nothing_counted_no_series() -> None:
    batch, snap = _cpu_snapshot(counted=False)
    flops = rank_flops(snap)
    assert flops == {} and job_mfu(snap, flops=flops) is None
    state = apply_batch(ExportState(job="cpu-job", node="h0"), batch)
    assert _work(with_work(state, flops, None)) == {}
    assert _work(state) == {}


def test_a_fleet_agents_keyed_ranks_never_take_a_verdicts_figures() -> None:
    """A fleet agent files each job's rank under a key of its own: rank 0 of another job is not
    the verdict's rank 0."""
    rec, snap = _recorded(2.4e12)
    keyed = RankInfo(rank=0, world_size=2, host="vm", job="other", key=7)
    state = apply_batch(ExportState(job=rec.job, node="vm"), Batch(infos=(keyed,)))
    assert _work(with_work(state, rank_flops(snap), None)) == {}


@pytest.fixture
def endpoint() -> Iterator[RunEndpoint]:
    e = RunEndpoint("verdict_none", "vm")
    yield e
    e.close()


def test_the_run_endpoint_serves_the_work_of_each_verdict(endpoint: RunEndpoint) -> None:
    rec, snap = _recorded(2.4e12)
    endpoint.add(replace(rec.batch, ended=()))
    rank0 = {"auditor_job": rec.job, "node": "vm", "rank": "0"}
    assert value(scrape(endpoint.url), C.RANK_MFU_RATIO.name, **rank0) is None
    endpoint.set_work(snap)  # the verdict just judged: served at the next scrape
    series = scrape(endpoint.url)
    assert value(series, C.RANK_MFU_RATIO.name, **rank0) == pytest.approx(rank_flops(snap)[0].mfu)
    job = job_mfu(snap)
    assert job is not None
    assert value(series, C.JOB_MFU_RATIO.name, auditor_job=rec.job) == pytest.approx(job.mfu)
    # A later verdict without counts (a fresh window) takes the series away.
    _, bare = _cpu_snapshot(counted=False)
    endpoint.set_work(bare)
    series = scrape(endpoint.url)
    assert value(series, C.RANK_FLOPS_PER_STEP.name, **rank0) is None
    assert value(series, C.JOB_MFU_RATIO.name, auditor_job=rec.job) is None
