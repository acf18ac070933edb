"""Two runs side by side: did the fix work, and as well as the verdict said it would?

Pure: two ``auditor.report`` documents (v1 or v2) in, a comparison document out (schema
``auditor.compare/v1``), and its text at 80 columns. Loading files (reports or recordings) is the
command's business (:mod:`auditor.commands.reports`).

The measured speed-up is the BEFORE run's time per step over the AFTER run's, each taken on its
slowest rank (under DDP every rank's step ends at the same all-reduce, so the slowest rank's is
the job's): its steps' time in the run over their count (``ranks[i].time``, the time account:
start-up and teardown left out), where both reports have one. A median step would leave out
what comes once in many steps (workers started at every epoch, a periodic stall, an evaluation)
and what a fix of it gives back. Reports without an account compare their median steps
(``step_basis``). The predicted one is the largest ``predicted_speedup`` among BEFORE's
warning and critical findings: what its verdict promised for its own fixes.

Per finding of BEFORE (``per_finding``): its predicted speed-up beside the achieved one (the
job's measured speed-up: every fix of every finding acts on the one job step), whether it is gone
in AFTER, and for each of its typed fixes whether AFTER runs with it: ``applied`` (``auditor run
--apply`` moved it, AFTER's ``ranks[i].applied``), ``in_effect`` (AFTER's loader has the proposed
value: the script was changed), ``other`` (AFTER's loader has another value), ``unknown`` (AFTER
shows no loader for the rank) or ``not_checked`` (a code or hardware change: no report can tell).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from auditor.analysis.findings import severity_key
from auditor.analysis.fixes import Fix
from auditor.report.applied import setting
from auditor.report.model import RankEntry, Report, ReportFinding, ReportLike, as_report
from auditor.report.terminal import VERDICT_WIDTH, table, wrap
from auditor.wording import fmt_ms_value as fmt_ms
from auditor.wording import fmt_setting, fmt_share, is_number, ranks_text, severity_change

SCHEMA = "auditor.compare/v1"
# What the measured speed-up compares (``speedup.step_basis``): each run's time per step over its
# steps, or its median step (reports without a time account).
RUN_PACE = "run_pace"
MEDIAN_STEP = "median_step"

# Shares of the step, in step order: (short title, name in the comparison document).
SHARES = (
    ("data", "data_wait"),
    ("h2d", "h2d"),
    ("fwd", "forward"),
    ("bwd", "backward_own"),
    ("opt", "optimizer"),
    ("wait", "collective_wait"),
    ("other", "other"),
)
# Loader settings worth naming when they changed between the runs.
LOADER_KEYS = ("num_workers", "batch_size", "pin_memory", "persistent_workers", "prefetch_factor")


def compare_reports(
    before: ReportLike,
    after: ReportLike,
    *,
    before_source: str = "before",
    after_source: str = "after",
) -> dict[str, Any]:
    """The comparison document of two reports (plain JSON types)."""
    b_rep, a_rep = as_report(before), as_report(after)
    paced = _paced(b_rep) and _paced(a_rep)
    b_step, b_rank = job_step(b_rep, paced=paced)
    a_step, a_rank = job_step(a_rep, paced=paced)
    measured = b_step / a_step if b_step and a_step else None
    predictor = predicting_finding(b_rep)
    predicted = predictor.predicted_speedup if predictor is not None else None
    b_ranks = _ranks(b_rep)
    a_ranks = _ranks(a_rep)
    ranks = []
    for r in sorted(set(b_ranks) | set(a_ranks)):
        ranks.append(
            {
                "rank": r,
                "before": _rank_side(b_ranks.get(r)),
                "after": _rank_side(a_ranks.get(r)),
                "changed": _loader_changes(b_ranks.get(r), a_ranks.get(r)),
            }
        )
    gone, new, remain = diff_findings(b_rep.findings, a_rep.findings)
    b_rate = _throughput(b_rep, paced=paced)
    a_rate = _throughput(a_rep, paced=paced)
    return {
        "schema": SCHEMA,
        "before": _side(b_rep, before_source, b_step, b_rank, b_rate),
        "after": _side(a_rep, after_source, a_step, a_rank, a_rate),
        "speedup": {
            "measured": _round(measured, 3),
            "step_basis": RUN_PACE if paced else MEDIAN_STEP,
            "predicted": _round(predicted, 3),
            "predicted_range": _span(predictor.predicted_range if predictor else None),
            "inside_range": _inside(measured, predictor.predicted_range if predictor else None),
            "predicted_by": (
                None
                if predictor is None
                else {
                    "kind": predictor.kind,
                    "ranks": list(predictor.ranks),
                    "severity": predictor.severity,
                }
            ),
            "throughput_ratio": _round(a_rate / b_rate, 3) if a_rate and b_rate else None,
        },
        "ranks": ranks,
        "findings": {"gone": gone, "new": new, "remain": remain},
        "per_finding": per_finding(b_rep, a_rep, measured),
    }


def per_finding(before: Report, after: Report, measured: float | None) -> list[dict[str, Any]]:
    """BEFORE's findings that predict a speed-up or warn, most severe first: each one's
    predicted speed-up beside the achieved one, its fate in AFTER, and its fixes' states (module
    doc)."""
    later = {(f.kind, tuple(sorted(f.ranks))): f for f in after.findings}
    measured = _round(measured, 3)  # as the document and its text give it
    a_ranks = _ranks(after)
    out = []
    for f in before.sorted_findings:
        if f.predicted_speedup is None and not f.at_least("warning"):
            continue
        now = later.get((f.kind, tuple(sorted(f.ranks))))
        predicted = f.predicted_speedup
        out.append(
            {
                "kind": f.kind,
                "ranks": list(f.ranks),
                "severity": f.severity,
                "predicted": _round(predicted, 3),
                "range": _span(f.predicted_range),
                "achieved": _round(measured, 3),
                "inside_range": _inside(measured, f.predicted_range),
                "achieved_share": (
                    _round(measured / predicted, 3) if measured and predicted else None
                ),
                "after": "gone" if now is None else now.severity,
                "fixes": [
                    _fix_state(x, None if x.rank is None else a_ranks.get(x.rank))
                    for x in f.actions
                ],
            }
        )
    return out


def _fix_state(fix: Fix, after: RankEntry | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rank": fix.rank,
        "lever": fix.lever,
        "current": fix.current,
        "proposed": fix.proposed,
        "after_value": None,
    }
    if not fix.applicable:
        return {**entry, "state": "not_checked"}
    moved = next((m for m in (after.applied if after else ()) if m.get("lever") == fix.lever), None)
    if moved is not None:
        return {**entry, "after_value": moved.get("to"), "state": "applied"}
    loader = (after.loader if after else None) or {}
    if fix.lever not in loader:
        return {**entry, "state": "unknown"}
    value = loader[fix.lever]
    return {
        **entry,
        "after_value": value,
        "state": "in_effect" if value == fix.proposed else "other",
    }


def job_step(report: ReportLike, *, paced: bool = True) -> tuple[float | None, int | None]:
    """The job's step (seconds) and the rank it comes from, the slowest timed rank: its time
    per step over the run (``paced``, where the report has its time account), else its median
    step."""
    best: tuple[float, int] | None = None
    for r in as_report(report).ranks:
        step = _pace(r) if paced else r.step_s
        if is_number(step) and step > 0 and (best is None or step > best[0]):
            best = (float(step), r.rank)
    return (best[0], best[1]) if best else (None, None)


def _pace(r: RankEntry) -> float | None:
    """A rank's steps' time in the run over their count (None: no account, or no steps)."""
    a = r.time
    if a is None or a.steps <= 0 or a.steps_s <= 0:
        return None
    return a.steps_s / a.steps


def _paced(report: Report) -> bool:
    """Every timed rank of ``report`` has its time account (:func:`_pace`)."""
    timed = [r for r in report.ranks if is_number(r.step_s) and r.step_s > 0]
    return bool(timed) and all(_pace(r) is not None for r in timed)


def predicting_finding(report: ReportLike) -> ReportFinding | None:
    """The warning/critical finding with the largest predicted speed-up (None if none has one)."""
    best: ReportFinding | None = None
    for f in as_report(report).findings:
        if not f.at_least("warning") or f.predicted_speedup is None:
            continue
        if best is None or f.speedup > best.speedup:
            best = f
    return best


def diff_findings(
    before: Sequence[ReportFinding], after: Sequence[ReportFinding]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Findings matched by kind and blamed ranks: (gone, new, remain), most severe first."""

    def index(fs: Sequence[ReportFinding]) -> dict[tuple[str, tuple[int, ...]], ReportFinding]:
        out: dict[tuple[str, tuple[int, ...]], ReportFinding] = {}
        for f in fs:
            key = (f.kind, tuple(sorted(f.ranks)))
            if key not in out or f.severity_key < out[key].severity_key:
                out[key] = f
        return out

    b, a = index(before), index(after)

    def entry(key: tuple[str, tuple[int, ...]], f: ReportFinding) -> dict[str, Any]:
        return {
            "kind": key[0],
            "ranks": list(key[1]),
            "severity": f.severity,
            "summary": f.summary,
            "predicted_speedup": f.predicted_speedup,
        }

    gone = [entry(k, f) for k, f in b.items() if k not in a]
    new = [entry(k, f) for k, f in a.items() if k not in b]
    remain = []
    for k, f in b.items():
        if k in a:
            e = entry(k, a[k])
            e["severity_before"] = f.severity
            remain.append(e)

    def order(e: Mapping[str, Any]) -> tuple[int, str, list[int]]:
        return (severity_key(e.get("severity_before", e["severity"])), e["kind"], e["ranks"])

    return sorted(gone, key=order), sorted(new, key=order), sorted(remain, key=order)


