"""hardware_straggler: a rank on a throttled, low-clocked or narrow-link GPU, waited for."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import hardware_straggler
from auditor.analysis.rules.hardware_straggler import KIND
from auditor.analysis.snapshot import Snapshot
from tests.helpers.gpus import GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, RankSpec, balanced

HOT = GpuSpec(throttle=("sw_thermal_slowdown",), sm_clock=1400.0, temperature=88.0, util=0.99)
SLOW = RankSpec().scaled(1.4)  # 140 ms of compute against 100 ms


def job(
    gpus: list[GpuSpec],
    specs: list[RankSpec] | None = None,
    *,
    link: str = "uuid",
    parallel_mode: str = "ddp",
    steps: int = 24,
) -> Snapshot:
    j = JobBuilder(specs or balanced(len(gpus)), parallel_mode=parallel_mode).run(steps)
    attach_gpus(j, gpus, link=link)
    return j.snapshot()


def gpus_with(index: int, gpu: GpuSpec, n: int = 4) -> list[GpuSpec]:
    out = [GpuSpec()] * n
    out[index] = gpu
    return out


def slow_rank(index: int, n: int = 4, spec: RankSpec = SLOW) -> list[RankSpec]:
    out = balanced(n)
    out[index] = spec
    return out


def test_throttled_gpu_2_blamed_with_reason_fix_and_speedup() -> None:
    (f,) = hardware_straggler.RULE(job(gpus_with(2, HOT), slow_rank(2)))
    uuid = gpu_uuid("node0", 2)
    assert f.kind == KIND
    assert f.ranks == (2,)
    assert f.evidence["gpus"] == [
        {
            "uuid": uuid,
            "node": "node0",
            "index": 2,
            "model": "NVIDIA H100 80GB HBM3",
        }
    ]
    assert f.gpus == (uuid,)
    # The evidence holds the reasons' codes (the report words them).
    assert f.evidence["per_rank"]["2"]["reasons"] == ["throttled", "low_clock"]
    assert f.evidence["per_gpu"][uuid]["throttle_share"] == 1.0
    # The decisions: why the GPU is slow (throttled in 100% of samples, SM clock at 71% of its
    # maximum), and the batch that fits.
    gpu = f.facts.ranks[2]
    assert gpu.slowdowns[0] == hardware_straggler.Throttled(1.0, ("sw_thermal_slowdown",))
    low = gpu.slowdowns[1]
    assert isinstance(low, hardware_straggler.LowClock)
    assert round(low.ratio, 2) == 0.71 and low.mhz == pytest.approx(1400, abs=1)
    assert gpu.thermal and not gpu.power and gpu.temperature_c == 88.0
    assert (gpu.label, gpu.uuid, gpu.index, gpu.node) == ("node0 GPU 2", uuid, 2, "node0")
    # Compute per sample 1.4x its peers': 32 / 1.4 = 22.9 -> 22.
    assert (gpu.batch_size, gpu.batch_share) == (32, 22)
    assert f.facts.waits_measured
    # Barrier model: local 141 ms + 4 ms floor = 145 ms; rank 2 at its peers' 101 ms: 105 ms.
    assert f.predicted_speedup == pytest.approx(145 / 105, rel=0.02)
    assert f.severity == "warning"
    # The fixes: cool the GPU, or move the rank off it, or give it the batch that fits.
    x = f.predicted_speedup
    assert f.fixes == (
        Fix("device", 2, "thermal", None, x, (KIND,), uuid),
        Fix("gpu_assignment", 2, uuid, None, x, (KIND,), uuid),
        Fix("batch_size", 2, 32, 22, x, (KIND,)),
    )


def test_engine_links_the_symptom_to_the_hardware_cause() -> None:
    findings = analyze(job(gpus_with(2, HOT), slow_rank(2)))
    kinds = {f.kind: f for f in findings}
    # compute_straggler leaves the rank to hardware_straggler, which explains it.
    assert set(kinds) == {"hardware_straggler", "utilization_imbalance"}
    symptom = kinds["utilization_imbalance"]
    assert symptom.cause == "hardware_straggler"
    # The symptom's fixes are its cause's, answering both.
    assert symptom.fixes == tuple(
        replace(fix, answers=(KIND, "utilization_imbalance")) for fix in kinds[KIND].fixes
    )
    for f in findings:
        assert f.ranks == (2,), f.to_dict()


@pytest.mark.parametrize(
    ("gpu", "specs", "kwargs", "expected"),
    [
        pytest.param(HOT, slow_rank(2), {}, (2,), id="thermal"),
        pytest.param(
            GpuSpec(throttle=("hw_slowdown",)), slow_rank(2), {}, (2,), id="hw-slowdown-only"
        ),
        pytest.param(GpuSpec(sm_clock=1500.0), slow_rank(2), {}, (2,), id="low-clock-only"),
        pytest.param(GpuSpec(pcie_gen=4, pcie_width=8), slow_rank(2), {}, (2,), id="narrow-link"),
        # Throttled half the time: at the 0.5 default.
        pytest.param(
            replace(HOT, sm_clock=1980.0, throttle_share=0.7), slow_rank(2), {}, (2,), id="70%"
        ),
        pytest.param(
            replace(HOT, sm_clock=1980.0, throttle_share=0.7),
            slow_rank(2),
            {"min_throttle_share": 0.9},
            (),
            id="share-threshold",
        ),
        pytest.param(GpuSpec(sm_clock=1800.0), slow_rank(2), {}, (), id="clock-91%-not-low"),
        pytest.param(GpuSpec(sm_clock=1800.0), slow_rank(2), {"max_clock_ratio": 0.95}, (2,)),
        # The GPU is hot but its rank keeps pace: nobody waits for it.
        pytest.param(HOT, balanced(4), {}, (), id="throttled-but-not-waited-for"),
        # The rank is slow on a healthy GPU: compute_straggler's, not hardware.
        pytest.param(GpuSpec(), slow_rank(2), {}, (), id="slow-rank-healthy-gpu"),
        # 1.05x slower: under min_excess.
        pytest.param(HOT, slow_rank(2, spec=RankSpec().scaled(1.05)), {}, (), id="small-excess"),
        pytest.param(HOT, slow_rank(2), {"min_steps": 25}, (), id="too-few-steps"),
        pytest.param(HOT, slow_rank(2), {"min_samples": 1000}, (), id="too-few-samples"),
    ],
)
def test_decision_table(
    gpu: GpuSpec, specs: list[RankSpec], kwargs: dict, expected: tuple[int, ...]
) -> None:
    for link in ("uuid", "pid"):
        findings = hardware_straggler.RULE(job(gpus_with(2, gpu), specs, link=link), **kwargs)
        assert tuple(r for f in findings for r in f.ranks) == expected, link
        for f in findings:
            assert [g["index"] for g in f.evidence["gpus"]] == list(expected)
            assert f.gpus == tuple(gpu_uuid("node0", r) for r in expected)
            assert {fix.rank for fix in f.fixes} == set(expected)


def test_a_node_wide_power_cap_is_the_platform_not_a_straggler() -> None:
    capped = GpuSpec(throttle=("sw_power_cap",))
    assert hardware_straggler.RULE(job([capped] * 4, slow_rank(2))) == []


@pytest.mark.parametrize(
    ("gpu", "lever", "current", "proposed"),
    [
        # A power limit under its peers': back to theirs (500 W -> 700 W).
        pytest.param(
            GpuSpec(throttle=("sw_power_cap",), power_limit=500.0, sm_clock=1500.0),
            "power_limit",
            500.0,
            700.0,
            id="lower-power-limit",
        ),
        pytest.param(
            GpuSpec(throttle=("sw_power_cap",)), "device", "power_cap", None, id="power-cap"
        ),
        pytest.param(GpuSpec(sm_clock=1200.0), "device", "locked_clocks", None, id="locked-clocks"),
        pytest.param(GpuSpec(pcie_gen=3, pcie_width=16), "device", "pcie_link", None, id="pcie"),
        pytest.param(
            GpuSpec(throttle=("hw_slowdown",)), "device", "hw_slowdown", None, id="hw-slowdown"
        ),
    ],
)
def test_fix_follows_the_reason(
    gpu: GpuSpec, lever: str, current: object, proposed: object
) -> None:
    (f,) = hardware_straggler.RULE(job(gpus_with(2, gpu), slow_rank(2)))
    uuid = gpu_uuid("node0", 2)
    x = f.predicted_speedup
    assert f.fixes[0] == Fix(lever, 2, current, proposed, x, (KIND,), uuid)
    assert f.fixes[1] == Fix("gpu_assignment", 2, uuid, None, x, (KIND,), uuid)
    assert [fix.lever for fix in f.fixes[2:]] == ["batch_size"]


def test_unmeasured_waits_fall_back_to_the_phases_outside_the_all_reduce() -> None:
    # Without waits, backward wall time is equal on every rank (it includes the wait); forward
    # still shows rank 1's slower GPU (42 ms against 30 ms).
    specs = [replace(s, measure_wait=False) for s in slow_rank(1)]
    (f,) = hardware_straggler.RULE(job(gpus_with(1, HOT), specs))
    assert f.ranks == (1,)
    assert f.predicted_speedup is None
    assert not f.facts.waits_measured
    assert {fix.speedup for fix in f.fixes} == {None}
    # A backward-only delay cannot be told from waiting without the wait: silent.
    specs = [replace(s, measure_wait=False) for s in balanced(4)]
    specs[1] = replace(specs[1], backward=0.100)
    assert hardware_straggler.RULE(job(gpus_with(1, HOT), specs)) == []


def test_a_rank_that_only_waits_is_never_blamed() -> None:
    # GPU 0 is hot, but rank 0 computes at its peers' pace and waits for rank 3.
    findings = hardware_straggler.RULE(job(gpus_with(0, HOT), slow_rank(3)))
    assert findings == []


def test_dataparallel_and_lost_gpus_are_not_judged() -> None:
    dp = JobBuilder([RankSpec()], parallel_mode="dataparallel").run(24)
    attach_gpus(dp, gpus_with(2, HOT), owners=[[0]] * 4)
    assert hardware_straggler.RULE(dp.snapshot()) == []
    lost = replace(HOT, lost_after=0.0)
    assert hardware_straggler.RULE(job(gpus_with(2, lost), slow_rank(2))) == []


def test_no_devices_no_finding() -> None:
    j = JobBuilder(slow_rank(2)).run(24)
    assert hardware_straggler.RULE(j.snapshot()) == []


def test_the_speedup_of_a_cooled_gpu_keeps_the_ranks_data_wait() -> None:
    """The throttled rank also waits 30 ms a step for data: cooling its GPU brings its compute
    to its peers' and leaves that wait (data_starvation's to fix), so the job goes from 175 ms
    (30 + 140 of local work, + 5) to 135 ms (30 + 100, + 5), not to the peers' 105 ms."""
    spec = replace(SLOW, data_wait=0.030)
    (f,) = hardware_straggler.RULE(job(gpus_with(2, HOT), slow_rank(2, spec=spec)))
    assert f.ranks == (2,)
    assert f.predicted_speedup == pytest.approx(175 / 135, rel=0.03)
