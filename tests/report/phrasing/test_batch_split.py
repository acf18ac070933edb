"""batch_split in words: the uneven split, who holds the others back and whose samples count
more, the equal split per rank (with the loss-weighting alternative where speeds differ, and in
micro-batches under gradient accumulation); DataParallel's scatter and the batches that divide
by the GPU count; and the evidence's codes in words (gradient weighting, epoch lengths, the
speed-up model)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis.rules import batch_split
from auditor.analysis.snapshot import Snapshot
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_batch_split_dataparallel import dp_batch
from tests.helpers.jobs import NodeSpec, RankSpec, ddp_snapshot, uneven_batch

RULE = batch_split.RULE
PER_MICRO = "(per micro-batch; 4 accumulated per step)"
CPU_RANK = RankSpec(h2d=0.0, device="cpu", num_workers=0, worker_cpu=None, pin_memory=False)
BIG = replace(CPU_RANK, forward=0.035, backward=0.063, optimizer=0.007, batch_size=48)
SMALL = replace(CPU_RANK, forward=0.033, backward=0.060, optimizer=0.007, batch_size=16)
TWO_CORES = {"node0": NodeSpec(cores=2.0)}


def test_equal_split_for_every_rank() -> None:
    (f,) = RULE(ddp_snapshot(uneven_batch()))
    words = phrase(f)
    assert words.summary.startswith(
        "uneven per-rank batches (rank 0: 32, rank 1: 64, rank 2: 32, rank 3: 32): rank 1 holds "
        "the others back"
    )
    assert words.fixes[1].startswith("batch_size 64 -> 40")
    for r in (0, 2, 3):
        assert words.fixes[r].startswith("batch_size 32 -> 40 (keeps the global batch of 160)")


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_3_to_1_split_in_words(mode: str) -> None:
    (f,) = RULE(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES, parallel_mode=mode))
    name = mode.upper()
    words = phrase(f)
    assert words.fixes[0].startswith(
        f"batch_size 48 -> 32 (the equal split: {name} weighs every rank's gradient equally)"
    )
    assert words.fixes[1] == "batch_size 16 -> 32 (keeps the global batch of 64)"
    assert words.summary == (
        "uneven per-rank batches (rank 0: 48, rank 1: 16): each sample of rank 1 counts 3.0x "
        "one of rank 0 in the averaged gradient"
    )
    evidence = ReportFinding.of(f).evidence
    assert evidence["gradient_weighting"] == (
        f"{name} averages gradients with equal weight per rank, so each sample of rank 1 "
        "(batch 16) counts 3.0x one of rank 0 (batch 48)"
    )
    assert evidence["epoch_length"] == (
        "DistributedSampler gives every rank the same samples per epoch: rank 1 (batch 16) "
        "takes 3.0x the steps of rank 0 (batch 48) to go through it, so the ranks' epochs end "
        "at different steps"
    )
    assert list(evidence) == list(f.evidence)  # in place: the JSON's order


def test_epochs_without_a_distributed_sampler() -> None:
    snap = ddp_snapshot([BIG, SMALL], nodes=TWO_CORES)
    views = tuple(
        replace(v, info=replace(v.info, loader=replace(v.info.loader, sampler="RandomSampler")))
        for v in snap.ranks
        if v.info.loader is not None
    )
    (f,) = RULE(replace(snap, ranks=views))
    assert not f.facts.distributed_sampler
    assert ReportFinding.of(f).evidence["epoch_length"] == (
        "if every rank draws the same samples per epoch (as with DistributedSampler), rank 1 "
        "(batch 16) takes 3.0x the steps of rank 0 (batch 48) to go through it, so the ranks' "
        "epochs end at different steps"
    )


def test_loss_weighting_alternative_where_speeds_differ() -> None:
    (f,) = RULE(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES))
    assert (
        phrase(f)
        .fixes[0]
        .endswith(
            ", or keep 48 for its speed and scale each rank's loss by its batch x 2 / 64 so every "
            "sample counts once"
        )
    )


def test_equal_speeds_hold_the_others_back() -> None:
    unit = RankSpec(h2d=0.0, forward=0.015, backward=0.030, optimizer=0.005, batch_size=16)
    (f,) = RULE(ddp_snapshot([unit.scaled(3.0, batch_size=48), unit]))
    words = phrase(f)
    assert words.summary.startswith(
        "uneven per-rank batches (rank 0: 48, rank 1: 16): rank 0 holds the others back, and "
        "each sample of rank 1 counts 3.0x one of rank 0"
    )
    assert "or keep" not in words.fixes[0]
    assert words.fixes[0].endswith("expect about 1.5x")


def test_without_gradient_averaging_only_the_speed() -> None:
    (f,) = RULE(ddp_snapshot([BIG, SMALL], nodes=TWO_CORES, parallel_mode="none"))
    assert phrase(f).summary.endswith("rank 0 holds the others back")
    assert "gradient_weighting" not in ReportFinding.of(f).evidence


def _accumulating(specs: list[RankSpec], n: int = 4) -> list[RankSpec]:
    return [replace(s, micro_batches=n) for s in specs]


def test_micro_batches_in_words() -> None:
    (f,) = RULE(ddp_snapshot(_accumulating(uneven_batch())))
    words = phrase(f)
    assert words.summary.startswith(
        "uneven per-rank batches (rank 0: 32, rank 1: 64, rank 2: 32, rank 3: 32)"
    )
    assert words.fixes[1].startswith(f"batch_size 16 -> 10 {PER_MICRO[:-1]})")
    assert words.fixes[0].startswith(
        "batch_size 8 -> 10 (per micro-batch; 4 accumulated per step; keeps the global batch "
        "of 160 per step)"
    )


def test_micro_batches_accumulated_differently_in_words() -> None:
    specs = [RankSpec(batch_size=16, micro_batches=2) for _ in range(4)]
    specs[1] = RankSpec(micro_batches=4).scaled(2.0, batch_size=32)
    (f,) = RULE(ddp_snapshot(specs))
    fixes = phrase(f).fixes
    assert fixes[1].startswith(f"batch_size 8 -> 5 {PER_MICRO}")
    assert fixes[0].startswith(
        "batch_size 8 -> 10 (per micro-batch; 2 accumulated per step; keeps the global batch "
        "of 80 per step)"
    )


def test_dataparallel_in_words() -> None:
    snap: Snapshot = dp_batch(30)
    (f,) = RULE(snap)
    words = phrase(f)
    assert words.summary == (
        "DataParallel rank 0 splits batch 30 over 4 GPUs as 8, 8, 8, 6: GPU 3 gets 6 and idles "
        "while the others finish"
    )
    assert words.fixes[0].startswith("batch_size 30 -> 32 (8 per GPU) or 28 (7 per GPU)")
    assert "8, 8, 8, 6 (GPU 3 gets 6)" in words.fixes[0]
    assert "8, 8, 7, 7" in words.fixes[0]
    evidence = ReportFinding.of(f).evidence
    assert evidence["speedup_model"] == (
        "samples per second: compute paced by the largest chunk, the rest of the step unchanged"
    )
    assert list(evidence) == list(f.evidence)


def test_the_recorded_dataparallel_job_in_words() -> None:
    from tests.analysis.test_scenarios import load

    (f,) = RULE(load("dp_batch_30_over_4")[0])
    assert phrase(f).fixes[0].startswith("batch_size 30 -> 32 (8 per GPU) or 28 (7 per GPU)")
