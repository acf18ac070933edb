"""``auditor run --apply`` in the report: the plan a report's fixes make, the report of a run
made with one, the verdict's words, and ``compare``'s predicted beside achieved per finding."""

from __future__ import annotations

from typing import Any

import pytest

from auditor.analysis.fixes import Fix
from auditor.configs import ApplyPlan
from auditor.report.applied import (
    applied_line,
    check_value,
    parse_value,
    plan_from_report,
    plan_lines,
    verdict_lines,
    with_plan,
)
from auditor.report.compare import compare_reports, render_compare
from auditor.report.model import JobSummary, RankEntry, Report, ReportFinding
from auditor.report.terminal import render_verdict

LOADER = {
    "num_workers": 0,
    "pin_memory": False,
    "prefetch_factor": None,
    "persistent_workers": False,
    "batch_size": 32,
    "drop_last": True,
    "sampler": "DistributedSampler",
    "dataset": "SyntheticImages",
}


def starved(**rank1: Any) -> Report:
    """BEFORE: rank 1 starves with num_workers=0; the verdict proposes 7 workers and pinning,
    and a batch size change that needs the script."""
    return Report(
        job=JobSummary(name="starved_rank", world_size=2, parallel_mode="ddp"),
        ranks=(
            RankEntry(rank=0, step_s=0.2, loader=dict(LOADER)),
            RankEntry(rank=1, step_s=0.2, loader={**LOADER, **rank1}),
        ),
        findings=(
            ReportFinding(
                kind="batch_split",
                severity="warning",
                ranks=(1,),
                predicted_speedup=1.1,
                actions=(Fix("batch_size", 1, 32, 64, 1.1, ("batch_split",)),),
            ),
            ReportFinding(
                kind="data_starvation",
                severity="critical",
                ranks=(1,),
                predicted_speedup=4.6,
                actions=(
                    Fix("num_workers", 1, 0, 7, 4.6, ("data_starvation",)),
                    Fix("pin_memory", 1, False, True, 4.6, ("data_starvation",)),
                ),
            ),
        ),
    )


def test_a_reports_loader_fixes_make_the_plan() -> None:
    levers, match, other = plan_from_report(starved())
    assert levers == {1: {"num_workers": 7, "pin_memory": True}}
    # The training loader as the report saw it: levers, batch size and dataset, not the sampler.
    assert match == {
        1: {
            "num_workers": 0,
            "pin_memory": False,
            "persistent_workers": False,
            "prefetch_factor": None,
            "batch_size": 32,
            "dataset": "SyntheticImages",
        }
    }
    assert [(f.rank, f.lever, f.current, f.proposed) for f in other] == [(1, "batch_size", 32, 64)]


def test_without_the_ranks_loader_the_fixes_current_values_match() -> None:
    rep = starved()
    rep = Report(job=rep.job, ranks=(RankEntry(rank=0), RankEntry(rank=1)), findings=rep.findings)
    _, match, _ = plan_from_report(rep)
    assert match == {1: {"num_workers": 0, "pin_memory": False}}


def test_a_proposed_value_of_the_wrong_type_is_refused() -> None:
    bad = ReportFinding(
        kind="data_starvation",
        severity="critical",
        ranks=(1,),
        actions=(Fix("num_workers", 1, 0, "seven"),),
    )
    with pytest.raises(ValueError, match="rank 1: num_workers takes an integer"):
        plan_from_report(Report(findings=(bad,)))


@pytest.mark.parametrize(
    ("lever", "text", "value"),
    [
        ("num_workers", "7", 7),
        ("num_workers", "0", 0),
        ("prefetch_factor", "4", 4),
        ("pin_memory", "true", True),
        ("pin_memory", "Off", False),
        ("persistent_workers", "1", True),
    ],
)
def test_values_from_the_command_line(lever: str, text: str, value: Any) -> None:
    assert parse_value(lever, text) == value


