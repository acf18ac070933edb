"""batch_split under DDP and FSDP (issue 11): an uneven split is at least a warning whatever its
speed effect, because the averaged gradient weighs the ranks' samples unequally and the ranks'
epochs end at different steps; the fix is the equal split that keeps the global batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import batch_split
from auditor.analysis.rules.batch_split import DISTRIBUTED_SAMPLER, EQUAL_PER_RANK, KIND
from tests.helpers.jobs import NodeSpec, RankSpec, ddp_snapshot

# A 3:1 split on a 2-core CPU host: rank 0 trains on 48 samples, rank 1 on 16, and the step
# barely grows with the batch (fixed per-step costs dominate on CPU): 105 ms against 100 ms.
# The equal split would not make the job faster; it makes it correct.
CPU_RANK = RankSpec(h2d=0.0, device="cpu", num_workers=0, worker_cpu=None, pin_memory=False)
BIG = replace(CPU_RANK, forward=0.035, backward=0.063, optimizer=0.007, batch_size=48)
SMALL = replace(CPU_RANK, forward=0.033, backward=0.060, optimizer=0.007, batch_size=16)
TWO_CORES = {"node0": NodeSpec(cores=2.0)}


RULE = batch_split.RULE


def _only(findings: list[Finding]) -> Finding:
    found = [f for f in findings if f.kind == "batch_split"]
    assert len(found) == 1, [f.to_dict() for f in findings]
    return found[0]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_3_to_1_split_is_a_warning_with_the_equal_split(mode: str) -> None:
    f = _only(RULE(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES, parallel_mode=mode)))
    assert f.ranks == (0,)
    assert f.severity == "warning"  # before: info, the speed effect being small
    assert f.predicted_speedup is not None and f.predicted_speedup < 1.10
    name = mode.upper()
    facts = f.facts
    assert (facts.averaged_by, facts.small, facts.large) == (name, (1,), (0,))
    assert facts.sample_weight == 3.0
    assert facts.distributed_sampler
    assert facts.speeds_differ  # rank 0 is faster per sample
    speedup = f.predicted_speedup
    assert f.fixes == (
        Fix("batch_size", 0, 48, 32, speedup, (KIND,)),
        # Or keep 48 with rank 0's loss scaled by 48 x 2 / 64.
        Fix("loss_weight", 0, 1.0, 1.5, speedup, (KIND,)),
        Fix("batch_size", 1, 16, 32, speedup, (KIND,)),
    )
    assert f.evidence["equal_batch_size"] == {"0": 32, "1": 32}
    assert f.evidence["global_batch"] == 64
    assert f.evidence["sample_weight_ratio"] == 3.0
    assert f.evidence["gradient_weighting"] == EQUAL_PER_RANK
    assert f.evidence["epoch_length"] == DISTRIBUTED_SAMPLER
    assert list(f.evidence)[-3:] == ["gradient_weighting", "epoch_length", "sample_weight_ratio"]


def test_the_faster_per_sample_rank_also_gets_the_loss_weighting_alternative() -> None:
    # By compute per sample rank 0 is 2.9x faster (105 / 48 against 100 / 16 ms), so the split
    # by speed (47 + 17) differs from the equal one: keeping the uneven split is a choice, and
    # the fix says how to keep it correct.
    f = _only(RULE(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES)))
    assert f.evidence["equalising_batch_size"] == {"0": 47, "1": 17}
    assert f.facts.speeds_differ
    weights = [fix for fix in f.fixes if fix.lever == "loss_weight"]
    assert weights == [Fix("loss_weight", 0, 1.0, 1.5, f.predicted_speedup, (KIND,))]


def test_equal_speed_3_to_1_split_is_slow_and_wrong() -> None:
    # Same compute per sample: rank 0 takes 3x rank 1's 50 ms. The equal split makes both
    # 100 ms: before 1 + 150 + 4 = 155 ms, after 1 + 100 + 4 = 105 ms: 1.48x.
    unit = RankSpec(h2d=0.0, forward=0.015, backward=0.030, optimizer=0.005, batch_size=16)
    f = _only(RULE(ddp_snapshot([unit.scaled(3.0, batch_size=48), unit])))
    assert f.predicted_speedup == pytest.approx(155 / 105, rel=0.02)
    assert f.severity == "warning"
    assert f.ranks == (0,)
    assert (f.facts.averaged_by, f.facts.sample_weight) == ("DDP", 3.0)
    # Equal speeds: the equal split is the only fix (no loss-weighting alternative).
    assert not f.facts.speeds_differ
    assert f.fixes == (
        Fix("batch_size", 0, 48, 32, f.predicted_speedup, (KIND,)),
        Fix("batch_size", 1, 16, 32, f.predicted_speedup, (KIND,)),
    )


def test_without_gradient_averaging_only_the_speed_counts() -> None:
    # Ranks that do not average gradients (no DDP or FSDP recognised): the speed effect alone
    # sets the severity, and the evidence makes no claim about weighting.
    f = _only(RULE(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES, parallel_mode="none")))
    assert f.severity == "info"
    assert "gradient_weighting" not in f.evidence
    assert "epoch_length" not in f.evidence
    assert f.facts.averaged_by == ""
    assert "loss_weight" not in {fix.lever for fix in f.fixes}


def test_verdict_is_not_balanced() -> None:
    findings = analyze(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES))
    split = _only(findings)
    assert split.severity_level >= 1
    for f in findings:
        assert set(f.ranks) <= {0}, f.to_dict()
