"""stall in words: what stalls, how often, its cost and share; the change per rank; a stall every
rank has alike said without blaming one."""

from __future__ import annotations

from dataclasses import replace

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import stall
from auditor.analysis.rules.stall import Facts, Stall
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.report.phrasing.stall import fmt_time
from tests.helpers.jobs import balanced
from tests.helpers.stalls import StallSpec, stall_snapshot


def _finding(stalls: dict[int, Stall], speedup: float | None = 1.5) -> Finding:
    return Finding(
        kind="stall",
        severity="warning",
        ranks=tuple(sorted(stalls)),
        facts=Facts(stalls),
        predicted_speedup=speedup,
    )


def test_a_periodic_checkpoint_in_words() -> None:
    s = Stall("checkpoint", 8, 5, 1.2, 0.34, (3, 8), 1.19, interval=228)
    f = replace(
        _finding({0: s}),
        fixes=(
            Fix("checkpoint_interval", 0, 5, 228, 1.5, ("stall",)),
            Fix("checkpoint_async", 0, False, True, 1.24, ("stall",)),
        ),
    )
    words = phrase(f)
    assert words.summary == (
        "rank 0 stalls in a checkpoint save every 5 steps (1.20 s each, 34% of the window); "
        "the others wait for it at the next collective"
    )
    assert words.fixes == {
        0: "save the checkpoint every 228 steps instead of every 5, so that saving costs a few"
        " percent of the run; expect about 1.5x; or save off the training step"
        " (torch.distributed.checkpoint.async_save, or a background thread): the save still"
        " takes its CPU from the host, and a thread of the training process the interpreter's"
        " lock while it pickles (about 1.2x on this host at best)"
    }
    # Without an interval (irregular saves), off the step is the change.
    irregular = Stall("checkpoint", 3, None, 1.2, 0.2, (3, 9, 20), 1.19)
    assert (
        phrase(_finding({0: irregular}))
        .fixes[0]
        .startswith(
            "save the checkpoint off the training step (torch.distributed.checkpoint.async_save"
        )
    )


def test_irregular_unnamed_work_in_words() -> None:
    s = Stall(None, 4, None, 0.3, 0.08, (7, 19, 23, 41), 0.29)
    words = phrase(_finding({1: s, 3: s}, speedup=1.09))
    assert words.summary == (
        "ranks 1, 3 stall in unnamed work irregularly (4 times) (300 ms each, 8% of the window);"
        " the others wait for them at the next collective"
    )
    assert words.fixes[1].startswith("find the work this rank does alone irregularly (4 times)")
    assert "garbage-collection pause" in words.fixes[3]
    assert "expect about 1.1x" in words.fixes[3]


def test_evaluation_and_logging_name_their_change() -> None:
    ev = phrase(_finding({0: Stall("evaluation", 3, 10, 0.5, 0.2, (1, 11, 21))}))
    assert ev.summary.startswith("rank 0 stalls in an evaluation every 10 steps (500 ms each")
    assert ev.fixes[0].startswith("run the evaluation on every rank, each on its shard")
    log = phrase(_finding({2: Stall("logging", 3, 10, 0.05, 0.06, (1, 11, 21))}))
    assert "logging or metric gathering every 10 steps (50 ms each, 6% of the window)" in (
        log.summary
    )
    assert log.fixes[2].startswith("take logging and metric gathering off the step")


def test_a_stall_every_rank_has_alike_blames_none() -> None:
    every = Stall("evaluation", 6, 7, 0.5, 0.41, (0, 7, 14, 21, 28, 35))
    f = Finding(kind="stall", severity="info", ranks=(), facts=Facts({}, every))
    words = phrase(f)
    assert words.summary == (
        "every rank stalls alike in an evaluation every 7 steps (500 ms each, 41% of the "
        "window); no rank waits for another, none is to blame"
    )
    assert words.fixes == {}
    assert str(words.notes["speedup_model"]).startswith("not predicted")
    assert "run it less often" in str(words.notes["fix"])
    # The report says the change where no rank is blamed.
    assert ReportFinding.of(f).unowned_fix == words.notes["fix"]


def test_the_rule_and_its_words_agree_end_to_end() -> None:
    snap = stall_snapshot(
        balanced(2), {0: StallSpec(1.2, every=5, first=3, name="checkpoint")}, steps=40
    )
    (f,) = stall.RULE(snap)
    rf = ReportFinding.of(f)
    assert rf.summary.startswith("rank 0 stalls in a checkpoint save every 5 steps (1.20 s each")
    assert set(rf.fixes) == {0}
    assert [a.lever for a in rf.actions] == ["checkpoint_interval", "checkpoint_async"]
    assert ReportFinding.from_dict(rf.to_dict()) == rf


def test_times_read_in_ms_below_a_second() -> None:
    assert (fmt_time(0.25), fmt_time(1.0), fmt_time(12.345)) == ("250 ms", "1.00 s", "12.35 s")