@pytest.mark.parametrize(
    ("lever", "text", "error"),
    [
        ("num_workers", "seven", "takes an integer"),
        ("num_workers", "-1", "integer >= 0"),
        ("num_workers", "2.5", "takes an integer"),
        ("prefetch_factor", "0", "integer >= 1"),
        ("pin_memory", "maybe", "true or false"),
    ],
)
def test_wrong_values_from_the_command_line(lever: str, text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_value(lever, text)
    with pytest.raises(ValueError, match="not a loader lever"):
        check_value("batch_size", 64)


def plan() -> ApplyPlan:
    return ApplyPlan(
        levers={1: {"num_workers": 7, "pin_memory": True, "prefetch_factor": 4}},
        match={1: {"num_workers": 0}},
        not_applied=((1, "batch_size", 32, 64), (0, "rank_work", None, None)),
        sources=("before.json",),
    )


def after_run(applied: bool = True) -> Report:
    """AFTER, as the run builds it: rank 1's probe moved two levers and kept one."""
    moved = (
        (
            {"lever": "num_workers", "from": 0, "to": 7},
            {"lever": "pin_memory", "from": False, "to": True},
        )
        if applied
        else ()
    )
    kept = ({"lever": "prefetch_factor", "reason": "needs_workers"},) if applied else ()
    rank1 = {**LOADER, "num_workers": 7 if applied else 0, "pin_memory": applied}
    return Report(
        job=JobSummary(name="starved_rank", world_size=2, parallel_mode="ddp"),
        ranks=(
            RankEntry(rank=0, step_s=0.05, loader=dict(LOADER)),
            RankEntry(rank=1, step_s=0.05, loader=rank1, applied=moved, not_applied=kept),
        ),
    )


def test_the_report_of_a_run_with_a_plan_holds_it() -> None:
    rep = with_plan(after_run(), plan())
    doc = rep.to_dict()
    assert doc["job"]["apply"] == {
        "sources": ["before.json"],
        "levers": {"1": {"num_workers": 7, "pin_memory": True, "prefetch_factor": 4}},
        "not_applied": [
            {"rank": 1, "lever": "batch_size", "current": 32, "proposed": 64},
            {"rank": 0, "lever": "rank_work", "current": None, "proposed": None},
        ],
    }
    assert doc["ranks"][1]["applied"] == [
        {"lever": "num_workers", "from": 0, "to": 7},
        {"lever": "pin_memory", "from": False, "to": True},
    ]
    assert doc["ranks"][1]["not_applied"] == [
        {"lever": "prefetch_factor", "value": 4, "reason": "needs_workers"}
    ]
    assert doc["ranks"][0]["applied"] == [] and doc["ranks"][0]["not_applied"] == []
    assert Report.from_dict(doc) == rep  # read back as written
    assert with_plan(after_run(), None) == after_run()
    assert "apply" not in after_run().to_dict()["job"]  # a run without a plan: no new job key


def test_levers_no_loader_took_are_named() -> None:
    rep = with_plan(after_run(applied=False), plan())
    assert rep.ranks[1].not_applied == (
        {"lever": "num_workers", "value": 7, "reason": "no_loader"},
        {"lever": "pin_memory", "value": True, "reason": "no_loader"},
        {"lever": "prefetch_factor", "value": 4, "reason": "no_loader"},
    )
    lines = verdict_lines(rep)
    assert lines[0].startswith("Not applied on rank 1: num_workers 7 (no DataLoader on the rank")
    assert lines[-1] == "Nothing was applied on rank 1."


def test_the_verdict_says_what_was_applied_and_what_was_not() -> None:
    text = render_verdict(with_plan(after_run(), plan()))
    assert "Applied on rank 1: num_workers 0 -> 7, pin_memory False -> True." in text
    assert "Not applied on rank 1: prefetch_factor 4 (it needs num_workers > 0)." in text
    assert (
        "Not applied (a change to the script or machine): rank 1 batch_size 32 -> 64; "
        "rank 0 rank_work."
    ) in " ".join(text.split())
    assert "Applied on" not in render_verdict(after_run(applied=False))


def test_the_run_says_its_plan_before_the_job_starts() -> None:
    assert plan_lines(plan()) == [
        "--apply: rank 1's training DataLoader gets num_workers=7, pin_memory=True, "
        "prefetch_factor=4",
        "--apply: not applied (a change to the script or machine): rank 1 batch_size 32 -> 64; "
        "rank 0 rank_work",
    ]
    assert plan_lines(ApplyPlan()) == [
        "--apply: nothing to apply (no loader lever among the fixes)"
    ]
    moves = [{"lever": "num_workers", "from": 0, "to": 7}]
    assert applied_line(1, moves) == "applied on rank 1: num_workers 0 -> 7"


def test_compare_sets_predicted_beside_achieved_per_finding() -> None:
    result = compare_reports(starved(), with_plan(after_run(), plan()))
    assert result["speedup"]["measured"] == 4.0
    per = result["per_finding"]
    assert [(f["kind"], f["predicted"], f["achieved"], f["after"]) for f in per] == [
        ("data_starvation", 4.6, 4.0, "gone"),
        ("batch_split", 1.1, 4.0, "gone"),
    ]
    assert per[0]["achieved_share"] == round(4.0 / 4.6, 3)
    assert [(x["lever"], x["state"], x["after_value"]) for x in per[0]["fixes"]] == [
        ("num_workers", "applied", 7),
        ("pin_memory", "applied", True),
    ]
    assert per[1]["fixes"][0]["state"] == "not_checked"
    text = render_compare(result)
    flat = " ".join(text.split())
    assert "Per finding of BEFORE, predicted beside achieved" in text
    assert (
        "data_starvation rank 1 (critical; gone in AFTER): predicted 4.60x, achieved 4.00x "
        "(87% of it)"
    ) in flat
    assert "rank 1 num_workers 0 -> 7: applied by --apply" in flat
    assert "rank 1 batch_size 32 -> 64: a code change, not checked" in flat
    assert all(len(line) <= 80 for line in text.splitlines())


def test_compare_tells_a_fix_made_in_the_script_from_one_not_made() -> None:
    edited = after_run(applied=False)
    ranks = (edited.ranks[0], RankEntry(rank=1, step_s=0.05, loader={**LOADER, "num_workers": 7}))
    edited = Report(job=edited.job, ranks=ranks)
    per = compare_reports(starved(), edited)["per_finding"]
    assert [(x["lever"], x["state"]) for x in per[0]["fixes"]] == [
        ("num_workers", "in_effect"),
        ("pin_memory", "other"),
    ]
    same = compare_reports(starved(), starved())["per_finding"]
    assert same[0]["after"] == "critical" and same[0]["achieved"] == 1.0
    assert "remains, critical in AFTER" in " ".join(
        render_compare(compare_reports(starved(), starved())).split()
    )
