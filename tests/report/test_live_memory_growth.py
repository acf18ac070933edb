"""The live view of a rank whose memory climbs: its row shows the climb and the time left, the
finding line says it in words, and the status line carries it off a terminal."""

from __future__ import annotations

from auditor.analysis import analyze
from auditor.report.live import LiveState, panel_lines, status_line
from tests.helpers.growth import FLAT, growth_snapshot, host_budget, leak
from tests.helpers.units import GIB, MIB


def _state(available: float | None = 16 * GIB) -> LiveState:
    budgets = {} if available is None else {0: host_budget(0, available=available, at_step=599)}
    snap = growth_snapshot({0: leak(2 * MIB), 1: FLAT}, flush=10, budgets=budgets)
    return LiveState(elapsed_s=40, job="leaky", snapshot=snap, findings=tuple(analyze(snap)))


def test_the_climbing_ranks_row_shows_the_rate_and_the_time_left() -> None:
    lines = [line.text for line in panel_lines(_state(), width=160, height=30)]
    (row0,) = [line for line in lines if line.lstrip().startswith("!0 ")]
    # 16 GiB at 40 MiB/s: 7 minutes.
    assert row0.endswith("blamed; memory +2.0 MiB/step, full in 7 min"), row0
    (row1,) = [line for line in lines if line.lstrip().startswith("1 ")]
    assert "memory" not in row1
    (said,) = [line for line in lines if line.startswith("! memory_growth rank 0:")]
    assert "climbs 2.0 MiB a step" in said


def test_a_slow_climb_is_shown_on_its_row_even_as_info() -> None:
    # 10,000 GiB at 40 MiB/s: three days: info, not blamed, still shown.
    lines = [line.text for line in panel_lines(_state(10_000 * GIB), width=160, height=30)]
    (row0,) = [line for line in lines if line.lstrip().startswith("0 ")]
    assert row0.endswith("memory +2.0 MiB/step, full in 3.0 days"), row0
    assert not [line for line in lines if line.startswith("! memory_growth")]


def test_the_status_line_carries_the_climb() -> None:
    line = status_line(_state())
    assert "memory_growth rank 0 (critical, memory +2.0 MiB/step, full in 7 min)" in line
