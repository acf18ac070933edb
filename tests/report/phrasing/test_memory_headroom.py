"""memory_headroom in words: the batch that fits and how it was fitted, why a batch does not fit
and what would make room, by the fit or by the measured budget; the evidence's codes in words."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.rules import memory_headroom
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_budget import adam, snap, view
from tests.helpers.snapshots import batch_ramp
from tests.helpers.units import GIB, MIB


def test_roomy_says_the_largest_batch_and_the_learning_rate() -> None:
    (f,) = memory_headroom.RULE(batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35))
    largest = f.evidence["per_rank"]["0"]["largest_batch"]
    fix = phrase(f).fixes[0]
    assert fix.startswith(f"batch_size 64 -> up to {largest} fits node0 GPU 0")
    assert "scale the learning rate" in fix


def test_tight_says_checkpointing_and_mixed_precision_with_numbers() -> None:
    (f,) = memory_headroom.RULE(batch_ramp([48, 56, 64], fixed_gib=20.0, per_sample_gib=0.85))
    row = f.evidence["per_rank"]["1"]
    fix = phrase(f).fixes[1]
    assert "gradient checkpointing" in fix
    assert f"fits up to batch {row['largest_batch_checkpointing']}" in fix
    assert "torch.autocast" in fix
    assert f"batch_size 64 -> {row['largest_batch']}" in fix


def test_a_dominant_model_part_points_at_optimizer_state() -> None:
    (f,) = memory_headroom.RULE(batch_ramp([48, 56, 64], fixed_gib=45.0, per_sample_gib=0.45))
    assert "the model part alone is 46.0 GiB" in phrase(f).fixes[0]
    assert "FSDP" in phrase(f).fixes[0]


def test_a_tight_budget_names_its_lever() -> None:
    (f,) = memory_headroom.RULE(snap(view(0, adam(), batch=64)))
    fix = phrase(f).fixes[0]
    # 640 MiB of activations against a 400 MiB fixed part: checkpointing first.
    assert "the lever is the activations" in fix
    assert fix.index("gradient checkpointing") < fix.index("plain SGD")
    big = adam(
        param_bytes=250 * MIB, param_bytes_by_dtype={"float32": 250 * MIB}, grad_bytes=250 * MIB,
        optimizer_bytes=500 * MIB, optimizer_bytes_by_kind={"exp_avg": 250 * MIB},
    )  # fmt: skip
    (f,) = memory_headroom.RULE(snap(view(0, big)))
    assert "the lever is the fixed part" in phrase(f).fixes[0]


def test_a_cpu_job_is_told_nothing_to_change() -> None:
    cpu = adam(
        device="cpu", device_total_bytes=None, host_total_bytes=64 * GIB,
        host_available_bytes=32 * GIB, local_ranks=2,
    )  # fmt: skip
    (f,) = memory_headroom.RULE(snap(view(0, cpu)))
    assert "->" not in phrase(f).fixes[0] and "nothing to change" in phrase(f).fixes[0]


def test_the_evidence_codes_are_worded_in_the_report() -> None:
    (f,) = memory_headroom.RULE(snap(view(0, adam()), view(1, adam(rank=1))))
    evidence = ReportFinding.of(f).evidence
    assert evidence["speedup_model"] == (
        "not predicted: a larger batch is faster only while the GPU is not saturated"
    )
    row = evidence["per_rank"]["0"]
    assert row["source"] == "measured budget (probe)"
    assert row["capacity_source"] == "device total (its CUDA context not measured)"
    assert list(evidence) == list(f.evidence)
    assert list(row) == list(f.evidence["per_rank"]["0"])
    outside = adam(device_outside_bytes=100 * MIB)
    (g,) = memory_headroom.RULE(snap(view(0, outside), view(1, adam(rank=1))))
    assert ReportFinding.of(g).evidence["per_rank"]["0"]["capacity_source"] == (
        "device total less what the CUDA context and other processes hold"
    )
    # A fitted rank's source stays as it was (already a code).
    (fit,) = memory_headroom.RULE(batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35))
    assert ReportFinding.of(fit).evidence["per_rank"]["0"]["source"] == "probe mem_peak_bytes"


def test_under_accumulation_the_advice_is_per_micro_batch() -> None:
    snap_ = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35, micro_batches=4)
    (f,) = memory_headroom.RULE(snap_)
    largest = f.evidence["per_rank"]["0"]["largest_batch"]
    words = phrase(f)
    assert words.fixes[0].startswith(
        f"batch_size 64 -> up to {largest} (per micro-batch; 4 accumulated per step) fits"
    )
    assert f"a micro-batch of up to {largest} fits (now 64; 4 accumulated per step)" in (
        words.summary
    )


def test_a_held_back_rank_is_told_why_and_offered_no_larger_batch() -> None:
    growing = [Finding(kind="memory_growth", severity="critical", ranks=(0,))]
    snap_ = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=0.35)
    _, held = memory_headroom.RULE(snap_, explained=growing)
    words = phrase(held)
    assert words.summary == (
        "rank 0: no batch advice while its memory climbs (memory_growth): memory measured now "
        "says nothing about the batch the rank can afford"
    )
    largest = held.facts.ranks[0].largest_batch
    assert words.fixes[0] == (
        "keep batch 64: no larger batch while its memory climbs (memory_growth); today's level "
        f"would fit up to {largest}, but the climb is using up that room; fix the climb first"
    )
    assert "->" not in words.fixes[0]
    tight = batch_ramp([48, 56, 64], fixed_gib=20.0, per_sample_gib=0.85)
    _, held = memory_headroom.RULE(tight, explained=growing)
    assert phrase(held).fixes[0] == (
        "no advice on batch 64 while its memory climbs (memory_growth): the level it is judged "
        "at keeps rising; fix the climb first, then size the batch again"
    )


def test_a_held_back_cpu_rank_is_not_told_an_absurd_batch() -> None:
    cpu = adam(
        device="cpu", device_total_bytes=None, host_total_bytes=64 * GIB,
        host_available_bytes=32 * GIB, local_ranks=2,
    )  # fmt: skip
    growing = [Finding(kind="memory_growth", severity="critical", ranks=(0,))]
    (held,) = memory_headroom.RULE(snap(view(0, cpu)), explained=growing)
    assert not held.facts.ranks[0].on_gpu
    assert phrase(held).fixes[0] == (
        "keep batch 8: no larger batch while its memory climbs (memory_growth); fix the climb first"
    )