# --------------------------------------------------------------------------------------------
# text


def render_compare(result: Mapping[str, Any], *, width: int = VERDICT_WIDTH) -> str:
    """The comparison as text, every line within ``width`` columns."""
    before: Mapping[str, Any] = result.get("before") or {}
    after: Mapping[str, Any] = result.get("after") or {}
    speed: Mapping[str, Any] = result.get("speedup") or {}
    found: Mapping[str, Any] = result.get("findings") or {}
    out: list[str] = []

    def emit(text: str, indent: str = "", cont: str = "    ") -> None:
        out.extend(wrap(text, width=width, indent=indent, cont=indent + cont))

    emit(_headline(before, after, speed, found))
    emit(f"Before: {before.get('source')} ({_side_facts(before)})")
    emit(f"After:  {after.get('source')} ({_side_facts(after)})")
    out.append("")

    b_step, a_step = before.get("step_s"), after.get("step_s")
    measured = speed.get("measured")
    if is_number(b_step) and is_number(a_step) and is_number(measured):
        basis = (
            "slowest rank's median"
            if speed.get("step_basis") == MEDIAN_STEP
            else "slowest rank, over its steps"
        )
        emit(
            f"Measured speed-up: {measured:.2f}x ({fmt_ms(b_step)} ms -> {fmt_ms(a_step)} ms per "
            f"step, {basis})"
        )
    else:
        emit("Measured speed-up: - (a run has no timed steps)")
    predicted = speed.get("predicted")
    by = speed.get("predicted_by")
    if is_number(predicted) and isinstance(by, Mapping):
        line = f"Predicted by BEFORE's verdict: {predicted:.2f}x ({by.get('kind')}"
        if by.get("ranks"):
            line += f" on {ranks_text(by['ranks'])}"
        line += ")"
        span = speed.get("predicted_range")
        if span:
            line += f", range {span[0]:.2f}-{span[1]:.2f}x"
        if is_number(measured) and predicted > 0:
            line += f"; measured is {measured / predicted:.0%} of it"
            line += _inside_text(speed.get("inside_range"))
        emit(line)
    else:
        emit("Predicted by BEFORE's verdict: none (no finding there predicts one)")
    ratio = speed.get("throughput_ratio")
    b_rate, a_rate = before.get("samples_per_s"), after.get("samples_per_s")
    if is_number(ratio) and is_number(b_rate) and is_number(a_rate):
        emit(f"Throughput: {b_rate:.0f} -> {a_rate:.0f} samples/s, all ranks ({ratio:.2f}x)")

    outcomes = result.get("per_finding") or ()
    if outcomes:
        out.append("")
        out.append("Per finding of BEFORE, predicted beside achieved (the job's step):")
        for f in outcomes:
            emit(_outcome_text(f), indent="  ", cont="    ")
            fixes = "; ".join(_fix_text(x) for x in f.get("fixes") or ())
            if fixes:
                emit(fixes, indent="    ", cont="  ")

    out.append("")
    out.append("Findings:")
    any_finding = False
    for label, key in (("gone", "gone"), ("new", "new"), ("remains", "remain")):
        for f in found.get(key) or ():
            any_finding = True
            sev = str(f.get("severity"))
            if key == "remain":
                sev = severity_change(f.get("severity_before"), sev)
            who = f" {ranks_text(f['ranks'])}" if f.get("ranks") else ""
            emit(f"{label:<8}{f.get('kind')}{who} ({sev})", indent="  ", cont="          ")
    if not any_finding:
        out.append("  none in either run")

    changes = [(r["rank"], c) for r in result.get("ranks") or () for c in r.get("changed") or ()]
    if changes:
        out.append("")
        out.append("Changed between the runs:")
        for rank, change in changes:
            emit(f"rank {rank}: {change}", indent="  ", cont="      ")

    rows = _share_rows(result.get("ranks") or ())
    if rows:
        out.append("")
        out.append("Per rank (median step, and each phase's share of it):")
        titles = ("rank", "run", "step ms", *(t for t, _ in SHARES))
        out.extend("  " + line[: width - 2] for line in table(titles, rows, left={1}))
        out.append("  bwd: backward apart from the wait; wait: at the all-reduce.")
    return "\n".join(out)


