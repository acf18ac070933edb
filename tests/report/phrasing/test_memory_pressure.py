"""memory_pressure in words: how full, how fast, when full; what is kept across steps, the smaller
batch and the usual levers; a GPU no rank owns; a CPU host short of memory; the evidence's codes
in words."""

from __future__ import annotations

from auditor.analysis import analyze
from auditor.analysis.rules import memory_pressure
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_budget import adam, snap, view
from tests.analysis.test_memory_pressure import LEAKING, two_ranks
from tests.helpers.gpus import H100_TOTAL
from tests.helpers.snapshots import batch_ramp
from tests.helpers.units import GIB


def test_the_fix_says_the_leak_the_batch_and_the_levers() -> None:
    (f,) = memory_pressure.RULE(two_ranks(LEAKING))
    fix = phrase(f).fixes[1]
    assert fix.startswith("node0 GPU 1 peaks at 92% of 79.6 GiB and rises 12000 MiB/min")
    # Constant batch while memory rose: the leak comes first.
    assert "the batch stayed at 32 while memory rose" in fix
    suggested = int(32 * 0.85 * H100_TOTAL / f.evidence["mem_used_max_bytes"])
    assert f"batch_size 32 -> {suggested}" in fix
    assert "gradient checkpointing" in fix
    assert "torch.autocast" in fix


def test_an_unowned_gpu_gets_its_fix_in_the_evidence() -> None:
    (f,) = memory_pressure.RULE(two_ranks(LEAKING, owners=[[0], []]))
    assert phrase(f).fixes == {}
    assert phrase(f).notes["fix"].startswith("node0 GPU 1 peaks at 92%")


def test_a_varied_batch_says_no_leak() -> None:
    findings = analyze(batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=1.05))
    f = next(f for f in findings if f.kind == "memory_pressure")
    assert "the batch stayed" not in phrase(f).fixes[0]


def test_a_cpu_host_short_of_memory_names_the_measured_levers() -> None:
    cpu = adam(
        device="cpu", device_total_bytes=None, host_total_bytes=64 * GIB,
        host_available_bytes=2 * GIB,
    )  # fmt: skip
    (f,) = memory_pressure.RULE(snap(view(0, cpu)))
    assert "plain SGD" in phrase(f).fixes[0]
    evidence = ReportFinding.of(f).evidence
    assert evidence["per_rank"]["0"]["source"] == "measured budget (probe)"
    assert evidence["per_rank"]["0"]["capacity_source"] == "host memory available per rank"
    assert list(evidence) == list(f.evidence)


def test_the_evidence_codes_are_worded_in_the_report() -> None:
    (f,) = memory_pressure.RULE(two_ranks(LEAKING))
    evidence = ReportFinding.of(f).evidence
    assert evidence["speedup_model"] == (
        "not predicted: prevents an out-of-memory crash, does not change the step time"
    )
    assert evidence["per_rank"]["1"]["basis"] == (
        "memory assumed in proportion to the batch (overstates the saving)"
    )
    # The words keep the evidence's order; the unowned-GPU fix comes last (None here).
    assert list(evidence) == [*f.evidence, "fix"]
    assert list(evidence["per_rank"]["1"]) == list(f.evidence["per_rank"]["1"])
    findings = analyze(batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=1.05))
    fitted = next(f for f in findings if f.kind == "memory_pressure")
    row = ReportFinding.of(fitted).evidence["per_rank"]["0"]
    assert row["basis"] == "fitted memory = a + b * batch"


def test_under_accumulation_the_batch_is_per_micro_batch() -> None:
    snap_ = batch_ramp([16, 32, 48, 64], fixed_gib=6.0, per_sample_gib=1.05, micro_batches=4)
    f = next(f for f in analyze(snap_) if f.kind == "memory_pressure")
    suggested = f.evidence["per_rank"]["0"]["suggested_batch"]
    assert (
        f"batch_size 64 -> {suggested} (per micro-batch; 4 accumulated per step)"
        in phrase(f).fixes[0]
    )
