"""``bench/faults.py``'s own machinery, without running a job: the live stream read back (an
``auditor run --events`` stream written by the real :class:`EventStream` from real findings),
the typed fixes turned into the job's knobs, the job's knobs parsed, the job's own measures of
its fault (the step it turned slow, its memory's slope) read back and set against the real
rules' findings, and the summary line."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis import analyze
from auditor.analysis.history import RankHistory
from auditor.analysis.rules import memory_growth, slowdown
from auditor.analysis.snapshot import Snapshot
from auditor.report.events import EventStream
from auditor.samples import StepSample
from tests.helpers.growth import FLAT, growth_snapshot, host_budget, leak
from tests.helpers.jobs import ddp_snapshot, forward_straggler, starved_rank3
from tests.helpers.units import MIB

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path[:0] = [str(BENCH), str(BENCH / "faults_jobs")]
    try:
        import _events
        import faults
        import knobs

        yield faults, _events, knobs
    finally:
        for p in (str(BENCH), str(BENCH / "faults_jobs")):
            sys.path.remove(p)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_the_stream_read_back_gives_each_finding_its_first_time(bench: Any) -> None:
    _, events, _ = bench
    starved = analyze(ddp_snapshot(starved_rank3()))
    buf = io.StringIO()
    stream = EventStream(buf, "train", clock=Clock())
    stream.start(["x"])  # t=101
    stream.verdict([])  # t=102
    stream.verdict(starved)  # t=103
    stream.verdict(starved)  # no line
    stream.verdict([])  # t=104
    stream.verdict(starved)  # t=105: appears again
    s = events.parse([*buf.getvalue().splitlines(), '{"event": "verdict", "ti'])  # cut short
    assert s.start == 101.0 and s.first_verdict == 102.0 and s.bad_lines == 1
    first = s.first(lambda a: a.kind == "data_starvation" and a.ranks == (3,))
    assert first is not None and first.time == 103.0 and first.actions
    again = s.first(lambda a: a.kind == "data_starvation", after=104.0)
    assert again is not None and again.time == 105.0
    assert s.first_seen()["data_starvation 3"] == 103.0


def test_typed_fixes_become_the_jobs_knobs(bench: Any) -> None:
    faults, _, knobs = bench
    starved = next(f for f in analyze(ddp_snapshot(starved_rank3())) if f.kind == "data_starvation")
    actions = [a.to_dict() for a in starved.fixes]
    flags = faults.knob_fixes(actions)
    workers = next(a for a in actions if a["lever"] == "num_workers")
    assert f"3.num_workers={workers['proposed']}" in flags
    parsed = knobs.Fixes.parse(flags)
    assert parsed.get(3, "num_workers") == workers["proposed"]
    # A straggler's extra work removed ("none"): its batch share, an alternative, is left out.
    slow = next(
        f for f in analyze(ddp_snapshot(forward_straggler())) if f.kind == "compute_straggler"
    )
    flags = faults.knob_fixes([a.to_dict() for a in slow.fixes])
    rank = slow.ranks[0]
    assert f"{rank}.rank_work=none" in flags
    assert not any(".batch_size=" in f for f in flags)
    assert knobs.Fixes.parse(flags).get(rank, "rank_work", "keep") is None


def test_the_summary_and_its_last_line(bench: Any, capsys: pytest.CaptureFixture[str]) -> None:
    faults, _, _ = bench
    records: list[dict[str, Any]] = [
        {"case": "a", "class": "x", "control": False, "expected": {"ranks": [1]}, "found": True,
         "latency_s": 2.0, "predicted_speedup": 2.0, "achieved_speedup": 1.9,
         "predicted_over_achieved": 1.05, "within_20pct": True,
         "predicted_range": [1.8, 2.2], "inside_range": True},
        {"case": "b", "class": "y", "control": False, "expected": {"ranks": [0]}, "found": False,
         "other_live_findings": ["compute_straggler 0"]},
        {"case": "c", "class": "z", "control": False, "expected": {"ranks": [1]}, "found": True,
         "latency_s": 4.0, "predicted_speedup": 3.0, "achieved_speedup": 2.0,
         "predicted_over_achieved": 1.5, "within_20pct": False,
         "predicted_range": [2.6, 3.1], "inside_range": False},
        {"case": "k", "class": "control", "control": True, "ok": False,
         "false_alarms": ["data_starvation 1"]},
    ]  # fmt: skip
    s = faults.summarize(records)
    assert (s["found"], s["faults"], s["false_alarms"], s["controls"]) == (2, 3, 1, 1)
    assert (s["advice_within_20pct"], s["advice_judged"], s["median_detection_s"]) == (1, 2, 3.0)
    assert s["inside_range"] == 1
    assert s["by_class"] == {"x": "found", "y": "missed", "z": "found"}
    assert s["goals"] == {
        "all_found": False,
        "no_false_alarms": False,
        "advice_within_20pct": False,
        "achieved_inside_range": False,
        "median_detection_within_3s": True,
    }
    text = faults.table(records)
    assert "MISSED" in text and "ALARM" in text and "seen instead: compute_straggler 0" in text
    assert "1.80-2.20" in text and "2.60-3.10" in text
    assert faults.last_line(s) == (
        "faults: found 2/3, false alarms 1/1, advice within 20%: 1/2, inside range: 1/2, "
        "median detection 3.0 s"
    )


def _run(bench: Any, log: str) -> Any:
    """A run of the benchmark as :func:`faults.run_once` reads it, from the job's output."""
    faults, events, _ = bench
    step, memory = faults._STEP.search(log), faults._MEMORY.search(log)
    return faults.Run(
        exit_code=0, timed_out=False, wall_s=1.0, onset=None, rate=None, fixes_said=[],
        stream=events.Stream(), report=None,
        fault_step=(int(step.group(1)), int(step.group(2))) if step else None,
        memory_rate=(float(memory.group(1)), float(memory.group(2))) if memory else None,
    )  # fmt: skip


