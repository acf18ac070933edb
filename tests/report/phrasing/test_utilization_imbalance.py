"""utilization_imbalance in words: the spread, its cause, who the others wait for (and in which
collectives); the blamed ranks' fixes are their cause's; the evidence's words the JSON report
has always carried (ranks whose wait was not measured, what NVML counts as busy)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.rules import utilization_imbalance
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_utilization_imbalance import BIG_BATCH, SLOW, busy_90_50
from tests.analysis.test_utilization_imbalance_gpus import STARVED_UTILS, with_gpus
from tests.analysis.test_utilization_imbalance_waits import _trainer
from tests.helpers.jobs import ddp_snapshot, starved_rank3
from tests.helpers.snapshots import collective_ops


def _of(findings: list[Finding], kind: str) -> Finding:
    (f,) = [f for f in findings if f.kind == kind]
    return f


@pytest.mark.parametrize(
    ("specs", "slow_rank", "cause"),
    [
        pytest.param(busy_90_50(BIG_BATCH, 1), 1, "batch_split", id="uneven-batch-rank1"),
        pytest.param(busy_90_50(SLOW, 2), 2, "compute_straggler", id="straggler-rank2"),
    ],
)
def test_the_blamed_rank_gets_its_cause_fix(specs: list, slow_rank: int, cause: str) -> None:
    findings = analyze(ddp_snapshot(specs))
    f = _of(findings, "utilization_imbalance")
    source = _of(findings, cause)
    assert phrase(f).fixes == {slow_rank: phrase(source).fixes[slow_rank]}
    assert f" because of {cause}: the others wait for rank {slow_rank}" in phrase(f).summary


def test_without_a_cause_it_asks_to_profile_the_rank() -> None:
    (f,) = utilization_imbalance.RULE(ddp_snapshot(busy_90_50(SLOW, 2)))
    words = phrase(f)
    assert set(words.fixes) == {2}
    assert words.fixes[2].startswith("profile rank 2: it is busy 9")
    assert words.fixes[2].endswith("of each step while its peers wait for it")
    assert re.match(r"busy time spread 9\d% \(rank 2\) against 5\d% \(rank \d\): ", words.summary)
    assert words.summary.endswith(": the others wait for rank 2")


def test_names_the_collectives_the_others_wait_in() -> None:
    snap = ddp_snapshot(busy_90_50(SLOW, 2))
    for r in (0, 1, 3):
        snap = collective_ops(snap, r, {"all_reduce": 1, "ddp_allreduce": 9})
    snap = collective_ops(snap, 2, {"ddp_allreduce": 1})
    f = _of(analyze(snap), "utilization_imbalance")
    assert phrase(f).summary.endswith("the others wait for rank 2 in ddp_allreduce/all_reduce")
    # Unnamed (an older probe): the summary says only who is waited for.
    plain = _of(analyze(ddp_snapshot(busy_90_50(SLOW, 2))), "utilization_imbalance")
    assert phrase(plain).summary.endswith("the others wait for rank 2")


def test_an_unmeasured_wait_is_said_in_the_evidence_in_place() -> None:
    specs = busy_90_50(SLOW, 2)
    specs[0] = replace(specs[0], measure_wait=False)
    (f,) = utilization_imbalance.RULE(ddp_snapshot(specs))
    evidence = ReportFinding.of(f).evidence
    assert evidence["not_measured"] == [
        "collective wait on rank 0: its waiting may read as busy time"
    ]
    assert list(evidence) == list(f.evidence)


def test_the_gpu_spread_and_what_nvml_counts_as_busy() -> None:
    findings = analyze(with_gpus(starved_rank3(), STARVED_UTILS))
    f = _of(findings, "utilization_imbalance")
    assert phrase(f).summary.startswith(
        "GPU busy time spread 100% (node0 GPU 0) against 38% (node0 GPU 3)"
    )
    evidence = ReportFinding.of(f).evidence
    assert list(evidence) == [*f.evidence, "gpu_note"]
    assert evidence["gpu_note"] == "NVML counts a rank waiting in an all-reduce as busy"


@pytest.mark.parametrize("booked_as_h2d", [True, False])
def test_the_trainer_job_in_words(booked_as_h2d: bool) -> None:
    findings = analyze(_trainer(gather_booked_as_h2d=booked_as_h2d))
    starved = _of(findings, "data_starvation")
    if booked_as_h2d:
        f = _of(findings, "utilization_imbalance")
        assert phrase(f).summary.endswith("because of data_starvation: the others wait for rank 1")
    else:
        assert re.search(
            r"; rank 0 waits 10\d ms a step for it in all_gather/ddp_allreduce$",
            phrase(starved).summary,
        ), phrase(starved).summary
