"""batch_split under DDP and FSDP (issue 11): an uneven split is at least a warning whatever its
speed effect, because the averaged gradient weighs the ranks' samples unequally and the ranks'
epochs end at different steps; the fix is the equal split that keeps the global batch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.rules import batch_split
from auditor.report.phrasing import phrase
from tests.helpers.jobs import NodeSpec, RankSpec, ddp_snapshot

# A 3:1 split on a 2-core CPU host: rank 0 trains on 48 samples, rank 1 on 16, and the step
# barely grows with the batch (fixed per-step costs dominate on CPU): 105 ms against 100 ms.
# The equal split would not make the job faster; it makes it correct.
CPU_RANK = RankSpec(h2d=0.0, device="cpu", num_workers=0, worker_cpu=None, pin_memory=False)
BIG = replace(CPU_RANK, forward=0.035, backward=0.063, optimizer=0.007, batch_size=48)
SMALL = replace(CPU_RANK, forward=0.033, backward=0.060, optimizer=0.007, batch_size=16)
TWO_CORES = {"node0": NodeSpec(cores=2.0)}


def _only(findings: list[Finding]) -> Finding:
    found = [f for f in findings if f.kind == "batch_split"]
    assert len(found) == 1, [f.to_dict() for f in findings]
    return found[0]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_3_to_1_split_is_a_warning_with_the_equal_split(mode: str) -> None:
    f = _only(batch_split.detect(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES, parallel_mode=mode)))
    assert f.ranks == (0,)
    assert f.severity == "warning"  # before: info, the speed effect being small
    assert f.predicted_speedup is not None and f.predicted_speedup < 1.10
    name = mode.upper()
    assert (
        phrase(f)
        .fixes[0]
        .startswith(
            f"batch_size 48 -> 32 (the equal split: {name} weighs every rank's gradient equally)"
        )
    )
    assert phrase(f).fixes[1] == "batch_size 16 -> 32 (keeps the global batch of 64)"
    assert f.evidence["equal_batch_size"] == {"0": 32, "1": 32}
    assert f.evidence["global_batch"] == 64
    assert f.evidence["sample_weight_ratio"] == 3.0
    assert f.evidence["gradient_weighting"] == (
        f"{name} averages gradients with equal weight per rank, so each sample of rank 1 "
        "(batch 16) counts 3.0x one of rank 0 (batch 48)"
    )
    assert f.evidence["epoch_length"] == (
        "DistributedSampler gives every rank the same samples per epoch: rank 1 (batch 16) "
        "takes 3.0x the steps of rank 0 (batch 48) to go through it, so the ranks' epochs end "
        "at different steps"
    )
    assert phrase(f).summary == (
        "uneven per-rank batches (rank 0: 48, rank 1: 16): each sample of rank 1 counts 3.0x "
        "one of rank 0 in the averaged gradient"
    )


def test_the_faster_per_sample_rank_also_gets_the_loss_weighting_alternative() -> None:
    # By compute per sample rank 0 is 2.9x faster (105 / 48 against 100 / 16 ms), so the split
    # by speed (47 + 17) differs from the equal one: keeping the uneven split is a choice, and
    # the fix says how to keep it correct.
    f = _only(batch_split.detect(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES)))
    assert f.evidence["equalising_batch_size"] == {"0": 47, "1": 17}
    assert (
        phrase(f)
        .fixes[0]
        .endswith(
            ", or keep 48 for its speed and scale each rank's loss by its batch x 2 / 64 so every "
            "sample counts once"
        )
    )


def test_equal_speed_3_to_1_split_is_slow_and_wrong() -> None:
    # Same compute per sample: rank 0 takes 3x rank 1's 50 ms. The equal split makes both
    # 100 ms: before 1 + 150 + 4 = 155 ms, after 1 + 100 + 4 = 105 ms: 1.48x.
    unit = RankSpec(h2d=0.0, forward=0.015, backward=0.030, optimizer=0.005, batch_size=16)
    f = _only(batch_split.detect(ddp_snapshot([unit.scaled(3.0, batch_size=48), unit])))
    assert f.predicted_speedup == pytest.approx(155 / 105, rel=0.02)
    assert f.severity == "warning"
    assert phrase(f).summary.startswith(
        "uneven per-rank batches (rank 0: 48, rank 1: 16): rank 0 holds the others back, and "
        "each sample of rank 1 counts 3.0x one of rank 0"
    )
    assert "or keep" not in phrase(f).fixes[0]  # equal speeds: the equal split is the only fix
    assert phrase(f).fixes[0].endswith("expect about 1.5x")


def test_without_gradient_averaging_only_the_speed_counts() -> None:
    # Ranks that do not average gradients (no DDP or FSDP recognised): the speed effect alone
    # sets the severity, and the evidence makes no claim about weighting.
    f = _only(batch_split.detect(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES, parallel_mode="none")))
    assert f.severity == "info"
    assert "gradient_weighting" not in f.evidence
    assert phrase(f).summary.endswith("rank 0 holds the others back")


def test_verdict_is_not_balanced() -> None:
    findings = analyze(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES))
    split = _only(findings)
    assert split.severity_level >= 1
    for f in findings:
        assert set(f.ranks) <= {0}, f.to_dict()
