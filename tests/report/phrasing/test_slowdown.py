"""slowdown in words: the rank, the phase that moved, before and after, the step and the local
time of day it changed at, and how much slower the job runs since; the change per rank; a
slowdown every rank has alike (or a slower collective), or a batch that grew, said without
blaming one."""

from __future__ import annotations

import time

import pytest

from auditor.analysis.findings import Finding
from auditor.analysis.rules.slowdown import Change, Facts
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.report.phrasing.slowdown import clock, fmt_step_time

AT = time.mktime((2026, 3, 2, 14, 2, 11, 0, 0, -1))  # 14:02:11 local time


def _finding(facts: Facts, speedup: float | None = 1.9) -> Finding:
    return Finding(
        kind="slowdown",
        severity="critical" if facts.ranks else "info",
        ranks=tuple(sorted(facts.ranks)),
        facts=facts,
        predicted_speedup=speedup if facts.ranks else None,
    )


def test_a_rank_that_turned_slow_in_words() -> None:
    c = Change(0.020, 0.059, "forward", 0.009, 0.048)
    words = phrase(_finding(Facts(300, AT, 0.021, 0.040, 0.040, {1: c})))
    assert words.summary == (
        "rank 1's forward went from 9.0 ms to 48 ms at step 300, 14:02:11; since then the job "
        "runs 1.9x slower (21 ms a step, now 40 ms): the others wait for it at the collectives"
    )
    assert words.fixes == {
        1: "find what changed on this rank at step 300 (14:02:11): its forward went from 9.0 ms "
        "to 48 ms a step (a throttled or shared device, another process on its host, larger "
        "inputs, work added to this rank alone) and bring it back to its earlier pace; expect "
        "about 1.9x"
    }


def test_several_ranks_and_a_data_wait_in_words() -> None:
    backward = Change(0.1, 0.2, "backward", 0.06, 0.16)
    data = Change(0.1, 0.25, "data_wait", 0.001, 0.151)
    words = phrase(_finding(Facts(40, AT, 0.105, 0.26, 0.26, {2: backward, 5: data}), 2.4))
    assert words.summary.startswith(
        "ranks 2, 5 turned slow at step 40, 14:02:11: rank 2's backward went from 60 ms to "
        "160 ms; rank 5's data wait went from 1.0 ms to 151 ms; since then the job runs 2.5x "
        "slower"
    )
    assert words.summary.endswith("the others wait for them at the collectives")
    assert words.fixes[5].startswith("find what changed in this rank's loading at step 40")
    assert words.fixes[2].endswith("expect about 2.4x")


@pytest.mark.parametrize(
    ("facts", "summary", "model", "fix"),
    [
        pytest.param(
            Facts(200, AT, 0.105, 0.195, 0.195, {}, Change(0.1, 0.19, "forward", 0.03, 0.12)),
            "every rank slowed alike at step 200, 14:02:11: their forward went from 30 ms to "
            "120 ms; since then the job runs 1.9x slower (105 ms a step, now 195 ms); no rank "
            "waits for another, none is to blame",
            "not predicted: every rank slowed",
            "whole job",
            id="every_rank_alike",
        ),
        pytest.param(
            Facts(414, AT, 0.024, 0.036, 0.032, {}, batches={1: (32, 64)}),
            "the batch per step changed at step 414, 14:02:11 (rank 1: 32 to 64); since then "
            "the job runs 1.3x slower (24 ms a step, now 32 ms): more work per step by design, "
            "none is to blame",
            "not predicted: the batch per step",
            "samples per second",
            id="batch_grew",
        ),
    ],
)
def test_a_change_no_rank_led_blames_none(facts: Facts, summary: str, model: str, fix: str) -> None:
    # Every rank slowed alike, or a batch per step grew by design: no rank, no fix, nothing
    # predicted, and the evidence says why.
    f = _finding(facts)
    words = phrase(f)
    assert words.summary == summary
    assert words.fixes == {}
    report = ReportFinding.of(f).to_dict()
    assert report["evidence"]["speedup_model"].startswith(model)
    assert fix in report["evidence"]["fix"]


def test_a_slower_collective_is_named() -> None:
    every = Change(0.1, 0.1, "collective_wait", 0.004, 0.1)
    words = phrase(_finding(Facts(150, AT, 0.105, 0.2, 0.2, {}, every)))
    assert "their wait at the collectives went from 4.0 ms to 100 ms" in words.summary
    assert words.summary.endswith("the collectives themselves slowed, none is to blame")


def test_a_ramp_on_many_ranks_is_said_once_per_change() -> None:
    ramp = {r: (32.0, 64.0) for r in range(4096)} | {4096: (32.0, 48.0)}
    words = phrase(_finding(Facts(50, AT, 0.1, 0.2, 0.2, {}, batches=ramp)))
    assert "(4096 ranks: 32 to 64; rank 4096: 32 to 48)" in words.summary
    two = phrase(_finding(Facts(50, AT, 0.1, 0.2, 0.2, {}, batches={0: (8, 16), 1: (8, 16)})))
    assert "(ranks 0, 1: 8 to 16)" in two.summary


def test_times() -> None:
    assert clock(AT) == "14:02:11"
    assert fmt_step_time(0.0004) == "0.4 ms"
    assert fmt_step_time(0.0093) == "9.3 ms"
    assert fmt_step_time(0.048) == "48 ms"