def _headline(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    speed: Mapping[str, Any],
    found: Mapping[str, Any],
) -> str:
    measured = speed.get("measured")
    if is_number(measured):
        if measured >= 1.02:
            head = f"Compare: {measured:.1f}x faster per step"
        elif measured <= 0.98:
            head = f"Compare: {1 / measured:.1f}x slower per step"
        else:
            head = "Compare: the same step time"
    else:
        head = "Compare: step times not comparable"
    gone = [f for f in found.get("gone") or () if _sev_level(f.get("severity")) >= 1]
    new = [f for f in found.get("new") or () if _sev_level(f.get("severity")) >= 1]
    if gone:
        head += "; gone: " + ", ".join(_short(f) for f in gone)
    if new:
        head += "; new: " + ", ".join(_short(f) for f in new)
    if not gone and not new:
        remain = [f for f in found.get("remain") or () if _sev_level(f.get("severity")) >= 1]
        head += "; findings unchanged" if remain else "; no warning in either run"
    return head


def _outcome_text(f: Mapping[str, Any]) -> str:
    who = f" {ranks_text(f['ranks'])}" if f.get("ranks") else ""
    fate = "gone" if f.get("after") == "gone" else f"remains, {f.get('after')}"
    predicted, achieved = f.get("predicted"), f.get("achieved")
    said = f"predicted {predicted:.2f}x" if is_number(predicted) else "no prediction"
    span = f.get("range")
    if span and is_number(predicted):
        said += f" ({span[0]:.2f}-{span[1]:.2f}x)"
    got = f"achieved {achieved:.2f}x" if is_number(achieved) else "achieved -"
    if is_number(achieved) and is_number(predicted) and predicted > 0:
        got += f" ({achieved / predicted:.0%} of it"  # as the headline's share is worked out
        got += _inside_text(f.get("inside_range")) + ")"
    return f"{f.get('kind')}{who} ({f.get('severity')}; {fate} in AFTER): {said}, {got}"


