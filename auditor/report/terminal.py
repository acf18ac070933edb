"""Terminal views: the verdict at the end of a run, and the layout helpers of text views.

Plain ASCII; ANSI colour only when asked for (``color=True``). Values that were not measured
print as ``-``, never as 0 (figures are worded by :mod:`auditor.wording`). The verdict renders a
:class:`~auditor.report.model.Report`.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Iterable, Mapping, Sequence

from auditor.report.applied import verdict_lines
from auditor.report.columns import VERDICT_COLUMNS, cells, titles
from auditor.report.model import (
    BudgetEntry,
    DeadRank,
    JobSummary,
    NodeEntry,
    RankEntry,
    ReportFinding,
    ReportLike,
    as_report,
)
from auditor.report.time_account import account_lines, lead_line
from auditor.report.work import WORK_TITLES, work_line, work_notes, work_rows
from auditor.wording import (
    fmt_count,
    fmt_duration,
    fmt_predicted,
    fmt_size,
    is_number,
    ranks_text,
    short_host,
    speedup_worth_naming,
)

VERDICT_WIDTH = 80
# The rules' default ``min_steps``: below it in the window they stay silent, so "balanced" would
# claim more than was judged.
MIN_JUDGED_STEPS = 8
# The symptom among the findings: where a cause is as severe, the verdict names the cause.
SYMPTOM = "utilization_imbalance"

_ANSI = {"critical": "\x1b[1;31m", "warning": "\x1b[33m", "ok": "\x1b[32m", "bold": "\x1b[1m"}
_RESET = "\x1b[0m"


# --------------------------------------------------------------------------------------------
# verdict


def render_verdict(report: ReportLike, *, color: bool = False) -> str:
    """The end-of-run verdict of a report (a JSON document is read as one first).

    Readable at 80 columns: long lines wrap with their continuation indented.
    """
    rep = as_report(report)
    job = rep.job
    ranks = rep.sorted_ranks
    findings = rep.sorted_findings
    serious = [f for f in findings if f.at_least("warning")]
    measured = any((r.steps or 0) > 0 for r in ranks)
    most = max((_as_int(r.window_steps) for r in ranks), default=0)

    out: list[str] = []

    def emit(text: str, indent: str = "", cont: str = "    ") -> None:
        out.extend(wrap(text, indent=indent, cont=indent + cont))

    dead = rep.first_dead
    if dead:
        # A rank that died mid-run is the first thing to know, whatever the rules found before.
        what = "; ".join(_dead_text(d) for d in dead)
        out.extend(_paint(x, "critical", color) for x in wrap(f"Verdict: {what}", cont="    "))
    elif serious:
        top = headline_finding(serious)
        tag = f"({top.kind}, {top.severity})"
        if top.ranks:
            verb = "holds" if len(top.ranks) == 1 else "hold"
            head = f"Verdict: {ranks_text(top.ranks)} {verb} the job back {tag}"
        else:
            head = f"Verdict: the job is held back {tag}"
        out.extend(_paint(x, top.severity, color) for x in wrap(head, cont="    "))
    elif not measured:
        head = "Verdict: no training steps were measured - nothing to judge"
        out.extend(_paint(x, "bold", color) for x in wrap(head, cont="    "))
    elif most < MIN_JUDGED_STEPS:
        head = (
            f"Verdict: too few steps to judge ({most} per rank at most, "
            f"{MIN_JUDGED_STEPS} needed) - no rank is blamed yet"
        )
        out.extend(_paint(x, "bold", color) for x in wrap(head, cont="    "))
    else:
        head = "Verdict: balanced - no rank holds the job back"
        out.extend(_paint(x, "ok", color) for x in wrap(head, cont="    "))

    # Where the run's time went: the largest loss over the whole run, seconds and share.
    lead = lead_line(ranks)
    if lead:
        emit(lead)
    run = _run_line(job, len(ranks))
    if run:
        emit(run)
    work = work_line(job)  # the job's FLOP/s and MFU, and where its gap goes
    if work:
        emit(work)
    if job.command:
        emit(f"Command: {shlex.join(job.command)}")
    code = job.exit_code
    if isinstance(code, int) and code != 0:
        if code < 0:
            emit(f"The command was killed by signal {-code} (exit code {code}).")
        else:
            emit(f"The command exited with code {code}.")
    if job.interrupted:
        emit("The run was interrupted: the report covers it up to that point.")
    if job.nodes:
        emit("Nodes: " + ", ".join(_node_text(n) for n in job.nodes))

    answers = fix_answers(findings)
    given: dict[tuple[int, str], str] = {}
    for f in findings:
        out.append("")
        out.extend(_finding_lines(f, color, answers, given))

    if ranks:
        out.append("")
        out.append("Per rank (medians per step):")
        out.extend("  " + line for line in _verdict_table(ranks))

    worked = work_rows(ranks)
    if worked:
        out.append("")
        out.append("Work per rank (FLOPs counted on one step):")
        lines = table(WORK_TITLES, worked, left={4})
        out.extend("  " + clip(line, VERDICT_WIDTH - 2) for line in lines)
        for line in work_notes(job, ranks):
            emit(line, indent="  ", cont="    ")

    accounted = account_lines(ranks)
    if accounted:
        out.append("")
        out.append("Where the time went (whole run, every second once):")
        for line in accounted:
            emit(line, indent="  ", cont="    ")

    budgets = rep.budgets
    if budgets:
        out.append("")
        out.append("Memory per rank (measured):")
        out.extend("  " + line for line in _memory_table(ranks, budgets))
        for line in _memory_notes(budgets):
            emit(line, indent="  ", cont="    ")

    unmeasured = _unmeasured(ranks)
    if unmeasured:
        out.append("")
        for phases, rs in unmeasured:
            emit(f"Not measured on {ranks_text(rs)}: {', '.join(phases)}")
    tried = verdict_lines(rep)  # auditor run --apply: what was applied, what was not
    if tried:
        out.append("")
        for line in tried:
            emit(line)
    if rep.notes:
        out.append("")
        for note in rep.notes:
            emit(f"Note: {note}")
    return "\n".join(out)


def headline_finding(serious: Sequence[ReportFinding]) -> ReportFinding:
    """The most severe finding; among equals a cause beats a symptom (utilization_imbalance)."""
    top = min(f.severity_key for f in serious)
    same = [f for f in serious if f.severity_key == top]
    causes = [f for f in same if f.kind != SYMPTOM]
    return max(causes or same, key=lambda f: f.speedup)


def _dead_text(d: DeadRank) -> str:
    node = f" on {d.node}" if d.node else ""
    when = "before its first step" if d.last_step is None else f"after step {d.last_step}"
    how = f"exit status {d.exit_status}" if d.exit_status is not None else "exit status unknown"
    return f"rank {d.rank}{node} died {when} ({how})"


def _node_text(n: NodeEntry) -> str:
    held = f" ({ranks_text(n.ranks)})" if n.ranks else ""
    return f"{n.node} {n.state}{held}"


def fix_answers(findings: Iterable[ReportFinding]) -> dict[tuple[int, str], list[str]]:
    """Every (rank, fix text) the findings give, with the kinds of the findings that give it,
    in the order given (two findings often name one fix: a throttled GPU is both a hardware
    straggler and the cause of the utilisation gap)."""
    out: dict[tuple[int, str], list[str]] = {}
    for f in findings:
        for rank, fix in f.fixes.items():
            kinds = out.setdefault((rank, fix), [])
            if f.kind not in kinds:
                kinds.append(f.kind)
    return out


def fixes_by_rank(
    findings: Iterable[ReportFinding],
) -> list[tuple[int, list[tuple[str, list[ReportFinding]]]]]:
    """ "What to change, per rank": every rank's fixes, each fix once with every finding it
    answers (ranks in order; fixes in the order of the first finding that gives them, most
    severe first as findings come). The terminal, the HTML page and the JSON agree on it."""
    grouped: dict[int, dict[str, list[ReportFinding]]] = {}
    for f in findings:
        for rank, fix in f.fixes.items():
            grouped.setdefault(rank, {}).setdefault(fix, []).append(f)
    return [(rank, list(by_fix.items())) for rank, by_fix in sorted(grouped.items())]


def fix_given(
    rank: int,
    fix: str,
    kind: str,
    answers: Mapping[tuple[int, str], Sequence[str]],
    given: dict[tuple[int, str], str],
) -> tuple[str | None, list[str]]:
    """A finding's fix for ``rank``, said once: ``(None, kinds)`` the first time it is given
    (``kinds``: every finding it answers, where several give it), ``(kind, [])`` after, naming
    the finding that gave it."""
    key = (rank, fix)
    if key in given:
        return given[key], []
    given[key] = kind
    kinds = list(answers.get(key, ()))
    return None, kinds if len(kinds) > 1 else []


def _finding_lines(
    f: ReportFinding,
    color: bool,
    answers: Mapping[tuple[int, str], Sequence[str]] | None = None,
    given: dict[tuple[int, str], str] | None = None,
) -> list[str]:
    """A finding: its head, its summary, and each rank's fix. A fix an earlier finding already
    gave (``given``) is named, not repeated; one that answers several findings (``answers``)
    says which."""
    head = f"{f.kind} ({f.severity})"
    if f.ranks:
        head += f": {ranks_text(f.ranks)}"
    if speedup_worth_naming(f.predicted_speedup):
        head += f", predicted speed-up {fmt_predicted(f.predicted_speedup, f.predicted_range)}"
    if f.cause:
        head += f", caused by {f.cause}"
    since = f.evidence.get("since_step")
    if isinstance(since, int):  # found in the steps since the run last changed (slowdown)
        head += f", since step {since}"
    lines = [_paint(x, f.severity, color) for x in wrap(head, cont="    ")]
    if f.summary:
        lines.extend(wrap(f.summary, indent="  ", cont="    "))
    if f.unowned_fix:
        lines.extend(wrap(f"fix: {f.unowned_fix}", indent="  ", cont="      "))
    answers = answers or {}
    given = {} if given is None else given
    for rank, fix in sorted(f.fixes.items()):
        earlier, kinds = fix_given(rank, fix, f.kind, answers, given)
        if earlier is not None:
            text = f"rank {rank}: the fix given under {earlier} above"
        else:
            text = f"rank {rank}: {fix}"
            if kinds:
                text += f" (answers {', '.join(kinds)})"
        lines.extend(wrap(text, indent="  ", cont="      "))
    return lines


def _verdict_table(ranks: Sequence[RankEntry]) -> list[str]:
    head = ("rank", "host", "steps", *titles(VERDICT_COLUMNS))
    rows = [
        [str(r.rank), short_host(r.host or "", 16), fmt_count(r.steps), *cells(r, VERDICT_COLUMNS)]
        for r in ranks
    ]
    return [clip(line, VERDICT_WIDTH - 2) for line in table(head, rows, left={1})]


# The budget table's parts, in column order: (title, field of BudgetEntry).
MEMORY_COLUMNS = (
    ("params", "param_bytes"),
    ("grads", "grad_bytes"),
    ("optimizer", "optimizer_bytes"),
    ("buffers", "buffer_bytes"),
    ("act/sample", "activation_bytes_per_sample"),
    ("act/step", "activation_bytes_per_step"),
)


def _memory_table(ranks: Sequence[RankEntry], budgets: Mapping[int, BudgetEntry]) -> list[str]:
    """The budget by part, one row per rank (``-`` where a rank sent none or a part is not
    measured). Seven columns of at most 10 characters: 78 columns at most."""
    titles = ("rank", *(t for t, _ in MEMORY_COLUMNS))
    rows = []
    for r in ranks:
        b = budgets.get(r.rank)
        rows.append(
            [
                str(r.rank),
                *(fmt_size(None if b is None else getattr(b, k)) for _, k in MEMORY_COLUMNS),
            ]
        )
    return [clip(line, VERDICT_WIDTH - 2) for line in table(titles, rows, left=set())]


def _memory_notes(budgets: Mapping[int, BudgetEntry]) -> list[str]:
    """What the table leaves out: the batch of the sampled forward, modules outside the model,
    and the memory each rank may use (its device's total, or its share of the host's
    available memory)."""
    every = sorted(budgets)
    notes = []
    batches = {
        r: f"batch {b.activation_batch}"
        for r, b in budgets.items()
        if is_number(b.activation_bytes_per_step) and b.activation_batch
    }
    if batches:
        at = _grouped(batches, every)
        where = (
            f"at {at[0]}" if len(at) == 1 and len(batches) == len(every) else f"({'; '.join(at)})"
        )
        notes.append(f"act/step: what one sampled forward saved for backward {where}.")
    other = {
        r: fmt_size(b.other_module_bytes)
        for r, b in budgets.items()
        if is_number(b.other_module_bytes) and b.other_module_bytes > 0
    }
    if other:
        notes.append(
            f"Modules outside the model (EMA or eval copies): {'; '.join(_grouped(other, every))}."
        )
    limits = {r: _limit_text(b) for r, b in budgets.items()}
    notes.append(f"Limit per rank: {'; '.join(_grouped(limits, every))}.")
    return notes


def _limit_text(b: BudgetEntry) -> str:
    """The device's total on a GPU; on a CPU job the host's available memory over its ranks."""
    device = b.device_total_bytes
    if is_number(device) and device > 0:
        return f"device total {fmt_size(device)}"
    avail = b.host_available_bytes
    if not is_number(avail):
        return "not measured"
    local = max(1, _as_int(b.local_ranks))
    text = f"host memory available {fmt_size(avail / local)}"
    if local > 1:
        text += f" ({fmt_size(avail)} shared by {local} ranks)"
    return text


def _grouped(texts: Mapping[int, str], every: Sequence[int]) -> list[str]:
    """``ranks a, b: text`` per distinct text, in rank order; the text alone where every rank
    in ``every`` has it."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(texts):
        groups.setdefault(texts[rank], []).append(rank)
    if len(groups) == 1 and sorted(texts) == sorted(every):
        return list(groups)
    return [f"{ranks_text(rs)}: {text}" for text, rs in groups.items()]


