"""The live panel and the status line: what fits, what is shown, what the columns mean."""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import replace

from rich.console import Console

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.rules.compute_straggler import Facts, SlowRank
from auditor.analysis.snapshot import Snapshot
from auditor.liveview import StatusView, panel_text
from auditor.report.live import LiveState, panel_lines, status_line
from auditor.samples import Batch, RankInfo
from auditor.torchrun import expected_ranks
from tests.helpers.jobs import JobBuilder, RankSpec
from tests.helpers.reports import make_store, snapshot_of, starved_report

STARVED = 37


def _job(
    n: int, *, nodes: int, starved: int | None, steps: int = 60, slow: tuple[int, ...] = ()
) -> JobBuilder:
    per_node = n // nodes
    specs = [RankSpec(host=f"gpu-node-{r // per_node}") for r in range(n)]
    if starved is not None:
        specs[starved] = replace(specs[starved], data_wait=0.150, num_workers=1)
    for r in slow:  # a little slower than the rest, not enough to be blamed
        specs[r] = replace(specs[r], backward=specs[r].backward * 1.15)
    return JobBuilder(specs).run(steps)


def _state(b: JobBuilder, window_s: float = 10.0, **kwargs: object) -> LiveState:
    now = b.store.latest_time()
    assert now is not None
    snap = b.store.snapshot(now, window_s)
    return LiveState(
        elapsed_s=95,
        job="pretrain",
        snapshot=snap,
        findings=tuple(analyze(snap)),
        window_s=window_s,
        **kwargs,  # type: ignore[arg-type]
    )


def _screen(state: LiveState, width: int = 100, height: int = 30) -> list[str]:
    """The panel as a terminal of ``width`` x ``height`` shows it."""
    console = Console(
        file=io.StringIO(), width=width, height=height, record=True, color_system=None
    )
    console.print(panel_text(state, width=width, height=height))
    return console.export_text().rstrip("\n").split("\n")


def _rank_rows(lines: list[str]) -> dict[int, str]:
    rows = {}
    for line in lines:
        m = re.match(r"^\s*!?(\d+)\s{2}", line)
        if m:
            rows[int(m.group(1))] = line
    return rows


def test_64_ranks_on_4_nodes_fit_100x30_and_show_the_blamed_rank() -> None:
    state = _state(_job(64, nodes=4, starved=STARVED, slow=(5, 50)))
    assert any(f.ranks == (STARVED,) for f in state.findings), state.findings
    lines = _screen(state)
    text = "\n".join(lines)
    # Fits: leaves the job's output a third of the screen, never wider than the terminal.
    assert len(lines) <= 20, text
    assert all(len(line) < 100 for line in lines), text
    rows = _rank_rows(lines)
    assert STARVED in rows and "blamed" in rows[STARVED], text
    assert {5, 50} <= set(rows), text  # the slowest, though not blamed
    assert len(rows) < 10, text  # ranks like the others stay hidden
    assert rows[STARVED].lstrip().startswith(f"!{STARVED}")
    assert f"! data_starvation rank {STARVED}:" in text
    # The summary row over every rank, then the ranks shown and how many are hidden.
    summary = next(line for line in lines if line.startswith("64 ranks: "))
    assert re.search(r"step \d+ ms median, \d+ worst", summary), summary
    assert re.search(rf"data \d+% median, \d+% worst \(rank {STARVED}\)", summary), summary
    assert re.search(r"wait [\d.]+ ms median$", summary), summary
    hidden = re.search(r"(\d+) of 64 ranks hidden", text)
    assert hidden and int(hidden.group(1)) == 64 - len(rows), text
    # Grouped by node: every node has its line, every shown rank sits under its own node's.
    assert sum(line.startswith("node gpu-node-") for line in lines) == 4, text
    node = ""
    for line in lines:
        m = re.match(r"^node (gpu-node-\d): 16 ranks", line)
        if m:
            node = m.group(1)
        elif (rank := _rank_rows([line])) and (r := next(iter(rank))) is not None:
            assert node == f"gpu-node-{r // 16}", (r, node, text)
    assert "4 nodes" in lines[0] and "64 ranks ddp" in lines[0]


def test_every_rank_shown_when_they_fit_with_node_lines() -> None:
    state = _state(_job(8, nodes=2, starved=5))
    lines = _screen(state)
    rows = _rank_rows(lines)
    assert sorted(rows) == list(range(8))
    assert not any("hidden" in line for line in lines)
    assert not any(line.startswith("8 ranks:") for line in lines)
    assert sum(line.startswith("node gpu-node-") for line in lines) == 2


def test_steps_count_the_whole_run_and_the_header_names_the_window() -> None:
    b = _job(2, nodes=1, starved=1, steps=200)
    state = _state(b, window_s=5.0)
    lines = _screen(state)
    rows = _rank_rows(lines)
    # Far fewer than 200 steps fall in a 5 s window; the column still counts all of them.
    assert state.snapshot is not None and state.snapshot.stats[0].steps < 100
    assert rows[0].split()[2] == "200" and rows[1].split()[2] == "200"
    header = next(i for i, line in enumerate(lines) if re.match(r"rank\s+node\s+steps", line))
    assert "so far" in lines[header - 1] and "medians per step, last 5s" in lines[header - 1]


def test_narrow_terminal_drops_columns_not_rows() -> None:
    state = _state(_job(2, nodes=1, starved=1))
    lines = _screen(state, width=60, height=20)
    assert all(len(line) < 60 for line in lines), lines
    rows = _rank_rows(lines)
    assert sorted(rows) == [0, 1] and "data %" in "\n".join(lines)


def _connected(n: int, world: int) -> Snapshot:
    b = JobBuilder([RankSpec() for _ in range(world)])
    b.store.add(Batch(infos=b.infos()[:n]))
    return b.store.snapshot(1_000.0, 10.0)


