"""hardware_straggler in words: the slow GPU and why, the change its cause calls for, the way
around it, and the evidence's reasons and speed-up model as the JSON report words them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis.rules import hardware_straggler
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_hardware_straggler import HOT, gpus_with, job, slow_rank
from tests.helpers.gpus import GpuSpec, gpu_uuid

PER_MICRO = "(per micro-batch; 4 accumulated per step)"


def test_the_fix_names_the_cause_the_way_around_and_the_batch() -> None:
    (f,) = hardware_straggler.RULE(job(gpus_with(2, HOT), slow_rank(2)))
    words = phrase(f)
    fix = words.fixes[2]
    assert fix.startswith("node0 GPU 2 slows down for heat at 88 C: check its cooling")
    assert f"or move rank 2 off node0 GPU 2 ({gpu_uuid('node0', 2)})" in fix
    assert "batch_size 32 -> 22" in fix
    assert words.summary.startswith(
        "rank 2 runs on a slow GPU (node0 GPU 2: throttled (sw_thermal_slowdown) in 100% of "
        "samples, SM clock at 71% of its maximum"
    )
    assert words.summary.endswith("the others wait for it at the all-reduce (compute 140 ms)")


def test_the_report_words_the_reasons_and_the_speedup_model_in_place() -> None:
    (f,) = hardware_straggler.RULE(job(gpus_with(2, HOT), slow_rank(2)))
    evidence = ReportFinding.of(f).evidence
    reasons = evidence["per_rank"]["2"]["reasons"]
    assert reasons[0] == "throttled (sw_thermal_slowdown) in 100% of samples"
    assert reasons[1].startswith("SM clock at 71% of its maximum")
    assert evidence["speedup_model"] == (
        "barrier model: the blamed ranks' own work at their peers' median"
    )
    # The evidence keeps its order: the words take the codes' places, the model comes last.
    assert list(evidence) == [*f.evidence, "speedup_model"]
    assert list(evidence["per_rank"]["2"]) == list(f.evidence["per_rank"]["2"])


@pytest.mark.parametrize(
    ("gpu", "fix_start"),
    [
        pytest.param(
            GpuSpec(throttle=("sw_power_cap",), power_limit=500.0, sm_clock=1500.0),
            "node0 GPU 2's power limit is 500 W against 700 W on its peers: "
            "`nvidia-smi -i 2 -pl 700` on node0",
            id="lower-power-limit",
        ),
        pytest.param(
            GpuSpec(throttle=("sw_power_cap",)),
            "node0 GPU 2 hits its power cap: check its power supply",
            id="power-cap",
        ),
        pytest.param(
            GpuSpec(sm_clock=1200.0),
            "node0 GPU 2 runs low clocks without a throttle reason: reset locked clocks with "
            "`nvidia-smi -i 2 -rgc` on node0",
            id="locked-clocks",
        ),
        pytest.param(
            GpuSpec(pcie_gen=3, pcie_width=16),
            "node0 GPU 2's PCIe link is gen 3/5 x16/16: reseat the card",
            id="pcie",
        ),
        pytest.param(
            GpuSpec(throttle=("hw_slowdown",)),
            "node0 GPU 2 reports HW slowdown (power brake or overheating)",
            id="hw-slowdown",
        ),
    ],
)
def test_fix_follows_the_reason(gpu: GpuSpec, fix_start: str) -> None:
    (f,) = hardware_straggler.RULE(job(gpus_with(2, gpu), slow_rank(2)))
    assert phrase(f).fixes[2].startswith(fix_start), phrase(f).fixes[2]


def test_unmeasured_waits_say_the_speedup_is_not_predicted() -> None:
    specs = [replace(s, measure_wait=False) for s in slow_rank(1)]
    (f,) = hardware_straggler.RULE(job(gpus_with(1, HOT), specs))
    speedup_model = phrase(f).notes["speedup_model"]
    assert isinstance(speedup_model, str) and speedup_model.startswith("not predicted")
    assert "expect about" not in phrase(f).fixes[1]


def test_the_batch_advice_is_per_micro_batch_under_accumulation() -> None:
    specs = [replace(s, micro_batches=4) for s in slow_rank(2)]
    (f,) = hardware_straggler.RULE(job(gpus_with(2, HOT), specs))
    assert f"batch_size 8 -> 5 {PER_MICRO}" in phrase(f).fixes[2]


def test_the_recorded_throttled_gpu_in_words() -> None:
    from tests.analysis.test_scenarios import load

    snap, uuids = load("throttled_gpu")
    (f,) = hardware_straggler.RULE(snap)
    reasons = ReportFinding.of(f).evidence["per_rank"]["2"]["reasons"]
    assert reasons[0].startswith("throttled (sw_thermal_slowdown)")
    assert reasons[1].startswith("SM clock at 68% of its maximum")
    assert phrase(f).fixes[2].startswith("gpu-node-07 GPU 2 slows down for heat")
    assert uuids[2] in phrase(f).fixes[2]