def _run_line(job: JobSummary, n_ranks: int) -> str:
    parts: list[str] = []
    if job.name:
        parts.append(f"job {job.name}")
    world = job.world_size or n_ranks
    if world:
        parts.append(f"{world} rank{'' if world == 1 else 's'}")
    mode = job.parallel_mode
    if mode and mode != "none":
        parts.append(str(mode))
    if len(job.hosts) > 1:
        parts.append(f"{len(job.hosts)} hosts")
    if is_number(job.duration_s):
        parts.append(f"ran {fmt_duration(float(job.duration_s))}")
    return f"Run: {', '.join(parts)}" if parts else ""


def _unmeasured(ranks: Sequence[RankEntry]) -> list[tuple[tuple[str, ...], list[int]]]:
    groups: dict[tuple[str, ...], list[int]] = {}
    for r in ranks:
        if r.unmeasured:
            groups.setdefault(r.unmeasured, []).append(r.rank)
    return sorted(groups.items(), key=lambda kv: kv[1])


def _as_int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# --------------------------------------------------------------------------------------------
# layout (the wording of figures is auditor.wording's)


def wrap(
    text: str, *, width: int = VERDICT_WIDTH, indent: str = "", cont: str = "    "
) -> list[str]:
    """``text`` wrapped to ``width`` columns, continuation lines indented by ``cont``."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=cont,
        break_on_hyphens=False,
    ) or [indent.rstrip()]


def table(titles: Sequence[str], rows: Sequence[Sequence[str]], *, left: set[int]) -> list[str]:
    widths = [max([len(t)] + [len(r[i]) for r in rows]) for i, t in enumerate(titles)]

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [fmt(titles), *(fmt(r) for r in rows)]


def clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` characters, ending in ``...`` where it was cut."""
    if len(line) <= width:
        return line
    return line[: max(0, width - 3)] + "..."


def _paint(line: str, style: str, color: bool) -> str:
    if not color or style not in _ANSI:
        return line
    return f"{_ANSI[style]}{line}{_RESET}"
