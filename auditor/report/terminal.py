"""Terminal views: the live per-rank table while a job runs, and the verdict at the end.

Plain ASCII; ANSI colour only when asked for (``color=True``). Values that were not measured
print as ``-``, never as 0; ranks without enough steps yet print ``...``.
"""

from __future__ import annotations

import shlex
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeGuard

from auditor.analysis.budget import fmt_bytes
from auditor.analysis.findings import SEVERITIES, severity_rank

MISSING = "-"
PENDING = "..."
VERDICT_WIDTH = 80
# The rules' default ``min_steps``: below it in the window they stay silent, so "balanced" would
# claim more than was judged.
MIN_JUDGED_STEPS = 8

_ANSI = {"critical": "\x1b[1;31m", "warning": "\x1b[33m", "ok": "\x1b[32m", "bold": "\x1b[1m"}
_RESET = "\x1b[0m"


# --------------------------------------------------------------------------------------------
# verdict


def render_verdict(report: Mapping[str, Any], *, color: bool = False) -> str:
    """The end-of-run verdict from a JSON report dict (:mod:`auditor.report.json_report`).

    Readable at 80 columns: long lines wrap with their continuation indented.
    """
    job: Mapping[str, Any] = report.get("job") or {}
    ranks: list[Mapping[str, Any]] = sorted(
        (r for r in report.get("ranks") or () if isinstance(r, Mapping)),
        key=lambda r: int(r.get("rank", 0)),
    )
    findings = _sorted_findings(report.get("findings") or ())
    serious = [f for f in findings if _level(f) >= SEVERITIES.index("warning")]
    measured = any((r.get("steps") or 0) > 0 for r in ranks)
    most = max((_as_int(r.get("window_steps", r.get("steps"))) for r in ranks), default=0)

    out: list[str] = []

    def emit(text: str, indent: str = "", cont: str = "    ") -> None:
        out.extend(wrap(text, indent=indent, cont=indent + cont))

    dead = [d for d in job.get("dead_ranks") or () if isinstance(d, Mapping) and d.get("first")]
    if dead:
        # A rank that died mid-run is the first thing to know, whatever the rules found before.
        what = "; ".join(_dead_text(d) for d in dead)
        out.extend(_paint(x, "critical", color) for x in wrap(f"Verdict: {what}", cont="    "))
    elif serious:
        top = _headline_finding(serious)
        blamed = [int(r) for r in top.get("ranks") or ()]
        tag = f"({top.get('kind')}, {top.get('severity')})"
        if blamed:
            verb = "holds" if len(blamed) == 1 else "hold"
            head = f"Verdict: {ranks_text(blamed)} {verb} the job back {tag}"
        else:
            head = f"Verdict: the job is held back {tag}"
        out.extend(_paint(x, str(top.get("severity")), color) for x in wrap(head, cont="    "))
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

    run = _run_line(job, len(ranks))
    if run:
        emit(run)
    command = job.get("command") or []
    if command:
        emit(f"Command: {shlex.join(str(c) for c in command)}")
    code = job.get("exit_code")
    if isinstance(code, int) and code != 0:
        if code < 0:
            emit(f"The command was killed by signal {-code} (exit code {code}).")
        else:
            emit(f"The command exited with code {code}.")
    if job.get("interrupted"):
        emit("The run was interrupted: the report covers it up to that point.")
    nodes = [n for n in job.get("nodes") or () if isinstance(n, Mapping)]
    if nodes:
        emit("Nodes: " + ", ".join(_node_text(n) for n in nodes))

    answers = fix_answers(findings)
    given: dict[tuple[int, str], str] = {}
    for f in findings:
        out.append("")
        out.extend(_finding_lines(f, color, answers, given))

    if ranks:
        out.append("")
        out.append("Per rank (medians per step):")
        out.extend("  " + line for line in _verdict_table(ranks))

    budgets = _budgets(ranks)
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
    notes = [str(n) for n in report.get("notes") or ()]
    if notes:
        out.append("")
        for note in notes:
            emit(f"Note: {note}")
    return "\n".join(out)


def _dead_text(d: Mapping[str, Any]) -> str:
    node = f" on {d['node']}" if d.get("node") else ""
    last = d.get("last_step")
    when = "before its first step" if last is None else f"after step {last}"
    status = d.get("exit_status")
    how = f"exit status {status}" if status is not None else "exit status unknown"
    return f"rank {d.get('rank')}{node} died {when} ({how})"


def _node_text(n: Mapping[str, Any]) -> str:
    ranks = [int(r) for r in n.get("ranks") or ()]
    held = f" ({ranks_text(ranks)})" if ranks else ""
    return f"{n.get('node')} {n.get('state')}{held}"


