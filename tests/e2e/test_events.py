"""``auditor run --events FILE``: a real torchrun job's live verdict as JSON lines, read while
the job runs."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from auditor.cli import main

from .conftest import REPO, base_env, torchrun


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


@pytest.mark.e2e
def test_a_starved_rank_appears_in_the_stream_while_the_job_runs(
    ray_address: str, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    argv = [
        sys.executable, "-m", "auditor", "run", "--address", ray_address, "--live-interval", "1",
        "--events", str(events), "--report", str(tmp_path / "r.json"), "--",
        *torchrun("starved_rank.py", "--seconds", "25"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, cwd=REPO, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen_live: list[dict[str, Any]] = []
    while proc.poll() is None:
        # Read while the job runs: each line is there (flushed) as soon as it is judged.
        if not seen_live:
            seen_live = [
                x
                for x in _read(events)
                if x["event"] == "verdict"
                and any(a["kind"] == "data_starvation" for a in x["appeared"])
            ]
        time.sleep(0.5)
    output = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode == 0, output[-3000:]
    assert seen_live, "the finding was in the stream before the job ended\n" + output[-3000:]
    lines = _read(events)
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "final"
    assert all(x["event"] == "verdict" for x in lines[1:-1])
    first = next(
        a
        for x in lines
        if x["event"] == "verdict"
        for a in x["appeared"]
        if a["kind"] == "data_starvation"
    )
    assert first["ranks"] == [1]
    assert any(a["lever"] == "num_workers" and a["rank"] == 1 for a in first["actions"])
    # The last line is the final verdict, the one the JSON report holds.
    report = json.loads((tmp_path / "r.json").read_text())
    assert [(f["kind"], f["ranks"]) for f in lines[-1]["findings"]] == [
        (f["kind"], f["ranks"]) for f in report["findings"]
    ]
    # Nothing but changes: no two consecutive verdicts list the same findings.
    verdicts = [x["findings"] for x in lines if x["event"] == "verdict"]
    assert all(a != b for a, b in itertools.pairwise(verdicts))


def test_an_events_file_that_cannot_be_written_is_refused_before_the_job_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"
    code = main(
        [
            "run", "--no-ray", "--events", str(tmp_path / "missing" / "events.jsonl"), "--",
            "touch", str(marker),
        ]
    )  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "events file" in err[0], err
    assert not marker.exists()
