"""What the live view shows while a job runs: the panel (on a terminal) and the status line (not).

Pure functions of a :class:`LiveState`: no I/O, no clock. :mod:`auditor.report.liveview` draws
them (``rich`` on a terminal, one plain line at most every 10 s elsewhere).

The panel fits ``width`` x ``height``. When every rank fits, it lists every rank (grouped by node
in a multi-node job). Past that it shows one summary row over all ranks and then the ranks that
matter, in this order of priority: the ranks a finding blames, the slowest (most local work per
step: under DDP every rank's step time is the same, the culprit is the one that waits least), and
the most starved (highest data wait); it says how many ranks it hides.

Columns mean what they say: ``steps`` counts every step so far (the whole run); the other rank
figures are medians per step over the last ``window_s`` seconds, and the header says so (the
step, data wait and collective wait at the rank's pace: :attr:`Snapshot.paced`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from auditor.analysis.findings import Finding, severity_key
from auditor.analysis.mfu import rank_flops
from auditor.analysis.snapshot import Snapshot
from auditor.analysis.stats import RankStats
from auditor.report.columns import FIGURE_COLUMNS, cells, titles
from auditor.report.phrasing import phrase
from auditor.report.phrasing.memory_growth import climbing, live_tag, soonest_climb
from auditor.report.terminal import clip
from auditor.report.work import mfu_cell
from auditor.wording import (
    MISSING,
    PENDING,
    fmt_duration,
    fmt_pct,
    ranks_text,
    short_host,
)
from auditor.wording import fmt_ms_value as fmt_ms

# The share of the terminal the panel may take: the job's own output keeps the rest.
PANEL_SHARE = 2 / 3
MIN_PANEL_LINES = 6
# Findings listed under the table at most (the verdict lists them all at the end).
MAX_FINDING_LINES = 3
WARNING = severity_key("warning")
# Past what fits, a rank is shown as slow when its local work per step exceeds the median rank's
# by this factor, and as starved when its data wait share exceeds the median's by this much.
SLOWER = 1.05
MORE_STARVED = 0.05


@dataclass(frozen=True)
class LiveState:
    """Everything one frame of the live view shows."""

    elapsed_s: float
    job: str = ""
    # What the view waits for while no rank has stepped yet ("starting Ray", ...).
    stage: str | None = None
    snapshot: Snapshot | None = None
    findings: tuple[Finding, ...] = ()
    window_s: float = 10.0
    # Ranks the command will start, where it says so (torchrun's --nproc_per_node x --nnodes).
    expected_ranks: int | None = None
    # The job's current unfinished output line (a progress bar redrawn with \r), if any.
    partial: str = field(default="", compare=False)


@dataclass(frozen=True)
class Line:
    """One panel line and how to paint it (a severity, "bold", "dim" or "")."""

    text: str
    style: str = ""


# --------------------------------------------------------------------------------------------
# figures shared by the panel and the status line


def stepped(snapshot: Snapshot | None) -> dict[int, RankStats]:
    """Per-rank window statistics (at each rank's pace) of the ranks with at least two steps in
    the window."""
    if snapshot is None:
        return {}
    return {r: s for r, s in snapshot.paced.items() if s.steps >= 2 and s.step_s > 0}


def steps_per_s(stats: dict[int, RankStats]) -> float | None:
    """The job's step rate over the window: the median rank's (DDP keeps ranks in step)."""
    if not stats:
        return None
    return 1.0 / statistics.median(s.step_s for s in stats.values())


def serious(findings: Sequence[Finding]) -> list[Finding]:
    """Findings at warning or above, most severe and largest speed-up first."""
    fs = [f for f in findings if severity_key(f.severity) <= WARNING]
    return sorted(fs, key=lambda f: (severity_key(f.severity), -(f.predicted_speedup or 1.0)))


def blamed(findings: Sequence[Finding]) -> dict[int, Finding]:
    """Rank -> the most serious finding that blames it (warning or above)."""
    out: dict[int, Finding] = {}
    for f in serious(findings):
        for r in f.ranks:
            out.setdefault(r, f)
    return out


def slowest(stats: dict[int, RankStats]) -> RankStats | None:
    """The rank with the most local work per step (the one the others wait for)."""
    return max(stats.values(), key=lambda s: (s.local_s, -s.rank), default=None)


def why_slow(s: RankStats) -> str:
    """The largest part of a rank's local step, as a share of its step."""
    parts = {
        "data wait": s.data_wait_s,
        "host-to-device": s.h2d_s,
        "forward": s.forward_s,
        "backward": s.backward_s,
        "optimizer": s.optimizer_s,
    }
    name, value = max(parts.items(), key=lambda kv: kv[1])
    return f"{name} {fmt_pct(value / s.step_s)}" if s.step_s > 0 else name


def waiting_text(state: LiveState) -> str | None:
    """What the view waits for, or None once a rank has steps in the window."""
    snap = state.snapshot
    if snap is not None and stepped(snap):
        return None
    connected = len(snap.ranks) if snap is not None else 0
    expected = (snap.world_size if snap is not None else 0) or state.expected_ranks
    of = f" of {expected}" if expected else ""
    if connected == 0 and state.stage:
        return f"{state.stage} ..."
    if snap is not None and any(snap.total_steps.values()):
        return f"warming up: {connected}{of} ranks stepping, first steps not judged ..."
    if connected == 0:
        return f"waiting for ranks: 0{of} connected ..."
    if expected and connected < expected:
        return f"waiting for ranks: {connected}{of} connected ..."
    return f"waiting for the first step: {connected}{of} ranks connected ..."


# --------------------------------------------------------------------------------------------
# status line (not a terminal)


def status_line(state: LiveState) -> str:
    """One compact plain line: elapsed, steps/s, the slowest rank and why, current findings."""
    head = f"auditor {fmt_duration(state.elapsed_s)}"
    wait = waiting_text(state)
    if wait is not None:
        return f"{head}: {wait}"
    snap = state.snapshot
    assert snap is not None  # waiting_text returns text without one
    stats = stepped(snap)
    n = len(snap.ranks)
    parts = [f"{n} rank{'' if n == 1 else 's'}"]
    rate = steps_per_s(stats)
    if rate is not None:
        parts.append(f"{rate:.1f} steps/s")
    slow = slowest(stats)
    if slow is not None and n > 1:
        parts.append(f"slowest rank {slow.rank} ({why_slow(slow)})")
    fs = serious(state.findings)
    if fs:
        parts.append("findings: " + "; ".join(_finding_tag(f) for f in fs))
    else:
        parts.append("no findings")
    return f"{head}: " + ", ".join(parts)


def _finding_tag(f: Finding) -> str:
    who = f" {ranks_text(f.ranks)}" if f.ranks else ""
    climb = soonest_climb(f)  # memory that climbs: how fast, and the time left
    return f"{f.kind}{who} ({f.severity}{', ' + climb if climb else ''})"


# --------------------------------------------------------------------------------------------
# panel (terminal)

# The figure columns are the report's (auditor.report.columns): the panel reads a rank's window
# as the verdict and the HTML page read its report entry.
# "MFU": the rank's model FLOPs utilisation at its pace (its FLOP/s on a CPU or a card the peak
# table does not know; ``-`` until it counted its FLOPs).
_TITLES = ("rank", "node", "steps", *titles(FIGURE_COLUMNS), "worker cpu", "MFU", "")
_LAST = len(_TITLES) - 1
_MFU = _LAST - 1
_LEFT = {1, _LAST}
# The window columns (at the ranks' pace over the window): from "step ms" to "MFU".
_WINDOW_COLS = range(3, _LAST)
# Columns dropped first when the terminal is narrow (by index, least useful first).
_DROP_ORDER = (8, 7, 9, 5, _MFU)


def panel_height(rows: int) -> int:
    """Lines the panel may take on a terminal of ``rows`` lines."""
    return max(MIN_PANEL_LINES, int(rows * PANEL_SHARE))


def panel_lines(state: LiveState, *, width: int, height: int) -> list[Line]:
    """The panel as at most ``height`` lines of at most ``width - 1`` characters.

    (The last column stays free: a line that fills the terminal's width makes some terminals
    wrap early.)
    """
    width = max(20, width - 1)
    height = max(3, height)
    lines: list[Line] = []
    if state.partial:
        lines.append(Line(_clip(state.partial, width)))
    lines.append(Line(_clip(_title(state), width), "bold"))
    wait = waiting_text(state)
    if wait is not None:
        lines.append(Line(_clip(wait, width), "dim"))
    snap = state.snapshot
    if snap is None or not snap.ranks:
        return lines[:height]
    fs = serious(state.findings)
    finding_lines = _finding_lines(fs, width, max(1, (height - len(lines)) // 4))
    room = height - len(lines) - len(finding_lines) - 2  # 2: the two header lines
    lines.extend(_rank_table(snap, state.findings, state.window_s, width, room))
    lines.extend(finding_lines)
    return lines[:height]


def _title(state: LiveState) -> str:
    parts = [f"auditor {fmt_duration(state.elapsed_s)}"]
    snap = state.snapshot
    if state.job:
        parts.append(state.job)
    if snap is not None and snap.ranks:
        n = len(snap.ranks)
        hosts = len(snap.hosts())
        where = f" on {hosts} nodes" if hosts > 1 else ""
        mode = f" {snap.parallel_mode}" if snap.parallel_mode != "none" else ""
        parts.append(f"{n} rank{'' if n == 1 else 's'}{mode}{where}")
        rate = steps_per_s(stepped(snap))
        if rate is not None:
            parts.append(f"{rate:.1f} steps/s")
    return "  |  ".join(parts)


def _finding_lines(fs: Sequence[Finding], width: int, most: int) -> list[Line]:
    shown = fs[: min(MAX_FINDING_LINES, most)]
    out = []
    for f in shown:
        who = f" {ranks_text(f.ranks)}" if f.ranks else ""
        out.append(Line(_clip(f"! {f.kind}{who}: {phrase(f).summary}", width), f.severity))
    if len(fs) > len(shown) and out:
        rest = len(fs) - len(shown) + 1
        out[-1] = Line(_clip(f"! {rest} more findings (the verdict lists them all)", width))
    return out


def _rank_table(
    snap: Snapshot, findings: Sequence[Finding], window_s: float, width: int, room: int
) -> list[Line]:
    """Header lines and rank rows, fitted into ``room`` rows below the two header lines."""
    stats = snap.paced
    work = rank_flops(snap)
    ended = {v.info.rank for v in snap.ranks if v.ended}
    blame = blamed(findings)
    climbs = climbing(findings)  # ranks whose memory climbs (memory_growth, any severity)
    hosts = {v.info.rank: v.info.host for v in snap.ranks}
    by_node = _group_by_node(snap)
    multi = len(by_node) > 1
    everyone = sorted(hosts)
    full_rows = len(everyone) + (len(by_node) if multi else 0)
    every_node = False
    if full_rows <= room:
        shown = everyone
        summary: Line | None = None
    else:
        room_left = max(1, room - 2)  # the summary row and the "hidden" line
        # Every node keeps its line (its own summary) while the nodes take at most half the
        # room; past that only the nodes of the ranks shown have one.
        every_node = multi and len(by_node) <= room_left // 2
        if every_node:
            room_left -= len(by_node)
        shown = _pick(snap, stats, blame, by_node, room_left, multi and not every_node)
        summary = Line(_summary(snap, stats), "bold")

    rows: list[tuple[list[str], str]] = []
    shown_set = set(shown)
    for host, ranks in by_node.items():
        mine = [r for r in ranks if r in shown_set]
        if not mine and not (multi and summary is not None and every_node):
            continue
        if multi:
            hidden = len(ranks) - len(mine)
            rows.append(([_node_row(host, ranks, hidden, stats)], "dim"))
        for r in mine:
            f = work.get(r)
            mfu = MISSING if f is None else mfu_cell(f.mfu, f.flops_per_s)
            cells = _rank_cells(stats[r], snap.total_steps.get(r, 0), hosts[r], r in ended, mfu)
            if r in blame:
                cells[0] = "!" + cells[0]
                # The finding lines below name the kind; the row only says which ranks.
                cells[_LAST] = "blamed"
            if r in climbs:  # the climb and the time left
                cells[_LAST] = "; ".join(c for c in (cells[_LAST], live_tag(climbs[r])) if c)
            rows.append((cells, blame[r].severity if r in blame else ""))
    # The MFU column once a rank counted its FLOPs (a job without a count keeps its width).
    table = _fit_table([cells for cells, _ in rows if len(cells) > 1], width, mfu=bool(work))
    out = [Line(table.super_header(window_s), "dim"), Line(table.header, "bold")]
    if summary is not None:
        out.append(Line(_clip(summary.text, width), summary.style))
    it = iter(table.rows)
    for cells, style in rows:
        text = cells[0] if len(cells) == 1 else next(it)
        out.append(Line(_clip(text, width), style))
    hidden = len(everyone) - len(shown)
    if hidden:
        out.append(
            Line(
                _clip(
                    f"{hidden} of {len(everyone)} ranks hidden "
                    "(shown: blamed, slowest, most starved)",
                    width,
                ),
                "dim",
            )
        )
    return out


def _group_by_node(snap: Snapshot) -> dict[str, list[int]]:
    """Ranks per host, hosts in order of their lowest rank."""
    groups = snap.hosts()
    return {h: sorted(rs) for h, rs in sorted(groups.items(), key=lambda kv: (min(kv[1]), kv[0]))}


def _pick(
    snap: Snapshot,
    stats: dict[int, RankStats],
    blame: dict[int, Finding],
    by_node: dict[str, list[int]],
    room: int,
    multi: bool,
) -> list[int]:
    """The ranks that matter, as many as fit in ``room`` rows (a node's first shown rank costs
    one more row in a multi-node job, for its node line)."""
    live = stepped(snap)
    by_slow = sorted(live.values(), key=lambda s: (-s.local_s, s.rank))
    by_starved = sorted(live.values(), key=lambda s: (-s.data_wait_ratio, s.rank))
    # Past the first of each, only ranks that stand out from the median: jitter among equals
    # would fill the panel with ranks that tell nothing.
    if live:
        local = statistics.median(s.local_s for s in live.values())
        data = statistics.median(s.data_wait_ratio for s in live.values())
        by_slow = by_slow[:1] + [s for s in by_slow[1:] if s.local_s > local * SLOWER]
        by_starved = by_starved[:1] + [
            s for s in by_starved[1:] if s.data_wait_ratio > data + MORE_STARVED
        ]
    order: list[int] = sorted(blame)
    for i in range(max(len(by_slow), len(by_starved))):
        order.extend(s.rank for s in (by_slow[i : i + 1] + by_starved[i : i + 1]))
    # Ranks that have not stepped in the window (stalled or not started) matter too.
    order.extend(sorted(set(stats) - set(live)))
    node_of = {r: h for h, rs in by_node.items() for r in rs}
    picked: list[int] = []
    nodes: set[str] = set()
    used = 0
    for r in order:
        if r in picked or r not in node_of:
            continue
        cost = 1 + (1 if multi and node_of[r] not in nodes else 0)
        if used + cost > room:
            continue
        picked.append(r)
        nodes.add(node_of[r])
        used += cost
    return sorted(picked)


def _summary(snap: Snapshot, stats: dict[int, RankStats]) -> str:
    live = stepped(snap)
    n = len(snap.ranks)
    head = f"{n} ranks:"
    if not live:
        return f"{head} no steps in the window yet"
    steps = [s.step_s for s in live.values()]
    worst = max(live.values(), key=lambda s: (s.step_s, -s.rank))
    starved = max(live.values(), key=lambda s: (s.data_wait_ratio, -s.rank))
    waits = [s.collective_wait_s for s in live.values() if s.collective_wait_s is not None]
    parts = [
        f"{head} step {fmt_ms(statistics.median(steps))} ms median, {fmt_ms(worst.step_s)} worst",
        f"data {fmt_pct(statistics.median(s.data_wait_ratio for s in live.values()))} median, "
        f"{fmt_pct(starved.data_wait_ratio)} worst (rank {starved.rank})",
    ]
    if waits:
        parts.append(f"wait {fmt_ms(statistics.median(waits))} ms median")
    return "  ".join(parts)


def _node_row(host: str, ranks: Sequence[int], hidden: int, stats: dict[int, RankStats]) -> str:
    live = [stats[r] for r in ranks if r in stats and stats[r].steps >= 2 and stats[r].step_s > 0]
    text = f"node {short_host(host, 24)}: {len(ranks)} ranks"
    if hidden:
        text += ", all hidden" if hidden == len(ranks) else f", {hidden} hidden"
    if live:
        text += f", step {fmt_ms(statistics.median(s.step_s for s in live))} ms median"
        text += f", data {fmt_pct(statistics.median(s.data_wait_ratio for s in live))} median"
    return text


def _rank_cells(s: RankStats, total: int, host: str, ended: bool, mfu: str = MISSING) -> list[str]:
    wkr = _worker_cpu(s)
    state = "ended" if ended else ""
    if s.steps < 2 or s.step_s <= 0:
        pending = [PENDING] * len(FIGURE_COLUMNS)
        return [str(s.rank), short_host(host), str(total), *pending, wkr, PENDING, state]
    figures = cells(s, FIGURE_COLUMNS)
    return [str(s.rank), short_host(host), str(total), *figures, wkr, mfu, state]


def _worker_cpu(s: RankStats) -> str:
    if s.worker_cpu is not None and s.workers > 0:
        return f"{s.worker_cpu:.1f}/{s.workers}"
    if s.loader is not None and s.loader.num_workers == 0:
        return "main"
    return MISSING


@dataclass(frozen=True)
class _Table:
    header: str
    rows: list[str]
    # Where the steps column ends, and the (start, end) character columns of the window
    # figures: the line above the header labels them.
    steps_end: int
    window_span: tuple[int, int]

    def super_header(self, window_s: float) -> str:
        start, end = self.window_span
        label = f" medians per step, last {fmt_duration(window_s)} "
        rule = label.center(max(len(label), end - start), "-")
        head = "so far".rjust(self.steps_end)
        if len(head) + 2 > start:
            head = ""
        return (head.ljust(start) + rule).rstrip()


def _fit_table(rows: Sequence[Sequence[str]], width: int, *, mfu: bool = True) -> _Table:
    """Aligned columns; drops the least useful columns until the table fits ``width`` (and the
    MFU column where ``mfu`` is false: no rank counted its FLOPs)."""
    cols = [i for i in range(len(_TITLES)) if mfu or i != _MFU]
    table = _layout(cols, rows)
    # The last column (what blames the rank) may be cut; the figures may not.
    figures = _layout(cols[:-1], rows)
    # A row with a last column ("blamed") keeps room for at least its "..." after the figures,
    # so that clipping the row never eats a figure.
    room = width - 5 if any(r[_LAST] for r in rows) else width
    for drop in _DROP_ORDER:
        if len(figures.header) <= width and all(len(r) <= room for r in figures.rows):
            break
        if drop not in cols:
            continue
        cols.remove(drop)
        table = _layout(cols, rows)
        figures = _layout(cols[:-1], rows)
    return table


def _layout(cols: Sequence[int], rows: Sequence[Sequence[str]]) -> _Table:
    widths = {i: max([len(_TITLES[i])] + [len(r[i]) for r in rows]) for i in cols}

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            cells[i].ljust(widths[i]) if i in _LEFT else cells[i].rjust(widths[i]) for i in cols
        ]
        return "  ".join(parts).rstrip()

    starts: dict[int, int] = {}
    pos = 0
    for i in cols:
        starts[i] = pos
        pos += widths[i] + 2
    window = [i for i in cols if i in _WINDOW_COLS]
    span = (starts[window[0]], starts[window[-1]] + widths[window[-1]])
    return _Table(fmt(_TITLES), [fmt(r) for r in rows], starts[2] + widths[2], span)


def _clip(line: str, width: int) -> str:
    return clip(line.replace("\t", "    "), width)
