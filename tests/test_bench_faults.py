"""``bench/faults.py``'s own machinery, without running a job: the live stream read back (an
``auditor run --events`` stream written by the real :class:`EventStream` from real findings),
the typed fixes turned into the job's knobs, the job's knobs parsed, and the summary line."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis import analyze
from auditor.report.events import EventStream
from tests.helpers.jobs import ddp_snapshot, forward_straggler, starved_rank3

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
         "predicted_over_achieved": 1.05, "within_20pct": True},
        {"case": "b", "class": "y", "control": False, "expected": {"ranks": [0]}, "found": False,
         "other_live_findings": ["compute_straggler 0"]},
        {"case": "c", "class": "z", "control": False, "expected": {"ranks": [1]}, "found": True,
         "latency_s": 4.0, "predicted_speedup": 3.0, "achieved_speedup": 2.0,
         "predicted_over_achieved": 1.5, "within_20pct": False},
        {"case": "k", "class": "control", "control": True, "ok": False,
         "false_alarms": ["data_starvation 1"]},
    ]  # fmt: skip
    s = faults.summarize(records)
    assert (s["found"], s["faults"], s["false_alarms"], s["controls"]) == (2, 3, 1, 1)
    assert (s["advice_within_20pct"], s["advice_judged"], s["median_detection_s"]) == (1, 2, 3.0)
    assert s["by_class"] == {"x": "found", "y": "missed", "z": "found"}
    assert s["goals"] == {
        "all_found": False,
        "no_false_alarms": False,
        "advice_within_20pct": False,
        "median_detection_within_3s": True,
    }
    text = faults.table(records)
    assert "MISSED" in text and "ALARM" in text and "seen instead: compute_straggler 0" in text
    assert faults.last_line(s) == (
        "faults: found 2/3, false alarms 1/1, advice within 20%: 1/2, median detection 3.0 s"
    )
