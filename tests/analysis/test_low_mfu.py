"""low_mfu: a GPU job well below the MFU its model class reaches is named with where the time
goes, the largest part with a lever first; never on a CPU job, a job at a good MFU or a card the
peak table does not know; never one rank blamed when every rank is alike."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.consistency import JOB_WIDE, review
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import RULES, low_mfu
from auditor.analysis.rules.low_mfu import PRECISION, SMALL_BATCH, Facts
from tests.helpers.flops import RankSpec, flops_snapshot
from tests.helpers.jobs import JobBuilder, backward_straggler


def _one(findings: list[Finding]) -> tuple[Finding, Facts]:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    (f,) = findings
    assert isinstance(f.facts, Facts)
    return f, f.facts


def test_a_job_at_a_good_mfu_is_not_named() -> None:
    # 40 TFLOPs of bf16 a step in 102 ms on an H100: 40% MFU, a mid-sized model reaches 15%.
    snap = flops_snapshot([RankSpec(), RankSpec()])
    assert low_mfu.RULE(snap) == []
    assert "low_mfu" not in {f.kind for f in analyze(snap)}


def test_a_cpu_job_is_never_judged() -> None:
    slow = RankSpec(data_wait_s=1.0, by_dtype={"fp32": 1e9})
    snap = flops_snapshot([slow, slow], device="cpu")
    assert low_mfu.RULE(snap) == []
    assert low_mfu.measure(snap, low_mfu.Thresholds()) is None


def test_a_card_the_table_does_not_know_is_not_judged() -> None:
    slow = RankSpec(data_wait_s=2.0)
    assert low_mfu.RULE(flops_snapshot([slow, slow], model="NVIDIA B200")) == []


def test_no_count_nothing_to_judge() -> None:
    slow = RankSpec(data_wait_s=2.0)
    assert low_mfu.RULE(flops_snapshot([slow, slow], counted=False)) == []


def test_a_starved_job_books_its_gap_to_the_data_wait_and_blames_no_rank_alike() -> None:
    # Every rank waits 500 ms a step for data: 40 ms of bf16 work at peak in a 602 ms step.
    starved = RankSpec(data_wait_s=0.5)
    f, facts = _one(low_mfu.RULE(flops_snapshot([starved, starved, starved])))
    assert facts.mfu == pytest.approx((40e12 / 989.4e12) / starved.step_s)
    assert facts.model_class == "medium" and facts.reach == 0.15
    assert facts.parts[0].name == "data_wait"
    assert facts.parts[0].share == pytest.approx(0.5 / starved.step_s)
    assert sum(p.share for p in facts.parts if p.name != PRECISION) <= 1 - facts.mfu + 1e-9
    # Every rank alike: the job, not a rank.
    assert f.ranks == ()
    # No rank rule explains the wait here (the rule alone): named, with no lever.
    assert facts.lead is None and f.fixes == () and f.severity == "info"


def test_the_rank_rule_that_explains_the_largest_part_leads_and_is_named() -> None:
    starved = RankSpec(data_wait_s=0.5)
    snap = flops_snapshot([starved, RankSpec(collective_wait_s=0.5)])
    explaining = Finding(
        kind="data_starvation",
        severity="warning",
        ranks=(0,),
        fixes=(Fix("num_workers", 0, 2, 8, 1.8, ("data_starvation",)),),
    )
    f, facts = _one(low_mfu.RULE(snap, [explaining]))
    lead = facts.parts[facts.lead or 0]
    assert facts.lead == 0 and lead.name == "data_wait"
    # Rank 1's wait at the all-reduce is rank 0's data wait: booked to it.
    assert lead.share > 0.75
    assert (lead.by, lead.ranks, lead.lever) == ("data_starvation", (0,), "num_workers")
    assert f.ranks == (0,)
    # Said once, by data_starvation: not copied here; that finding carries the severity.
    assert f.fixes == () and f.severity == "info"


def test_fp32_matmuls_at_a_good_fp32_mfu_still_name_bf16_for_every_rank() -> None:
    # 3 TFLOPs of fp32 a step in 102 ms: 44% of the fp32 peak (67), but bf16 runs them 15x
    # faster: most of the compute phases' 95 ms would come back.
    fp32 = RankSpec(by_dtype={"fp32": 3e12})
    snap = flops_snapshot([fp32, fp32])
    f, facts = _one(low_mfu.RULE(snap))
    assert facts.mfu == pytest.approx(3e12 / 67e12 / fp32.step_s)
    assert facts.mfu > facts.reach  # its MFU is fine ...
    compute = fp32.forward_s + fp32.backward_s + fp32.optimizer_s
    assert facts.precision == pytest.approx(compute * (1 - 67 / 989.4) / fp32.step_s)
    lead = facts.parts[facts.lead or 0]
    assert lead.name == PRECISION and lead.lever == "autocast_bf16"
    assert f.ranks == ()  # ... and every rank is alike
    levers = {(x.lever, x.rank, x.current, x.proposed) for x in f.fixes}
    assert levers == {
        ("autocast_bf16", 0, "fp32", "bf16"),
        ("autocast_bf16", 1, "fp32", "bf16"),
        ("tf32", 0, False, True),
        ("tf32", 1, False, True),
    }
    assert f.predicted_speedup == pytest.approx(1 / (1 - facts.precision))
    assert f.severity == "warning"
    bf16 = next(x for x in f.fixes if x.lever == "autocast_bf16")
    tf32 = next(x for x in f.fixes if x.lever == "tf32")
    assert bf16.speedup is not None and tf32.speedup is not None
    assert bf16.speedup > tf32.speedup > 1


def test_tf32_matmuls_are_named_for_bf16_without_the_tf32_lever() -> None:
    tf32 = RankSpec(by_dtype={"tf32": 20e12})
    f, facts = _one(low_mfu.RULE(flops_snapshot([tf32, tf32])))
    assert facts.tf32 == 0.0
    assert {x.lever for x in f.fixes} == {"autocast_bf16"}
    assert {x.current for x in f.fixes} == {"tf32"}


def test_a_micro_batch_too_small_to_fill_the_gpu_gets_a_larger_one() -> None:
    # 8 samples of 0.25 GFLOPs: 2 microseconds at peak in 95 ms of compute phases.
    tiny = RankSpec(by_dtype={"bf16": 2e9}, batch=8)
    f, facts = _one(low_mfu.RULE(flops_snapshot([tiny, tiny])))
    assert facts.model_class == "small"
    assert facts.parts[0].name == SMALL_BATCH and facts.lead == 0
    assert facts.batch == {0: (8, 64), 1: (8, 64)}  # at most 8x at once
    assert {(x.lever, x.rank, x.current, x.proposed) for x in f.fixes} == {
        ("batch_size", 0, 8, 64),
        ("batch_size", 1, 8, 64),
    }
    assert f.ranks == () and f.predicted_speedup is None
    # No precision gain is claimed where launches, not arithmetic, set the time.
    assert facts.precision == 0.0


def test_no_larger_batch_on_a_rank_whose_memory_climbs_and_within_what_fits() -> None:
    tiny = RankSpec(by_dtype={"bf16": 2e9}, batch=8)
    snap = flops_snapshot([tiny, tiny])
    climbing = Finding(kind="memory_growth", severity="warning", ranks=(0,))
    headroom = Finding(
        kind="memory_headroom",
        severity="info",
        ranks=(1,),
        fixes=(Fix("batch_size", 1, 8, 24, None, ("memory_headroom",)),),
    )
    _, facts = _one(low_mfu.RULE(snap, [climbing, headroom]))
    assert facts.batch == {1: (8, 24)}


def test_a_large_model_is_held_to_a_large_models_reach() -> None:
    # 2 PFLOPs a step over 256 samples (8 TFLOPs each: a large model) at 18% MFU.
    big = RankSpec(by_dtype={"bf16": 2e15}, batch=256, forward_s=3.0, backward_s=8.0)
    _, facts = _one(low_mfu.RULE(flops_snapshot([big, big])))
    assert facts.model_class == "large" and facts.reach == 0.40
    assert facts.mfu < 0.2 and facts.parts[0].name == "device"


def test_thresholds_move_the_verdict() -> None:
    starved = RankSpec(data_wait_s=0.2)  # 13% MFU: above half of 15%
    snap = flops_snapshot([starved, starved])
    assert low_mfu.RULE(snap) == []
    assert len(low_mfu.RULE(snap, share_of_reach=1.0)) == 1


def test_the_engine_runs_it_last_with_the_findings_that_explain_it() -> None:
    assert RULES["low_mfu"] is low_mfu.RULE
    assert list(RULES)[-1] == "low_mfu"
    fp32 = RankSpec(by_dtype={"fp32": 3e12})
    kinds = [f.kind for f in analyze(flops_snapshot([fp32, fp32]))]
    assert "low_mfu" in kinds


def test_the_counted_steps_need_min_steps() -> None:
    fp32 = RankSpec(by_dtype={"fp32": 3e12})
    snap = flops_snapshot([fp32, fp32], steps=5)
    assert low_mfu.RULE(snap) == []
    snap = flops_snapshot([fp32, fp32], steps=5)
    assert len(low_mfu.RULE(snap, min_steps=5)) == 1


def test_evidence_is_plain_data() -> None:
    fp32 = RankSpec(by_dtype={"fp32": 3e12})
    f, _ = _one(low_mfu.RULE(flops_snapshot([fp32, replace(fp32, data_wait_s=0.01)])))
    ev = f.evidence
    assert ev["model_class"] == "medium" and ev["device"] == "NVIDIA H100 80GB HBM3"
    assert ev["parts"][0]["part"] == PRECISION
    assert ev["speedup_model"] == "lever_share"
    assert sum(ev["gap"].values()) == pytest.approx(1 - ev["mfu"], abs=1e-3)


def test_a_low_mfu_warning_does_not_stand_in_for_a_rank_that_holds_the_job_back() -> None:
    # The review (consistency) still finds rank 1, whom rank 0 waits for over the run: the
    # job's efficiency says nothing about whether one rank holds the others back.
    snap = JobBuilder(backward_straggler()).run(60).snapshot()
    job_wide = Finding("low_mfu", "warning", (), predicted_speedup=3.0)
    out = review([job_wide], snap)
    assert [(f.kind, f.ranks) for f in out.findings] == [
        ("utilization_imbalance", (1,)),
        ("low_mfu", ()),
    ]
    assert "low_mfu" in JOB_WIDE