def test_progress_while_waiting() -> None:
    start = LiveState(elapsed_s=4, job="j", stage="starting Ray", expected_ranks=2)
    assert "starting Ray ..." in _screen(start)
    none = replace(start, stage=None)
    assert "waiting for ranks: 0 of 2 connected ..." in _screen(none)
    one = replace(none, snapshot=_connected(1, 2))
    assert "waiting for ranks: 1 of 2 connected ..." in _screen(one)
    both = replace(none, snapshot=_connected(2, 2))
    assert "waiting for the first step: 2 of 2 ranks connected ..." in _screen(both)
    assert status_line(one) == "auditor 4s: waiting for ranks: 1 of 2 connected ..."


def test_unfinished_job_line_shows_on_the_panel_first_line() -> None:
    state = _state(_job(2, nodes=1, starved=1), partial=" 42%|####      | 42/100")
    assert _screen(state)[0] == " 42%|####      | 42/100"


def test_status_line_is_plain_and_names_the_slowest_rank_and_findings() -> None:
    line = status_line(_state(_job(64, nodes=4, starved=STARVED)))
    assert "\x1b" not in line and "\n" not in line
    assert line.startswith("auditor 1m35s: 64 ranks, ")
    assert re.search(r"\d+\.\d steps/s", line)
    assert f"slowest rank {STARVED} (data wait " in line
    assert f"findings: data_starvation rank {STARVED} (critical)" in line
    balanced = status_line(_state(_job(2, nodes=1, starved=None)))
    assert balanced.endswith("no findings")


def test_status_view_prints_at_most_one_line_per_period() -> None:
    now = [0.0]
    out = io.StringIO()
    view = StatusView(
        out, state=_state(_job(2, nodes=1, starved=1)), started=0.0, clock=lambda: now[0]
    )
    for t in (1.0, 5.0, 9.9, 10.0, 12.0, 19.9, 20.1, 25.0, 31.0):
        now[0] = t
        view.update(view.state.snapshot, view.state.findings)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # at 10.0, 20.1 and 31.0
    assert all(line.startswith("auditor ") for line in lines)


def test_expected_ranks_from_torchrun() -> None:
    assert expected_ranks(["torchrun", "--nproc_per_node=2", "train.py", "--nnodes=9"]) == 2
    assert expected_ranks(["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "t.py"]) == 8
    assert expected_ranks(["torchrun", "--nnodes=1:4", "t.py"]) is None
    assert expected_ranks(["python", "t.py"]) is None
    # A flag that takes no value never swallows the next option.
    assert expected_ranks(["torchrun", "--standalone", "--nproc_per_node=2", "t.py"]) == 2
    assert (
        expected_ranks(["python", "-m", "torch.distributed.run", "--nproc-per-node", "3", "t.py"])
        == 3
    )


def test_rank_info_only_ranks_show_pending_rows() -> None:
    b = JobBuilder([RankSpec(), RankSpec()])
    b.store.add(Batch(infos=(RankInfo(rank=0, world_size=2, host="h"),)))
    b.run(3)  # fewer steps than the store's warm-up would keep in a live run
    state = LiveState(elapsed_s=3, snapshot=b.store.snapshot(b.now, 10.0))
    lines = _screen(state)
    assert _rank_rows(lines)


# What the panel shows for values it lacks, ranks that barely started, findings below warning
# and ranks that ended (the stored two-rank job of tests.helpers.reports).
def _panel(snap: Snapshot, findings: Sequence[Finding] = (), width: int = 100) -> list[str]:
    state = LiveState(elapsed_s=12, job="j", snapshot=snap, findings=tuple(findings))
    return [line.text for line in panel_lines(state, width=width, height=30)]


def test_unmeasured_values_read_dash_never_zero() -> None:
    snap = snapshot_of(make_store(starved=False, with_cpu=False, collective=False))
    rows = _rank_rows(_panel(snap, analyze(snap)))
    for rank in (0, 1):
        cells = rows[rank].split()
        # rank node steps step data compute wait batch samples/s worker-cpu
        assert cells[6] == "-"  # collective wait not measured
        assert cells[9] == "-"  # worker CPU not sampled


def test_ranks_without_two_steps_show_placeholders() -> None:
    snap = snapshot_of(make_store(steps=1))
    lines = _panel(snap, analyze(snap))
    rows = _rank_rows(lines)
    for rank in (0, 1):
        cells = rows[rank].split()
        assert cells[2] == "1" and cells[3:9] == ["..."] * 6
    assert not any("0.0" in line for line in lines)


def test_long_findings_are_clipped_and_info_is_left_to_the_verdict() -> None:
    snap, findings, _ = starved_report()
    info = Finding(kind="memory_headroom", severity="info", ranks=(0,))
    slow = SlowRank("y " * 100, 0.07, 0.03)  # a phase name long enough to be clipped
    long = Finding(
        kind="compute_straggler", severity="warning", ranks=(0, 1), facts=Facts({0: slow, 1: slow})
    )
    lines = _panel(snap, [*findings, info, long], width=60)
    assert all(len(line) < 60 for line in lines)
    assert not any("memory_headroom" in line for line in lines)
    head = "! compute_straggler ranks 0, 1: ranks 0, 1 compute slowe"
    clipped = [line for line in lines if line.startswith(head)]
    assert len(clipped) == 1 and clipped[0].endswith("...")


def test_an_ended_rank_says_so() -> None:
    store = make_store(starved=False)
    store.add(Batch(ended=(1,)))
    rows = _rank_rows(_panel(snapshot_of(store)))
    assert rows[1].rstrip().endswith("ended")
    assert not rows[0].rstrip().endswith("ended")