def _span(span: tuple[float, float] | None) -> list[float] | None:
    return None if span is None else [round(span[0], 3), round(span[1], 3)]


def _inside(measured: float | None, span: tuple[float, float] | None) -> bool | None:
    """Whether the achieved speed-up fell inside the predicted range (None: either missing);
    both as the document gives them, rounded."""
    if measured is None or span is None:
        return None
    got, (lo, hi) = round(measured, 3), _span(span) or (0.0, 0.0)
    return lo <= got <= hi


def _inside_text(inside: object) -> str:
    if inside is None:
        return ""
    return ", inside the range" if inside else ", outside the range"


_STATES = {
    "applied": "applied by --apply",
    "in_effect": "in effect in AFTER",
    "unknown": "AFTER shows no loader",
    "not_checked": "a code change, not checked",
}


def _fix_text(x: Mapping[str, Any]) -> str:
    who = f"rank {x['rank']} " if x.get("rank") is not None else ""
    current, proposed = x.get("current"), x.get("proposed")
    change = str(x.get("lever"))
    if proposed is not None:
        change += (
            f" {setting(current)} -> {setting(proposed)}"
            if current is not None
            else (f" -> {setting(proposed)}")
        )
    state = str(x.get("state"))
    if state == "applied" and x.get("after_value") != proposed:
        how = f"applied by --apply as {setting(x.get('after_value'))}"
    elif state == "other":
        how = f"not in effect: AFTER has {setting(x.get('after_value'))}"
    else:
        how = _STATES.get(state, state)
    return f"{who}{change}: {how}"


