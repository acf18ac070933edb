"""FLOPs per step on their way from a rank to the rules: the ``flops`` message over a real Unix
socket into a real intake (one job and a fleet agent's several), a recording's round trip with
the counted step's flag, and a replay's ticks (the sample store's part:
``tests/analysis/test_flops_counted_step.py``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from auditor.cluster.intake import RankIntake
from auditor.metrics.replay import make_ticks, select_node
from auditor.probe.sink import flops_message, step_message
from auditor.samples import Batch, FlopCount, RankInfo, StepSample
from auditor.telemetry.recorded import read_recording, write_recording

from . import collect, hello, send

COUNT = FlopCount(
    rank=1,
    time=50.0,
    step=3,
    flops=3.0e9,
    by_dtype={"bf16": 2.5e9, "fp32": 0.5e9},
    micro_batches=2,
    samples=64,
    device="cpu",
    cost_s=0.02,
)


def steps(rank: int, n: int, counted: int, step_s: float = 0.1) -> list[StepSample]:
    """``n`` steps of ``step_s``; step ``counted`` flagged and ten times as long."""
    out = []
    for i in range(n):
        s = StepSample(rank=rank, step=i, time=10.0 + i, step_s=step_s, forward_s=step_s / 2)
        if i == counted:
            s = replace(s, step_s=10 * step_s, forward_s=9 * step_s, flops_counted=True)
        out.append(s)
    return out


def test_flops_message_and_flagged_step_reach_the_intake_whole(path: str) -> None:
    intake = RankIntake(path)
    intake.start()
    try:
        send(path, hello(1), step_message(1, steps(1, 5, counted=3)), flops_message(COUNT))
        batch = collect(intake, ended=1)
    finally:
        intake.stop()
    assert batch.flops == (COUNT,)
    assert [s.step for s in batch.steps if s.flops_counted] == [3]
    assert intake.bad_lines == 0


def test_a_fleet_agent_files_counts_under_the_jobs_key(path: str) -> None:
    intake = RankIntake(path, multi_job=True)
    intake.start()
    try:
        send(path, hello(1, job="a"), flops_message(COUNT))
        send(path, hello(1, job="b"), flops_message(COUNT))
        batch = collect(intake, ended=2)
    finally:
        intake.stop()
    assert sorted(c.rank for c in batch.flops) == [0, 1]


def test_recordings_and_replays_keep_the_count_and_the_flag(tmp_path: Path) -> None:
    rec = tmp_path / "r.jsonl"
    info = RankInfo(rank=1, world_size=2, host="h")
    ran = steps(1, 5, counted=3)
    write_recording(rec, [Batch(infos=(info,), steps=tuple(ran), flops=(COUNT,))], job="j")
    lines = rec.read_text().splitlines()
    # Only the counted step's record carries the flag: the others keep their older shape.
    assert sum('"flops_counted"' in ln for ln in lines) == 1
    back = read_recording(rec)
    assert back.problems == []
    assert back.batch.flops == (COUNT,)
    assert list(back.batch.steps) == ran
    _, mine = select_node(back.batch)
    ticks = make_ticks(mine, tick_s=1.0)
    assert [c for t in ticks for c in t.batch.flops] == [COUNT]


def test_count_dict_round_trip() -> None:
    assert FlopCount.from_dict(COUNT.to_dict()) == COUNT
    assert FlopCount.from_dict({**COUNT.to_dict(), "newer_field": 1}) == COUNT
    assert COUNT.flops_per_micro_batch == 1.5e9
    assert sum(COUNT.by_dtype.values()) == COUNT.flops
