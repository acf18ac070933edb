"""``auditor run --events``: the live verdict's changes as JSON lines, from real findings (a
constructed DDP job through the real rules)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.audit import Audit
from auditor.report.events import SCHEMA, EventStream
from tests.helpers.jobs import (
    JobBuilder,
    ddp_snapshot,
    forward_straggler,
    starved_rank3,
    uneven_batch,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def _findings(specs: Any) -> list[Finding]:
    return analyze(ddp_snapshot(specs))


def test_a_finding_is_written_once_when_it_appears_and_once_when_it_leaves() -> None:
    starved = _findings(starved_rank3())
    kinds = {(f.kind, f.ranks) for f in starved}
    assert ("data_starvation", (3,)) in kinds
    buf, clock = io.StringIO(), Clock()
    stream = EventStream(buf, "train", clock=clock)
    stream.start(["torchrun", "train.py"])
    assert stream.verdict([], window=(0.0, 10.0), ranks=4)  # the first verdict: always written
    assert not stream.verdict([], window=(1.0, 11.0), ranks=4)  # no change: nothing
    assert stream.verdict(starved, window=(2.0, 12.0), ranks=4)
    assert not stream.verdict(starved, window=(3.0, 13.0), ranks=4)
    assert stream.verdict([], window=(4.0, 14.0), ranks=4)
    lines = _lines(buf)
    assert [x["event"] for x in lines] == ["start", "verdict", "verdict", "verdict"]
    assert lines[0]["schema"] == SCHEMA and lines[0]["command"] == ["torchrun", "train.py"]
    first, appeared, gone = lines[1:]
    assert first["appeared"] == [] and first["findings"] == [] and first["ranks"] == 4
    # Each line carries its own wall time, later than the one before.
    assert [x["time"] for x in lines] == sorted(x["time"] for x in lines)
    starving = [x for x in appeared["appeared"] if x["kind"] == "data_starvation"]
    assert len(starving) == 1
    f = starving[0]
    assert f["ranks"] == [3] and f["severity"] in ("warning", "critical")
    assert f["predicted_speedup"] > 1.1
    assert "evidence" not in f and f["summary"]
    # The typed fixes, as Fix.to_dict() writes them: the loader lever on the starved rank.
    levers = {(a["lever"], a["rank"]) for a in f["actions"]}
    assert ("num_workers", 3) in levers
    workers = next(a for a in f["actions"] if a["lever"] == "num_workers")
    assert workers["how"] == "loader" and workers["proposed"] > workers["current"]
    assert "data_starvation" in workers["answers"]
    assert appeared["window"] == {"start": 2.0, "end": 12.0}
    assert {(x["kind"], tuple(x["ranks"])) for x in appeared["findings"]} == kinds
    assert gone["appeared"] == [] and gone["findings"] == []
    assert {(x["kind"], tuple(x["ranks"])) for x in gone["disappeared"]} == kinds


def test_a_new_blamed_rank_or_kind_is_a_change_and_old_ones_stay_listed() -> None:
    slow = _findings(forward_straggler())
    uneven = _findings(uneven_batch())
    assert slow and uneven
    buf = io.StringIO()
    stream = EventStream(buf, "train", clock=Clock())
    stream.verdict(slow)
    assert stream.verdict([*slow, *uneven])
    last = _lines(buf)[-1]
    new = {(x["kind"], tuple(x["ranks"])) for x in last["appeared"]}
    old = {(f.kind, f.ranks) for f in slow}
    assert new == {(f.kind, f.ranks) for f in uneven} - old
    assert last["disappeared"] == []
    assert len(last["findings"]) == len({(f.kind, f.ranks) for f in [*slow, *uneven]})


def test_a_severity_that_moves_is_a_change() -> None:
    found = [f for f in _findings(starved_rank3()) if f.kind == "data_starvation"]
    other = "info" if found[0].severity != "info" else "warning"
    moved = [Finding(**{**found[0].__dict__, "severity": other})]
    buf = io.StringIO()
    stream = EventStream(buf, "train", clock=Clock())
    stream.verdict(found)
    assert stream.verdict(moved)
    last = _lines(buf)[-1]
    assert last["appeared"] == [] and last["disappeared"] == []
    assert [x["severity"] for x in last["changed"]] == [other]


def test_the_final_verdict_is_the_last_line_as_the_report_holds_it(tmp_path: Path) -> None:
    audit = Audit("train", window_s=None)
    JobBuilder(starved_rank3(), store=audit.store).run(24)
    report = audit.report(command=["torchrun", "train.py"], exit_code=0, duration_s=12.0)
    path = tmp_path / "events.jsonl"
    stream = EventStream.open(str(path), "train")
    stream.start(["torchrun", "train.py"])
    stream.final(report)
    stream.close()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    last = lines[-1]
    assert last["event"] == "final" and last["exit_code"] == 0 and not last["interrupted"]
    assert [(x["kind"], x["ranks"]) for x in last["findings"]] == [
        (f.kind, list(f.ranks)) for f in report.findings
    ]
    assert any(x["actions"] for x in last["findings"])


class Full(io.StringIO):
    """A file whose disk fills up after ``room`` lines."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, s: str) -> int:
        if self.room <= 0:
            raise OSError(28, "No space left on device")
        self.room -= 1
        return super().write(s)


def test_a_write_that_fails_stops_the_stream_and_keeps_the_error() -> None:
    f = Full(room=1)
    stream = EventStream(f, "train", clock=Clock())
    stream.start(["x"])
    stream.verdict([])  # the disk is full: kept, not raised
    assert stream.error is not None and stream.error.errno == 28
    assert stream.lines == 1
    stream.verdict(_findings(starved_rank3()))  # nothing more is tried
    stream.close()


def test_a_path_that_cannot_be_written_raises_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        EventStream.open(str(tmp_path / "no-such-dir" / "events.jsonl"), "train")
