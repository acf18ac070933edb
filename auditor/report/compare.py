"""Two runs side by side: did the fix work, and as well as the verdict said it would?

Pure: two ``auditor.report/v1`` documents in, a comparison document out (schema
``auditor.compare/v1``), and its text at 80 columns. Loading files (reports or recordings) is the
command's business (:mod:`auditor.report.commands`).

The measured speed-up is the BEFORE run's median step time over the AFTER run's, each taken on
its slowest rank: under DDP every rank's step ends at the same all-reduce, so the slowest rank's
median is the job's step. The predicted one is the largest ``predicted_speedup`` among BEFORE's
warning and critical findings: what its verdict promised for its own fixes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from auditor.analysis.findings import SEVERITIES, severity_rank
from auditor.report.terminal import VERDICT_WIDTH, fmt_ms, ranks_text, table, wrap

SCHEMA = "auditor.compare/v1"

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
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    *,
    before_source: str = "before",
    after_source: str = "after",
) -> dict[str, Any]:
    """The comparison document of two reports (plain JSON types)."""
    b_step, b_rank = job_step(before)
    a_step, a_rank = job_step(after)
    measured = b_step / a_step if b_step and a_step else None
    predictor = predicting_finding(before)
    predicted = _speed(predictor) if predictor is not None else None
    b_ranks = _ranks(before)
    a_ranks = _ranks(after)
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
    gone, new, remain = diff_findings(before.get("findings") or (), after.get("findings") or ())
    b_rate = _throughput(before)
    a_rate = _throughput(after)
    return {
        "schema": SCHEMA,
        "before": _side(before, before_source, b_step, b_rank, b_rate),
        "after": _side(after, after_source, a_step, a_rank, a_rate),
        "speedup": {
            "measured": _round(measured, 3),
            "predicted": _round(predicted, 3),
            "predicted_by": (
                None
                if predictor is None
                else {
                    "kind": predictor.get("kind"),
                    "ranks": [int(x) for x in predictor.get("ranks") or ()],
                    "severity": predictor.get("severity"),
                }
            ),
            "throughput_ratio": _round(a_rate / b_rate, 3) if a_rate and b_rate else None,
        },
        "ranks": ranks,
        "findings": {"gone": gone, "new": new, "remain": remain},
    }


def job_step(report: Mapping[str, Any]) -> tuple[float | None, int | None]:
    """The job's median step (seconds) and the rank it comes from: the slowest timed rank."""
    best: tuple[float, int] | None = None
    for r in report.get("ranks") or ():
        if not isinstance(r, Mapping):
            continue
        step = r.get("step_s")
        if _is_num(step) and step > 0 and (best is None or step > best[0]):
            best = (float(step), int(r.get("rank", 0)))
    return (best[0], best[1]) if best else (None, None)


def predicting_finding(report: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The warning/critical finding with the largest predicted speed-up (None if none has one)."""
    best: Mapping[str, Any] | None = None
    for f in report.get("findings") or ():
        if not isinstance(f, Mapping) or _level(f) < SEVERITIES.index("warning"):
            continue
        if _speed(f) is None:
            continue
        if best is None or (_speed(f) or 0.0) > (_speed(best) or 0.0):
            best = f
    return best


def diff_findings(
    before: Sequence[Any], after: Sequence[Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Findings matched by kind and blamed ranks: (gone, new, remain), most severe first."""

    def index(fs: Sequence[Any]) -> dict[tuple[str, tuple[int, ...]], Mapping[str, Any]]:
        out: dict[tuple[str, tuple[int, ...]], Mapping[str, Any]] = {}
        for f in fs:
            if isinstance(f, Mapping) and "kind" in f:
                key = (str(f["kind"]), tuple(sorted(int(r) for r in f.get("ranks") or ())))
                if key not in out or _level(f) > _level(out[key]):
                    out[key] = f
        return out

    b, a = index(before), index(after)

    def entry(key: tuple[str, tuple[int, ...]], f: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "kind": key[0],
            "ranks": list(key[1]),
            "severity": f.get("severity"),
            "summary": f.get("summary"),
            "predicted_speedup": f.get("predicted_speedup"),
        }

    gone = [entry(k, f) for k, f in b.items() if k not in a]
    new = [entry(k, f) for k, f in a.items() if k not in b]
    remain = []
    for k, f in b.items():
        if k in a:
            e = entry(k, a[k])
            e["severity_before"] = f.get("severity")
            remain.append(e)

    def order(e: Mapping[str, Any]) -> tuple[int, str, list[int]]:
        sev = e.get("severity_before", e.get("severity"))
        lvl = severity_rank(sev)
        return (-lvl, str(e["kind"]), list(e["ranks"]))

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
    if _is_num(b_step) and _is_num(a_step) and _is_num(measured):
        emit(
            f"Measured speed-up: {measured:.2f}x ({fmt_ms(b_step)} ms -> {fmt_ms(a_step)} ms per "
            "step, slowest rank's median)"
        )
    else:
        emit("Measured speed-up: - (a run has no timed steps)")
    predicted = speed.get("predicted")
    by = speed.get("predicted_by")
    if _is_num(predicted) and isinstance(by, Mapping):
        line = f"Predicted by BEFORE's verdict: {predicted:.2f}x ({by.get('kind')}"
        if by.get("ranks"):
            line += f" on {ranks_text(by['ranks'])}"
        line += ")"
        if _is_num(measured) and predicted > 0:
            line += f"; measured is {measured / predicted:.0%} of it"
        emit(line)
    else:
        emit("Predicted by BEFORE's verdict: none (no finding there predicts one)")
    ratio = speed.get("throughput_ratio")
    b_rate, a_rate = before.get("samples_per_s"), after.get("samples_per_s")
    if _is_num(ratio) and _is_num(b_rate) and _is_num(a_rate):
        emit(f"Throughput: {b_rate:.0f} -> {a_rate:.0f} samples/s, all ranks ({ratio:.2f}x)")

    out.append("")
    out.append("Findings:")
    any_finding = False
    for label, key in (("gone", "gone"), ("new", "new"), ("remains", "remain")):
        for f in found.get(key) or ():
            any_finding = True
            sev = str(f.get("severity"))
            if key == "remain" and f.get("severity_before") != f.get("severity"):
                sev = f"{f.get('severity_before')} -> {sev}"
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
    if _is_num(measured):
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
                *(_pct(shares.get(name)) for _, name in SHARES),
            ]
            rows.append(cells)
    return rows