def _short(f: Mapping[str, Any]) -> str:
    ranks = f.get("ranks") or []
    return f"{f.get('kind')}" + (f" ({ranks_text(ranks)})" if ranks else "")


def _side_facts(side: Mapping[str, Any]) -> str:
    parts = [f"job {side.get('job') or '-'}"]
    n = side.get("world_size")
    if n:
        parts.append(f"{n} rank{'' if n == 1 else 's'}")
    if side.get("kind"):
        parts.append(str(side["kind"]))
    return ", ".join(parts)


def _share_rows(ranks: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for r in ranks:
        for label in ("before", "after"):
            side = r.get(label)
            if not isinstance(side, Mapping):
                rows.append([str(r.get("rank")), label, "-", *(["-"] * len(SHARES))])
                continue
            shares = side.get("shares") or {}
            cells = [
                str(r.get("rank")),
                label,
                fmt_ms(side.get("step_s")),
                *(fmt_share(shares.get(name)) for _, name in SHARES),
            ]
            rows.append(cells)
    return rows


# --------------------------------------------------------------------------------------------
# document parts


def _side(
    report: Report,
    source: str,
    step: float | None,
    step_rank: int | None,
    rate: float | None,
) -> dict[str, Any]:
    job = report.job
    return {
        "source": source,
        "job": job.name,
        "world_size": job.world_size or len(report.ranks) or None,
        "kind": job.parallel_mode if job.parallel_mode != "none" else None,
        "step_s": _round(step, 6),
        "step_rank": step_rank,
        "samples_per_s": _round(rate, 2),
        "findings": len(report.findings),
    }


def _rank_side(r: RankEntry | None) -> dict[str, Any] | None:
    if r is None:
        return None
    step = r.step_s
    shares: dict[str, float | None] = {name: None for _, name in SHARES}
    if is_number(step) and step > 0:
        parts = {
            "data_wait": _val(r.data_wait_s),
            "h2d": _val(r.h2d_s),
            "forward": _val(r.forward_s),
            "backward_own": _val(r.backward_s),  # exclusive: no collective wait in it
            "optimizer": _val(r.optimizer_s),
            "collective_wait": _val(r.collective_wait_s),
        }
        parts["other"] = max(0.0, float(step) - sum(parts.values()))
        shares = {k: _round(v / float(step), 4) for k, v in parts.items()}
        if r.collective_wait_s is None:
            shares["collective_wait"] = None
    return {
        "step_s": step,
        "shares": shares,
        "samples_per_s": r.samples_per_s,
        "batch_size": r.batch_size,
    }


def _loader_changes(b: RankEntry | None, a: RankEntry | None) -> list[str]:
    if b is None:
        return ["only in AFTER"]
    if a is None:
        return ["only in BEFORE"]
    out = []
    bl = b.loader or {}
    al = a.loader or {}
    for key in LOADER_KEYS:
        if key in bl and key in al and bl[key] != al[key]:
            out.append(f"{key} {fmt_setting(bl[key])} -> {fmt_setting(al[key])}")
    bb, ab = b.batch_size, a.batch_size
    if bb != ab and bb is not None and ab is not None and "batch_size" not in " ".join(out):
        out.append(f"batch {fmt_setting(bb)} -> {fmt_setting(ab)}")
    return out


def _throughput(report: Report, *, paced: bool) -> float | None:
    """Samples a second, all ranks: each rank's batch over its step (its pace over the run where
    ``paced``, else its median's rate)."""
    if not paced:
        rates = [float(r.samples_per_s) for r in report.ranks if is_number(r.samples_per_s)]
        return sum(rates) if rates else None
    rates = [
        float(r.batch_size) / pace
        for r in report.ranks
        if is_number(r.batch_size) and (pace := _pace(r))
    ]
    return sum(rates) if rates else None


def _ranks(report: Report) -> dict[int, RankEntry]:
    return {r.rank: r for r in report.ranks if isinstance(r.rank, int)}


def _sev_level(sev: Any) -> int:
    """Findings at warning or above count in the headline (1), the rest not (0)."""
    return 1 if severity_key(sev) <= severity_key("warning") else 0


def _val(value: Any) -> float:
    return float(value) if is_number(value) else 0.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)
