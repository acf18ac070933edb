"""utilization_imbalance with NVML samples: GPU busy time triggers, rank timings attribute."""

from __future__ import annotations

import pytest

from auditor.analysis import analyze
from auditor.analysis.rules import data_starvation, utilization_imbalance
from auditor.analysis.rules.utilization_imbalance import KIND
from auditor.analysis.snapshot import Snapshot
from tests.helpers.gpus import GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, RankSpec, balanced, starved_rank3, with_rank


def with_gpus(specs: list[RankSpec], utils: list[float]) -> Snapshot:
    job = JobBuilder(specs).run(24)
    attach_gpus(job, [GpuSpec(util=u) for u in utils])
    return job.snapshot()


# Rank 3 waits 156 ms for data in a 260 ms step; its peers wait for it inside the all-reduce,
# which NVML counts as busy: GPUs 0-2, 4-7 read ~100%, GPU 3 only its 100 ms of work (38%).
STARVED_UTILS = [1.0, 1.0, 1.0, 0.38, 1.0, 1.0, 1.0, 1.0]


def test_starved_rank_seen_on_gpu_busy_time_blamed_by_waits() -> None:
    snap = with_gpus(starved_rank3(), STARVED_UTILS)
    # Without NVML the ranks' compute shares are equal (100 of 260 ms): no spread.
    assert utilization_imbalance.RULE(snap, min_samples=10_000) == []
    findings = analyze(snap)
    assert {f.kind for f in findings} == {"data_starvation", "utilization_imbalance"}
    (f,) = [f for f in findings if f.kind == "utilization_imbalance"]
    assert f.ranks == (3,)
    assert f.cause == "data_starvation"
    assert f.evidence["spread"] < 0.25
    assert f.evidence["gpu_spread"] == pytest.approx(0.62, abs=0.03)
    assert f.evidence["gpu_busy_ratio"][gpu_uuid("node0", 3)] == pytest.approx(0.38, abs=0.02)
    assert [g["index"] for g in f.evidence["gpus"]] == [3]
    assert f.gpus == (gpu_uuid("node0", 3),)
    # The GPU spread shown: 100% (node0 GPU 0) against 38% (node0 GPU 3).
    spread = f.facts.spread
    assert (spread.high, spread.low, spread.gpus) == ("node0 GPU 0", "node0 GPU 3", True)
    assert spread.high_busy == pytest.approx(1.0, abs=0.005)
    assert spread.low_busy == pytest.approx(0.38, abs=0.005)
    assert f.facts.gpu_busy
    # The fixes are data_starvation's, for rank 3, answering both findings.
    assert f.fixes and {fix.rank for fix in f.fixes} == {3}
    assert {fix.answers for fix in f.fixes} == {("data_starvation", KIND)}
    for finding in findings:
        assert finding.ranks == (3,), finding.to_dict()


def test_equal_waits_and_no_cause_stay_silent() -> None:
    # NVML reads GPU 2 at 50% but every rank waits the same: nothing in the rank timings says
    # who holds whom back, so nobody is blamed.
    snap = with_gpus(balanced(4), [0.97, 0.97, 0.50, 0.97])
    assert utilization_imbalance.RULE(snap) == []
    assert analyze(snap) == []


def test_the_cause_alone_attributes_when_waits_do_not_differ_enough() -> None:
    snap = with_gpus(starved_rank3(), STARVED_UTILS)
    prior = tuple(data_starvation.RULE(snap))
    (f,) = utilization_imbalance.RULE(snap, explained=prior, min_wait_gap=0.99)
    assert (f.ranks, f.cause) == ((3,), "data_starvation")
    assert utilization_imbalance.RULE(snap, min_wait_gap=0.99) == []


@pytest.mark.parametrize(
    ("utils", "kwargs", "expected"),
    [
        pytest.param(STARVED_UTILS, {}, (3,), id="gpu-spread-62"),
        pytest.param(STARVED_UTILS, {"min_spread": 0.7}, (), id="spread-threshold"),
        pytest.param([1.0, 1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0], {}, (), id="gpu-spread-10"),
        pytest.param(STARVED_UTILS, {"min_steps": 25}, (), id="too-few-steps"),
    ],
)
def test_decision_table(utils: list[float], kwargs: dict, expected: tuple[int, ...]) -> None:
    findings = utilization_imbalance.RULE(with_gpus(starved_rank3(), utils), **kwargs)
    assert tuple(r for f in findings for r in f.ranks) == expected


def test_rank_spread_attribution_unchanged_when_nvml_reads_everyone_busy() -> None:
    # Rank 2 computes 1.8x longer; NVML reads all four GPUs near 100% (the others spin in the
    # all-reduce). The rank timings still name rank 2, never the waiting ranks.
    slow = with_rank(balanced(4), 2, forward=0.070, backward=0.110)
    (f,) = utilization_imbalance.RULE(with_gpus(slow, [0.99, 0.99, 0.99, 0.99]))
    assert f.ranks == (2,)
    assert f.evidence["gpu_spread"] < 0.05
    assert [g["index"] for g in f.evidence["gpus"]] == [2]
    assert f.gpus == (gpu_uuid("node0", 2),)
    # The rank spread is shown, the ranks named by number.
    assert (f.facts.spread.high, f.facts.spread.gpus) == (2, False)
