"""dataparallel_gather in words: the torchrun command, the batch per process, the balanced
scatter; the memory finding it emits on the primary GPU; the evidence's codes in words."""

from __future__ import annotations

from auditor.analysis import analyze
from auditor.analysis.rules import dataparallel_gather
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.helpers.snapshots import dp_snapshot


def test_the_fix_names_the_command_the_batch_and_the_scatter() -> None:
    gather, mem = dataparallel_gather.RULE(dp_snapshot([48, 32, 32, 32]))
    fix = phrase(gather).fixes[0]
    assert "`torchrun --nproc_per_node=4 train.py`" in fix
    assert "batch_size 32 -> 8 per process" in fix
    assert "5, 9, 9, 9 instead of 8, 8, 8, 8" in fix
    assert phrase(gather).summary.startswith("nn.DataParallel gathers every output on node0 GPU 0")
    assert (
        phrase(mem).fixes[0].startswith("give node0 GPU 0 a smaller chunk: 5, 9, 9, 9 for batch 32")
    )


def test_the_symptom_says_the_gathers_fix() -> None:
    findings = analyze(dp_snapshot([48, 32, 32, 32]))
    (gather,) = [f for f in findings if f.kind == "dataparallel_gather"]
    (util,) = [f for f in findings if f.kind == "utilization_imbalance"]
    assert phrase(util).fixes == phrase(gather).fixes


def test_the_evidence_codes_are_worded_in_the_report() -> None:
    gather, mem = dataparallel_gather.RULE(dp_snapshot([48, 32, 32, 32]))
    evidence = ReportFinding.of(gather).evidence
    assert evidence["speedup_model"].startswith("not predicted: one process drives every GPU")
    assert evidence["script_note"].startswith("placeholder: the snapshot does not carry the job")
    # The words take the codes' places: the JSON keys keep their order.
    assert list(evidence) == list(gather.evidence)
    assert (
        ReportFinding.of(mem)
        .evidence["speedup_model"]
        .startswith("not predicted: memory does not set the step time")
    )
    (named, _) = dataparallel_gather.RULE(dp_snapshot([48, 32, 32, 32]), script="imagenet.py")
    assert ReportFinding.of(named).evidence["script_note"] == "given"
    assert "`torchrun --nproc_per_node=4 imagenet.py`" in phrase(named).fixes[0]


def test_the_recorded_scenario_says_the_torchrun_command() -> None:
    from tests.analysis.test_scenarios import load

    (f,) = [f for f in analyze(load("dataparallel_gather")[0]) if f.kind == "dataparallel_gather"]
    assert "`torchrun --nproc_per_node=4 train.py`" in phrase(f).fixes[0]
