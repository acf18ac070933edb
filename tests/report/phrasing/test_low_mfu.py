"""low_mfu in words: the job's MFU and FLOP/s on its card against its class's reach, where the
time goes, the lever that closes the gap first; every rank alike said as the job's."""

from __future__ import annotations

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import low_mfu
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.report.phrasing.low_mfu import fmt_mfu, mfu_text
from tests.helpers.flops import RankSpec, flops_snapshot


def _finding(specs: list[RankSpec], explained: list[Finding] | None = None) -> Finding:
    (f,) = low_mfu.RULE(flops_snapshot(specs), explained or [])
    return f


def test_fp32_matmuls_in_words_lead_with_bf16_and_tf32() -> None:
    f = _finding([RankSpec(by_dtype={"fp32": 3e12})] * 2)
    words = phrase(f)
    assert words.summary == (
        "the job reaches 44% MFU (59 TFLOP/s on NVIDIA H100 80GB HBM3) in fp32 over the whole "
        "run, where a mid-sized model (47 GFLOPs a sample) reaches about 15%; its fp32 matmuls "
        "run at a fraction of the tensor cores' rate: bf16 would give back about 87% of the "
        "time; the time lost: kernels below peak (memory-bound and element-wise work, "
        "attention) 49%"
    )
    assert words.fixes == {}  # every rank alike: the job's fix, not a rank's
    assert words.notes["fix"] == (
        "run the model in bf16: torch.autocast(device_type='cuda', dtype=torch.bfloat16) "
        "around forward and loss; expect about 7.6x; at the least allow TF32: "
        "torch.backends.cuda.matmul.allow_tf32 = True (or "
        "torch.set_float32_matmul_precision('high')); expect about 5.1x"
    )
    rf = ReportFinding.of(f)
    assert rf.unowned_fix == words.notes["fix"]
    assert rf.ranks == () and {a.lever for a in rf.actions} == {"autocast_bf16", "tf32"}


def test_a_small_micro_batch_in_words() -> None:
    words = phrase(_finding([RankSpec(by_dtype={"bf16": 2e9}, batch=8)] * 2))
    assert "reaches <0.1% MFU (39 GFLOP/s on NVIDIA H100 80GB HBM3) in bf16" in words.summary
    assert "a small model (250 MFLOPs a sample) reaches about 5%" in words.summary
    assert "micro-batches too small to fill the GPU 93%" in words.summary
    assert words.notes["fix"] == (
        "a larger micro-batch, ranks 0, 1: 8 -> 64 (the DataLoader's batch_size; scale the "
        "learning rate with it)"
    )
    assert str(words.notes["speedup_model"]).startswith("not predicted: a larger batch")


def test_the_explaining_finding_is_named_not_repeated() -> None:
    explaining = Finding(
        kind="data_starvation",
        severity="warning",
        ranks=(0,),
        fixes=(Fix("num_workers", 0, 2, 8, 1.8, ("data_starvation",)),),
    )
    f = _finding([RankSpec(data_wait_s=0.5), RankSpec(collective_wait_s=0.5)], [explaining])
    words = phrase(f)
    assert "the time lost: waiting for data 83% (data_starvation on rank 0, above)" in (
        words.summary
    )
    assert words.notes["fix"] == "the fix data_starvation gives for waiting for data (83%)"


def test_no_lever_said_plainly() -> None:
    words = phrase(_finding([RankSpec(data_wait_s=0.5)] * 3))
    assert "the time lost: waiting for data 83%" in words.summary
    assert words.notes["fix"] == (
        "no lever the auditor can name for these parts: see where the time goes above"
    )
    assert words.notes["speedup_model"] == "not predicted: no lever to pull"


def test_mfu_figures_in_words() -> None:
    assert fmt_mfu(0.42) == "42%" and fmt_mfu(0.042) == "4.2%" and fmt_mfu(0.0004) == "<0.1%"
    assert fmt_mfu(None) == "-"
    assert mfu_text(0.42, 4.2e14, "NVIDIA H200") == "42% MFU (420 TFLOP/s on NVIDIA H200)"
    assert mfu_text(None, 3.1e9, None, gpu=False) == "3.1 GFLOP/s (no MFU on a CPU)"
    assert mfu_text(None, 3.1e9, None) == "3.1 GFLOP/s (no MFU: no GPU sample named the card)"
    assert mfu_text(None, 5e13, "NVIDIA B200") == (
        "50 TFLOP/s (no MFU: no peak figure for NVIDIA B200)"
    )


def test_a_card_without_bf16_is_told_fp16_with_a_grad_scaler() -> None:
    fp32 = RankSpec(by_dtype={"fp32": 1e12})
    (f,) = low_mfu.RULE(flops_snapshot([fp32, fp32], model="Tesla V100-SXM2-32GB"))
    assert {(x.lever, x.proposed) for x in f.fixes} == {("autocast_bf16", "fp16")}
    fix = phrase(f).notes["fix"]
    assert isinstance(fix, str) and fix.startswith("run the model in fp16:")
    assert "GradScaler" in fix
