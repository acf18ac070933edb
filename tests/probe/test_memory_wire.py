"""The memory budget's way from a rank to the rules: the ``memory`` message over a real Unix
socket into a real intake (one job and a fleet agent's several), a recording's round trip, the
sample store's latest budget per rank, and the exporter's series."""

from __future__ import annotations

from pathlib import Path

from auditor.analysis.snapshot import SampleStore
from auditor.cluster.intake import RankIntake
from auditor.metrics.state import ExportState, apply_batch
from auditor.probe.sink import memory_message
from auditor.samples import Batch, MemoryBudget, RankInfo
from auditor.telemetry.recorded import read_recording, write_recording

from . import collect, hello, send

BUDGET = MemoryBudget(
    rank=1,
    time=50.0,
    step=1,
    param_bytes=1000,
    param_bytes_by_dtype={"float32": 1000},
    grad_bytes=1000,
    optimizer_bytes=2024,
    optimizer_bytes_by_kind={"exp_avg": 1000, "exp_avg_sq": 1000, "step": 24},
    optimizer="Adam",
    activation_bytes=640,
    activation_batch=8,
    host_total_bytes=10**9,
    host_available_bytes=5 * 10**8,
    local_ranks=2,
)


def test_memory_message_reaches_the_intake_whole(path: str) -> None:
    intake = RankIntake(path)
    intake.start()
    try:
        send(path, hello(1), memory_message(BUDGET))
        batch = collect(intake, ended=1)
    finally:
        intake.stop()
    assert batch.memory == (BUDGET,)
    assert intake.bad_lines == 0


def test_a_fleet_agent_files_budgets_under_the_jobs_key(path: str) -> None:
    intake = RankIntake(path, multi_job=True)
    intake.start()
    try:
        send(path, hello(1, job="a"), memory_message(BUDGET))
        send(path, hello(1, job="b"), memory_message(BUDGET))
        batch = collect(intake, ended=2)
    finally:
        intake.stop()
    # Rank 1 of two jobs: two keys, as their steps get.
    assert sorted(m.rank for m in batch.memory) == [0, 1]


def test_recordings_keep_the_budget(tmp_path: Path) -> None:
    rec = tmp_path / "r.jsonl"
    write_recording(rec, [Batch(memory=(BUDGET,))], job="j")
    back = read_recording(rec)
    assert back.problems == []
    assert back.batch.memory == (BUDGET,)


def test_the_store_gives_each_rank_its_latest_budget_up_to_now() -> None:
    store = SampleStore("j")
    newer = MemoryBudget(**{**BUDGET.to_dict(), "time": 80.0, "param_bytes": 2000})
    store.add(Batch(infos=(RankInfo(rank=1, world_size=2),), memory=(newer, BUDGET)))
    assert store.snapshot(now=100.0, window_s=10.0).ranks[0].memory == newer
    assert store.snapshot(now=60.0, window_s=None).ranks[0].memory == BUDGET


def test_export_state_keeps_the_latest_budget() -> None:
    state = apply_batch(ExportState(job="j", node="h"), Batch(memory=(BUDGET,)))
    assert state.memory == {1: BUDGET}
    assert BUDGET.parts()["optimizer_state"] == 2024