def test_the_new_classes_and_their_control_are_cases(bench: Any) -> None:
    faults, _, _ = bench
    cases = {c.name: c for c in faults.CASES}
    assert (cases["memory_growth"].kind, cases["memory_growth"].ranks) == ("memory_growth", (1,))
    assert (cases["slowdown"].kind, cases["slowdown"].ranks) == ("slowdown", (1,))
    control = cases["control_long_startup"]
    assert control.control and control.case == "long_startup"
    # A short job: its own training length, whatever --seconds says.
    cmd = faults.job_command(control, 22.0, 10.0, [])
    assert cmd[cmd.index("--seconds") + 1] == "10.0"
    assert cmd[cmd.index("--case") + 1] == "long_startup"


def test_a_memory_climb_is_set_against_the_rate_the_rank_measured(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    faults, _, knobs = bench
    # The job's own measure, as it prints it: 5 MiB a step over 100 steps at 20 steps a second.
    trace = knobs.MemoryTrace(rank=1, after=0.0)
    for k in range(100):
        trace.step_done(k)
        trace.bytes[-1] = 400 * MIB + 5 * MIB * k
        trace.times[-1] = 1000.0 + k / 20
    trace.report()
    run = _run(bench, capsys.readouterr().out)
    assert run.memory_rate is not None and round(run.memory_rate[0]) == 5 * MIB
    # The real rule on a CPU job whose rank 1 keeps 5 MiB a step (host RSS, read per flush).
    snap = growth_snapshot(
        {0: FLAT, 1: leak(5 * MIB)}, flush=10, budgets={1: host_budget(1), 0: host_budget(0)}
    )
    (found,) = memory_growth.RULE(snap)
    final = found.to_dict()
    case = next(c for c in faults.CASES if c.name == "memory_growth")
    rec = faults.measured_against_job(case, run, final)
    assert rec["measure_holds"] and abs(rec["rate_error"]) <= faults.GOAL_RATE
    assert rec["finding_seconds_to_full"] is not None
    # Off by half: a rate the benchmark does not accept.
    half = faults.measured_against_job(
        case, _run(bench, "FAULT_MEMORY bytes_per_step=10485760 bytes_per_s=1 steps=9"), final
    )
    assert not half["measure_holds"] and half["rate_error"] == pytest.approx(-0.5, abs=0.05)
    assert "MiB/step against the job's" in faults._measure_note(rec)


def _shifted(steps: int, at: int) -> Snapshot:
    """Two ranks; rank 1's forward goes from 30 to 90 ms at step ``at`` (rank 0 waits)."""
    rows: dict[int, list[StepSample]] = {0: [], 1: []}
    now = 1_000.0
    for k in range(steps):
        fwd = {0: 0.030, 1: 0.090 if k >= at else 0.030}
        wobble = 0.001 * (k % 3)
        step_s = max(fwd.values()) + 0.04 + wobble
        now += step_s
        for r in (0, 1):
            rows[r].append(
                StepSample(rank=r, step=k, time=now, step_s=step_s, forward_s=fwd[r] + wobble,
                           backward_s=0.04, collective_wait_s=step_s - fwd[r] - 0.04 - wobble)
            )  # fmt: skip
    history = {r: RankHistory.of(r, s) for r, s in rows.items()}
    return Snapshot(job="test", start=1_000.0, end=now, ranks=(), history=history)


def test_a_change_is_placed_against_the_step_the_rank_turned_slow_at(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    faults, _, knobs = bench
    # The job's own account: the faulty rank names its first step after the onset.
    onset = knobs.Onset(rank=1, fault_rank=1, after_s=0.0)
    for _ in range(300):
        onset.step_begins()
        onset.step_done()
    onset.first_step = 180  # as if the onset had come at step 180
    onset.report()
    run = _run(bench, capsys.readouterr().out)
    assert run.fault_step == (180, 300)
    (found,) = slowdown.RULE(_shifted(300, 180))
    case = next(c for c in faults.CASES if c.name == "slowdown")
    rec = faults.measured_against_job(case, run, found.to_dict())
    assert rec["finding_step"] == 180 and rec["measure_holds"], rec
    # A change placed 60 steps (20% of the run) from where the rank turned slow does not hold.
    late = faults.measured_against_job(case, run, slowdown.RULE(_shifted(300, 240))[0].to_dict())
    assert not late["measure_holds"] and late["step_error"] == pytest.approx(0.2, abs=0.02)
    assert "step 180 against the job's 180" in faults._measure_note(rec)


def test_a_finding_that_predicts_no_speed_up_says_why_its_advice_is_not_judged(
    bench: Any,
) -> None:
    faults, _, _ = bench
    rec: dict[str, Any] = {
        "case": "memory_growth", "class": "memory growth", "control": False,
        "expected": {"ranks": [1]}, "found": True, "latency_s": 2.0,
        "not_judged": "the finding predicts no speed-up", "after_still_found": False,
        "advice": "the job's knobs: --fix 1.retained_tensors=none",
    }  # fmt: skip
    s = faults.summarize([rec])
    assert s["advice_judged"] == 0 and s["not_judged"] == {"memory_growth": rec["not_judged"]}
    text = faults.table([rec])
    assert "advice not judged: the finding predicts no speed-up; after the fix: gone" in text


def test_a_cases_pairs_are_judged_by_their_medians(bench: Any) -> None:
    faults, _, _ = bench
    Pair = faults.Pair
    one = faults.judge([Pair(2.1, [2.0, 2.4], 2.57)])
    assert one["achieved_speedup"] == 2.57 and "pairs" not in one
    assert one["within_20pct"] and not one["inside_range"]
    # Three alternated pairs: the machine ran fast in the first after run only.
    three = faults.judge(
        [Pair(2.1, [2.0, 2.4], 2.57), Pair(2.0, [1.8, 2.3], 2.08), Pair(2.2, [1.9, 2.5], 2.15)]
    )
    assert three["predicted_speedup"] == 2.1 and three["predicted_range"] == [1.9, 2.4]
    assert three["achieved_speedup"] == 2.15 and three["inside_range"]
    assert [p["achieved_speedup"] for p in three["pairs"]] == [2.57, 2.08, 2.15]
    # No range given: the point itself is the range; no prediction: only what was achieved.
    assert faults.judge([Pair(1.5, None, 1.5)])["inside_range"]
    assert faults.judge([Pair(None, None, 1.2)]) == {"achieved_speedup": 1.2}