def fix_answers(findings: Iterable[Mapping[str, Any]]) -> dict[tuple[int, str], list[str]]:
    """Every (rank, fix text) the findings give, with the kinds of the findings that give it,
    in the order given (two findings often name one fix: a throttled GPU is both a hardware
    straggler and the cause of the utilisation gap)."""
    out: dict[tuple[int, str], list[str]] = {}
    for f in findings:
        for key, fix in (f.get("fixes") or {}).items():
            try:
                rank = int(key)
            except (TypeError, ValueError):
                continue
            kinds = out.setdefault((rank, str(fix)), [])
            kind = str(f.get("kind", "?"))
            if kind not in kinds:
                kinds.append(kind)
    return out


def _finding_lines(
    f: Mapping[str, Any],
    color: bool,
    answers: Mapping[tuple[int, str], Sequence[str]] | None = None,
    given: dict[tuple[int, str], str] | None = None,
) -> list[str]:
    """A finding: its head, its summary, and each rank's fix. A fix an earlier finding already
    gave (``given``) is named, not repeated; one that answers several findings (``answers``)
    says which."""
    severity = str(f.get("severity", "info"))
    ranks = [int(r) for r in f.get("ranks") or ()]
    head = f"{f.get('kind', '?')} ({severity})"
    if ranks:
        head += f": {ranks_text(ranks)}"
    speedup = f.get("predicted_speedup")
    if isinstance(speedup, (int, float)) and speedup >= 1.02:
        head += f", predicted speed-up {speedup:.1f}x"
    if f.get("cause"):
        head += f", caused by {f['cause']}"
    lines = [_paint(x, severity, color) for x in wrap(head, cont="    ")]
    summary = str(f.get("summary") or "")
    if summary:
        lines.extend(wrap(summary, indent="  ", cont="    "))
    fixes = f.get("fixes") or {}
    answers = answers or {}
    given = {} if given is None else given
    kind = str(f.get("kind", "?"))
    for rank, fix in sorted(fixes.items(), key=lambda kv: _int_key(kv[0])):
        try:
            key: tuple[int, str] | None = (int(rank), str(fix))
        except (TypeError, ValueError):
            key = None
        if key is not None and key in given:
            text = f"rank {rank}: the fix given under {given[key]} above"
        else:
            text = f"rank {rank}: {fix}"
            kinds = answers.get(key, ()) if key is not None else ()
            if len(kinds) > 1:
                text += f" (answers {', '.join(kinds)})"
            if key is not None:
                given[key] = kind
        lines.extend(wrap(text, indent="  ", cont="      "))
    return lines