# --------------------------------------------------------------------------------------------
# document parts


def _side(
    report: Mapping[str, Any],
    source: str,
    step: float | None,
    step_rank: int | None,
    rate: float | None,
) -> dict[str, Any]:
    job: Mapping[str, Any] = report.get("job") or {}
    return {
        "source": source,
        "job": job.get("name"),
        "world_size": job.get("world_size") or len(report.get("ranks") or ()) or None,
        "kind": job.get("parallel_mode") if job.get("parallel_mode") != "none" else None,
        "step_s": _round(step, 6),
        "step_rank": step_rank,
        "samples_per_s": _round(rate, 2),
        "findings": len(report.get("findings") or ()),
    }


def _rank_side(r: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if r is None:
        return None
    step = r.get("step_s")
    shares: dict[str, float | None] = {name: None for _, name in SHARES}
    if _is_num(step) and step > 0:
        wait = _val(r.get("collective_wait_s"))
        parts = {
            "data_wait": _val(r.get("data_wait_s")),
            "h2d": _val(r.get("h2d_s")),
            "forward": _val(r.get("forward_s")),
            "backward_own": _val(r.get("backward_s")),  # exclusive: no collective wait in it
            "optimizer": _val(r.get("optimizer_s")),
            "collective_wait": wait,
        }
        parts["other"] = max(0.0, float(step) - sum(parts.values()))
        shares = {k: _round(v / float(step), 4) for k, v in parts.items()}
        if r.get("collective_wait_s") is None:
            shares["collective_wait"] = None
    return {
        "step_s": step,
        "shares": shares,
        "samples_per_s": r.get("samples_per_s"),
        "batch_size": r.get("batch_size"),
    }


def _loader_changes(b: Mapping[str, Any] | None, a: Mapping[str, Any] | None) -> list[str]:
    if b is None:
        return ["only in AFTER"]
    if a is None:
        return ["only in BEFORE"]
    out = []
    bl = b.get("loader") if isinstance(b.get("loader"), Mapping) else {}
    al = a.get("loader") if isinstance(a.get("loader"), Mapping) else {}
    assert isinstance(bl, Mapping) and isinstance(al, Mapping)
    for key in LOADER_KEYS:
        if key in bl and key in al and bl[key] != al[key]:
            out.append(f"{key} {_show(bl[key])} -> {_show(al[key])}")
    bb, ab = b.get("batch_size"), a.get("batch_size")
    if bb != ab and bb is not None and ab is not None and "batch_size" not in " ".join(out):
        out.append(f"batch {_show(b['batch_size'])} -> {_show(a['batch_size'])}")
    return out


def _throughput(report: Mapping[str, Any]) -> float | None:
    rates = [
        float(r["samples_per_s"])
        for r in report.get("ranks") or ()
        if isinstance(r, Mapping) and _is_num(r.get("samples_per_s"))
    ]
    return sum(rates) if rates else None


def _ranks(report: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {
        int(r["rank"]): r
        for r in report.get("ranks") or ()
        if isinstance(r, Mapping) and isinstance(r.get("rank"), int)
    }


def _level(f: Mapping[str, Any]) -> int:
    return _sev_level(f.get("severity"))


def _sev_level(sev: Any) -> int:
    return severity_rank(sev)


def _speed(f: Mapping[str, Any]) -> float | None:
    s = f.get("predicted_speedup")
    return float(s) if _is_num(s) else None


def _is_num(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _val(value: Any) -> float:
    return float(value) if _is_num(value) else 0.0


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(float(value), digits)


def _pct(value: Any) -> str:
    return "-" if not _is_num(value) else f"{value * 100:.0f}%"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "-" if value is None else str(value)
