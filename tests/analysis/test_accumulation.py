"""Gradient accumulation: a step of several micro-batches. Per-step figures keep their meaning
(step time, samples per step); every batch advice is in the unit the user sets, the micro-batch
(the DataLoader's batch), and says the accumulation; memory is fitted against the micro-batch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from auditor.analysis import analyze
from auditor.analysis.rules import (
    batch_split,
    compute_straggler,
    hardware_straggler,
    memory_headroom,
)
from auditor.samples import Batch, StepSample
from auditor.telemetry.recorded import batch_records, read_recording, write_recording
from tests.analysis.test_hardware_straggler import HOT, gpus_with, job, slow_rank
from tests.helpers.gpus import H100_TOTAL
from tests.helpers.jobs import (
    RankSpec,
    accumulating,
    ddp_snapshot,
    forward_straggler,
    uneven_batch,
)
from tests.helpers.snapshots import batch_ramp
from tests.helpers.units import GIB

PER_MICRO = "(per micro-batch; 4 accumulated per step)"


def test_rank_stats_carry_the_micro_batches_and_their_size() -> None:
    stats = ddp_snapshot(accumulating(forward_straggler())).stats
    s = stats[0]
    assert s.batch_size == 32  # samples per step, as before
    assert s.micro_batches == 4 and s.accumulated == 4
    assert s.micro_batch_size == 8
    assert s.samples_per_s is not None and s.samples_per_s * s.step_s == 32
    plain = ddp_snapshot(forward_straggler()).stats[0]
    assert (plain.micro_batches, plain.micro_batch_size) == (1, 32)


def test_compute_straggler_advises_the_micro_batch() -> None:
    (f,) = compute_straggler.RULE(ddp_snapshot(accumulating(forward_straggler())))
    assert f.ranks == (2,)
    # 1.4x slower per sample: 8 * 100 / 140 = 5.7 -> 6 per micro-batch (not 32 -> 23).
    assert f.facts.ranks[2].batch_size == 8 and f.facts.ranks[2].batch_share == 6
    assert f.facts.ranks[2].accumulated == 4
    assert [(x.lever, x.current, x.proposed) for x in f.fixes if x.lever == "batch_size"] == [
        ("batch_size", 8, 6)
    ]


def test_hardware_straggler_advises_the_micro_batch() -> None:
    (f,) = hardware_straggler.RULE(job(gpus_with(2, HOT), accumulating(slow_rank(2))))
    assert f.ranks == (2,)
    # 8 / 1.4 = 5.7 -> 5 per micro-batch, 4 accumulated per step (the words: phrasing tests).
    gpu = f.facts.ranks[2]
    assert (gpu.batch_size, gpu.batch_share, gpu.accumulated) == (8, 5, 4)
    assert [(x.lever, x.current, x.proposed) for x in f.fixes if x.lever == "batch_size"] == [
        ("batch_size", 8, 5)
    ]


def test_batch_split_compares_steps_and_advises_micro_batches() -> None:
    (f,) = batch_split.RULE(ddp_snapshot(accumulating(uneven_batch())))
    assert f.ranks == (1,)
    # The comparison stays per step: samples each rank processes per optimizer step.
    assert f.evidence["batch_size"] == {"0": 32, "1": 64, "2": 32, "3": 32}
    assert f.facts.batches == {0: 32, 1: 64, 2: 32, 3: 32}
    # The fix in the DataLoader's batch: micro-batches 8, 16, 8, 8 -> 10 each (global 160).
    # (In words: tests/report/phrasing/test_batch_split.py.)
    assert f.evidence["micro_batches"] == {"0": 4, "1": 4, "2": 4, "3": 4}
    assert f.evidence["equal_micro_batch_size"] == {"0": 10, "1": 10, "2": 10, "3": 10}
    assert (f.facts.accumulated, f.facts.micro_equal) == (
        {0: 4, 1: 4, 2: 4, 3: 4},
        {0: 10, 1: 10, 2: 10, 3: 10},
    )
    assert [(x.rank, x.lever, x.current, x.proposed) for x in f.fixes] == [
        (0, "batch_size", 8, 10),
        (1, "batch_size", 16, 10),
        (2, "batch_size", 8, 10),
        (3, "batch_size", 8, 10),
    ]


def test_memory_headroom_fits_memory_against_the_micro_batch() -> None:
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35, micro_batches=4)
    (f,) = memory_headroom.RULE(snap)
    row = f.evidence["per_rank"]["0"]
    # The same fit as without accumulation: one micro-batch's activations are alive at a time.
    assert row["batch_sizes"] == [16, 32, 48, 64]
    assert abs(row["per_sample_bytes"] - 0.35 * GIB) < 1e-3 * GIB
    assert row["current_batch"] == 64 and row["micro_batches"] == 4
    largest = int((0.9 * H100_TOTAL / GIB - 7.0) / 0.35)
    assert row["largest_batch"] == largest
    # The advice is per micro-batch (its wording: tests/report/phrasing/test_memory_headroom.py).
    assert f.facts.ranks[0].accumulated == 4
    assert [(x.rank, x.lever, x.current, x.proposed) for x in f.fixes if x.rank == 0] == [
        (0, "batch_size", 64, largest)
    ]


def test_memory_pressure_sizes_the_micro_batch() -> None:
    snap = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=1.05, micro_batches=4)
    pressure = [f for f in analyze(snap) if f.kind == "memory_pressure"]
    f = pressure[0]
    row = f.evidence["per_rank"]["0"]
    suggested = int((0.85 * H100_TOTAL / GIB - 7.0) / 1.05)
    assert (row["current_batch"], row["suggested_batch"], row["micro_batches"]) == (
        64,
        suggested,
        4,
    )
    # Per micro-batch (its wording: tests/report/phrasing/test_memory_pressure.py).
    assert f.facts.ranks[0].accumulated == 4
    assert (f.facts.ranks[0].batch, f.facts.ranks[0].smaller_batch) == (64, suggested)
    assert ("batch_size", 0, 64, suggested) in [
        (x.lever, x.rank, x.current, x.proposed) for x in f.fixes
    ]


def test_micro_batches_on_the_wire_and_in_recordings(tmp_path: Path) -> None:
    plain = StepSample(rank=0, step=0, time=1.0, step_s=0.1, batch_size=8)
    accumulated = replace(plain, batch_size=32, micro_batches=4)
    # Without accumulation (nor any later optional field: named outside work, a FLOP count,
    # collective bytes) the row and the record are what they were before micro_batches.
    assert len(plain.to_row()) == StepSample.wire_fields().index("micro_batches")
    assert "micro_batches" not in next(iter(batch_records(Batch(steps=(plain,)))))
    assert StepSample.from_row(plain.to_row()) == plain
    assert StepSample.from_row(accumulated.to_row()) == accumulated
    assert accumulated.micro_batch_size == 8 and plain.micro_batch_size == 8
    saving = replace(plain, outside={"checkpoint": 0.05})
    assert StepSample.from_row(saving.to_row()) == saving
    assert StepSample.from_row(replace(accumulated, outside={"logging": 0.01}).to_row()).outside
    path = tmp_path / "r.jsonl"
    write_recording(path, [Batch(steps=(plain, accumulated, saving))])
    assert read_recording(path).batch.steps == (plain, accumulated, saving)


def test_batch_split_with_ranks_that_accumulate_differently() -> None:
    # Micro-batches of 8 everywhere; rank 1 accumulates 4 (32 per step), the others 2 (16).
    specs = [RankSpec(batch_size=16, micro_batches=2) for _ in range(4)]
    specs[1] = RankSpec(micro_batches=4).scaled(2.0, batch_size=32)
    (f,) = batch_split.RULE(ddp_snapshot(specs))
    assert f.ranks == (1,)
    # The equal split per step is 20 (80 over 4): 5 per micro-batch of rank 1, 10 elsewhere.
    assert f.facts.global_batch == 80
    assert f.facts.accumulated == {0: 2, 1: 4, 2: 2, 3: 2}
    assert [(x.rank, x.lever, x.current, x.proposed) for x in f.fixes] == [
        (0, "batch_size", 8, 10),
        (1, "batch_size", 8, 5),
        (2, "batch_size", 8, 10),
        (3, "batch_size", 8, 10),
    ]