def _verdict_table(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    titles = ("rank", "host", "steps", "step ms", "data %", "compute ms", "wait ms", "batch")
    rows = []
    for r in ranks:
        step = r.get("step_s")
        ratio = r.get("data_wait_ratio")
        rows.append(
            [
                str(r.get("rank")),
                short_host(str(r.get("host") or ""), 16),
                fmt_count(r.get("steps")),
                fmt_ms(step),
                fmt_pct(ratio) if ratio is not None else MISSING,
                fmt_ms(r.get("compute_s")),
                fmt_ms(r.get("collective_wait_s")),
                fmt_batch(r.get("batch_size")),
            ]
        )
    return [clip(line, VERDICT_WIDTH - 2) for line in table(titles, rows, left={1})]


def _budgets(ranks: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Each rank's measured memory budget (``memory.budget`` of the report), where it sent one."""
    out: dict[int, Mapping[str, Any]] = {}
    for r in ranks:
        memory = r.get("memory")
        budget = memory.get("budget") if isinstance(memory, Mapping) else None
        if isinstance(budget, Mapping):
            out[_as_int(r.get("rank"))] = budget
    return out


def _memory_table(
    ranks: Sequence[Mapping[str, Any]], budgets: Mapping[int, Mapping[str, Any]]
) -> list[str]:
    """The budget by part, one row per rank (``-`` where a rank sent none or a part is not
    measured). Seven columns of at most 10 characters: 78 columns at most."""
    titles = ("rank", "params", "grads", "optimizer", "buffers", "act/sample", "act/step")
    keys = (
        "param_bytes",
        "grad_bytes",
        "optimizer_bytes",
        "buffer_bytes",
        "activation_bytes_per_sample",
        "activation_bytes_per_step",
    )
    rows = []
    for r in ranks:
        b = budgets.get(_as_int(r.get("rank"))) or {}
        rows.append([str(r.get("rank")), *(fmt_size(b.get(k)) for k in keys)])
    return [clip(line, VERDICT_WIDTH - 2) for line in table(titles, rows, left=set())]


def _memory_notes(budgets: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """What the table leaves out: the batch of the sampled forward, modules outside the model,
    and the memory each rank may use (its device's total, or its share of the host's
    available memory)."""
    every = sorted(budgets)
    notes = []
    batches = {
        r: f"batch {b['activation_batch']}"
        for r, b in budgets.items()
        if _measured(b.get("activation_bytes_per_step")) and b.get("activation_batch")
    }
    if batches:
        at = _grouped(batches, every)
        where = (
            f"at {at[0]}" if len(at) == 1 and len(batches) == len(every) else f"({'; '.join(at)})"
        )
        notes.append(f"act/step: what one sampled forward saved for backward {where}.")
    other = {
        r: fmt_size(b["other_module_bytes"])
        for r, b in budgets.items()
        if _measured(b.get("other_module_bytes")) and b["other_module_bytes"] > 0
    }
    if other:
        notes.append(
            f"Modules outside the model (EMA or eval copies): {'; '.join(_grouped(other, every))}."
        )
    limits = {r: _limit_text(b) for r, b in budgets.items()}
    notes.append(f"Limit per rank: {'; '.join(_grouped(limits, every))}.")
    return notes


def _limit_text(b: Mapping[str, Any]) -> str:
    """The device's total on a GPU; on a CPU job the host's available memory over its ranks."""
    device = b.get("device_total_bytes")
    if _measured(device) and device > 0:
        return f"device total {fmt_size(device)}"
    avail = b.get("host_available_bytes")
    if not _measured(avail):
        return "not measured"
    local = max(1, _as_int(b.get("local_ranks")))
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


def _measured(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _run_line(job: Mapping[str, Any], n_ranks: int) -> str:
    parts: list[str] = []
    if job.get("name"):
        parts.append(f"job {job['name']}")
    world = job.get("world_size") or n_ranks
    if world:
        parts.append(f"{world} rank{'' if world == 1 else 's'}")
    mode = job.get("parallel_mode")
    if mode and mode != "none":
        parts.append(str(mode))
    hosts = job.get("hosts") or {}
    if len(hosts) > 1:
        parts.append(f"{len(hosts)} hosts")
    duration = job.get("duration_s")
    if isinstance(duration, (int, float)):
        parts.append(f"ran {fmt_duration(float(duration))}")
    return f"Run: {', '.join(parts)}" if parts else ""


def _unmeasured(ranks: Sequence[Mapping[str, Any]]) -> list[tuple[tuple[str, ...], list[int]]]:
    groups: dict[tuple[str, ...], list[int]] = {}
    for r in ranks:
        phases = tuple(str(p) for p in r.get("unmeasured") or ())
        if phases:
            groups.setdefault(phases, []).append(int(r.get("rank", 0)))
    return sorted(groups.items(), key=lambda kv: kv[1])


def _level(f: Mapping[str, Any]) -> int:
    sev = f.get("severity")
    return severity_rank(sev)


def _speedup(f: Mapping[str, Any]) -> float:
    s = f.get("predicted_speedup")
    return float(s) if isinstance(s, (int, float)) else 1.0


def _sorted_findings(findings: Iterable[Any]) -> list[Mapping[str, Any]]:
    fs = [f for f in findings if isinstance(f, Mapping)]
    return sorted(fs, key=lambda f: (-_level(f), -_speedup(f)))


def _headline_finding(serious: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The most severe finding; among equals a cause beats a symptom (utilization_imbalance)."""
    top = max(_level(f) for f in serious)
    same = [f for f in serious if _level(f) == top]
    causes = [f for f in same if f.get("kind") != "utilization_imbalance"]
    return max(causes or same, key=_speedup)


def _as_int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _int_key(value: Any) -> tuple[int, str]:
    try:
        return (int(value), "")
    except (TypeError, ValueError):
        return (1 << 30, str(value))


# --------------------------------------------------------------------------------------------
# formatting helpers


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


def ranks_text(ranks: Iterable[int]) -> str:
    rs = sorted(int(r) for r in ranks)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def short_host(host: str, limit: int = 12) -> str:
    """The host name without its domain, cut to ``limit`` characters."""
    if not host:
        return MISSING
    name = host if _is_ip(host) else host.split(".", 1)[0]
    return name if len(name) <= limit else name[: limit - 1] + "~"


def _is_ip(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


def fmt_duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return MISSING
    ms = seconds * 1e3
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.1f}"


def fmt_pct(ratio: float | None) -> str:
    return MISSING if ratio is None else f"{ratio * 100:.0f}%"


def fmt_rate(value: float | None) -> str:
    if value is None:
        return MISSING
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def fmt_batch(value: float | None) -> str:
    if value is None:
        return MISSING
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def fmt_count(value: Any) -> str:
    return MISSING if value is None else str(value)


def fmt_size(n_bytes: Any) -> str:
    """Bytes as :func:`auditor.analysis.budget.fmt_bytes` writes them; ``-`` when not measured."""
    return fmt_bytes(float(n_bytes)) if _measured(n_bytes) else MISSING


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
