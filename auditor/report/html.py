"""The HTML report: one self-contained file that opens offline, built from the JSON report.

Everything the page needs is inside it: the styles (``page.css``), the data, the script that
draws the plots (``page.js``) and the plotly.js bundle that ships with the ``plotly`` package
(inlined once). It fetches nothing when viewed: no CDN, no web font, no image. Top to bottom:

* the verdict and the fixes per rank (the same text as the terminal verdict);
* the plots of :mod:`auditor.report.figures`: each rank's step breakdown beside its memory budget,
  step time over the run, GPU busy time and memory, DataLoader worker CPU;
* the evidence behind each finding, the per-rank table and the notes.

The time series come from a :class:`Snapshot` of the whole run (the live run's store, or a
recording); without one (an HTML page made from a JSON report alone) those plots are left out
and the page says so.

After plotly has drawn every plot, the page writes what it rendered (trace names and point
counts per plot) into the hidden ``#auditor-render-status`` element, so a headless browser's
``--dump-dom`` shows that the plots really rendered.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from functools import cache
from importlib import resources
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs, get_plotlyjs_version

from auditor.analysis.findings import SEVERITY_ORDER, severity_key
from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.files import write_text_atomic
from auditor.report.columns import FIGURE_COLUMNS, cells, titles
from auditor.report.figures import page_figures
from auditor.report.model import (
    JobSummary,
    RankEntry,
    Report,
    ReportFinding,
    ReportLike,
    as_report,
)
from auditor.report.terminal import (
    fix_answers,
    fix_given,
    render_verdict,
)
from auditor.report.terminal import fixes_by_rank as fixes_by_rank
from auditor.report.time_account import lead_line
from auditor.report.work import (
    WORK_TITLES,
    gap_rows,
    mfu_cell,
    work_line,
    work_notes,
    work_rows,
)
from auditor.wording import (
    MISSING,
    fmt_cores,
    fmt_count,
    fmt_duration,
    fmt_mib,
    fmt_predicted,
    is_number,
    ranks_text,
    speedup_worth_naming,
)

_CONFIG = {"displaylogo": False, "responsive": True, "showLink": False}


# --------------------------------------------------------------------------------------------
# entry points


def write_html_for_run(path: str, report: ReportLike, store: SampleStore) -> None:
    """The HTML page of a finished ``auditor run``: its report plus the store's whole run."""
    write_html(path, report, series=series_snapshot(store))


def series_snapshot(store: SampleStore) -> Snapshot | None:
    """Everything the store holds, as one snapshot (None if it holds no sample at all)."""
    now = store.latest_time()
    if now is None:
        return None
    return store.snapshot(now, None)


def write_html(
    path: str | os.PathLike[str],
    report: ReportLike,
    *,
    series: Snapshot | None,
    source: str = "",
    problems: Sequence[str] = (),
) -> None:
    """Write the page atomically (temp file in the same folder, then rename)."""
    write_text_atomic(path, render_html(report, series=series, source=source, problems=problems))


def render_html(
    report: ReportLike,
    *,
    series: Snapshot | None = None,
    source: str = "",
    problems: Sequence[str] = (),
) -> str:
    """The whole page as one string (a JSON document is read as a report first)."""
    rep = as_report(report)
    job = rep.job
    ranks = rep.sorted_ranks
    findings = rep.sorted_findings
    verdict_text = render_verdict(rep)
    headline, severity = _headline(verdict_text, findings)
    figures = page_figures(ranks, series)

    payload = [
        {"id": f"plot-{key}", "figure": json.loads(pio.to_json(fig, validate=True))}
        for key, _title, fig, _missing in figures
        if fig is not None
    ]
    sections = {
        key: _plot_section(key, title, fig is not None, missing)
        for key, title, fig, missing in figures
    }
    if "memory-budget" in sections:
        # The memory bar beside the step breakdown: each rank's time and memory side by side.
        pair = sections.pop("breakdown") + sections.pop("memory-budget")
        sections = {"pair": f'<div class="pair">{pair}</div>', **sections}
    plot_sections = "\n".join(sections.values())
    title = f"Auditor report: {job.name or 'job'}"
    generated = str(rep.generated_at or "")
    made = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_css()}</style>",
        # The bundled plotly.js, inline: the page must open without a network.
        f'<script id="plotlyjs">{get_plotlyjs()}</script>',
        "</head>",
        "<body>",
        "<main>",
        _verdict_section(headline, severity, job, ranks, findings, verdict_text),
        plot_sections,
        _findings_section(findings),
        _ranks_section(ranks),
        _work_section(job, ranks),
        _notes_section(rep, problems),
        '<footer class="muted">',
        f"Report {_e(rep.schema)} generated {_e(generated)}",
        f"{'from ' + _e(source) + ' ' if source else ''}- page made {_e(made)} by GPU Balance "
        f"Auditor with plotly.js {_e(get_plotlyjs_version())} embedded; it opens offline.",
        "</footer>",
        "</main>",
        '<div id="auditor-render-status" hidden data-rendered="0" data-expected='
        f'"{len(payload)}"></div>',
        f'<script type="application/json" id="auditor-figures">{_script_json(payload)}</script>',
        f"<script>{_boot_js()}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------
# HTML sections


def _verdict_section(
    headline: str,
    severity: str,
    job: JobSummary,
    ranks: Sequence[RankEntry],
    findings: Sequence[ReportFinding],
    verdict_text: str,
) -> str:
    out = [f'<section id="verdict" class="verdict sev-{_e(severity)}">']
    out.append(f'<h1 id="verdict-headline">{_e(headline)}</h1>')
    facts = _run_facts(job, len(ranks))
    if facts:
        out.append(f'<p class="run">{_e(facts)}</p>')
    lead = lead_line(ranks)
    if lead:
        out.append(f'<p class="loss" id="largest-loss">{_e(lead)}</p>')
    work = work_line(job)
    if work:
        out.append(f'<p class="work" id="work">{_e(work)}</p>')
    fixes = fixes_by_rank(findings)
    if fixes:
        out.append('<h2>What to change, per rank</h2><ul class="fixes" id="fixes">')
        for rank, items in fixes:
            # Each fix once, with every finding it answers (two findings often name one fix).
            for fix, answered in items:
                sev = min((f.severity for f in answered), key=severity_key)
                tags = []
                for f in answered:
                    tag = f"{f.kind}, {f.severity}"
                    if speedup_worth_naming(f.predicted_speedup):
                        tag += (
                            f", predicted {fmt_predicted(f.predicted_speedup, f.predicted_range)}"
                        )
                    tags.append(tag)
                out.append(
                    f'<li class="sev-{_e(sev)}" data-rank="{rank}"><b>rank {rank}</b>: '
                    f'{_e(fix)} <span class="muted">({_e("; ".join(tags))})</span></li>'
                )
        out.append("</ul>")
    elif any(f.at_least("warning") for f in findings):
        out.append('<p class="muted">The findings carry no per-rank fix.</p>')
    out.append(
        '<details id="verdict-text"><summary>The verdict as the terminal prints it</summary>'
        f"<pre>{_e(verdict_text)}</pre></details>"
    )
    out.append("</section>")
    return "\n".join(out)


def _plot_section(key: str, title: str, present: bool, missing: str) -> str:
    body = (
        f'<div class="plot" id="plot-{_e(key)}"></div>'
        if present
        else f'<p class="muted missing" id="plot-{_e(key)}-missing">{_e(missing)}</p>'
    )
    return f'<section class="chart" id="section-{_e(key)}"><h2>{_e(title)}</h2>{body}</section>'


def _findings_section(findings: Sequence[ReportFinding]) -> str:
    out = ['<section id="findings"><h2>Findings and their evidence</h2>']
    answers = fix_answers(findings)
    given: dict[tuple[int, str], str] = {}
    if not findings:
        out.append('<p class="muted">No finding.</p>')
    for i, f in enumerate(findings):
        head = f"{f.kind} ({f.severity})"
        if f.ranks:
            head += f": {ranks_text(f.ranks)}"
        out.append(f'<article class="finding sev-{_e(f.severity)}" id="finding-{i}">')
        out.append(f"<h3>{_e(head)}</h3>")
        facts = []
        if is_number(f.predicted_speedup):
            facts.append(
                f"predicted speed-up {fmt_predicted(f.predicted_speedup, f.predicted_range, 2)}"
            )
        if f.cause:
            facts.append(f"caused by {f.cause}")
        if isinstance(f.evidence.get("since_step"), int):
            facts.append(f"since step {f.evidence['since_step']} (the run's latest segment)")
        if facts:
            out.append(f'<p class="muted">{_e("; ".join(facts))}</p>')
        if f.summary:
            out.append(f"<p>{_e(f.summary)}</p>")
        if f.unowned_fix:
            out.append(f"<ul><li><b>fix</b>: {_e(f.unowned_fix)}</li></ul>")
        if f.fixes:
            out.append("<ul>")
            for rank, fix in sorted(f.fixes.items()):
                text = _fix_once(rank, fix, f, answers, given)
                out.append(f"<li><b>rank {rank}</b>: {text}</li>")
            out.append("</ul>")
        rows = _flatten(f.evidence)
        if rows:
            out.append('<table class="evidence"><thead><tr><th>evidence</th><th>value</th>')
            out.append("</tr></thead><tbody>")
            for key, value in rows:
                out.append(f"<tr><td>{_e(key)}</td><td>{_e(value)}</td></tr>")
            out.append("</tbody></table>")
        out.append("</article>")
    out.append("</section>")
    return "\n".join(out)


def _fix_once(
    rank: int,
    fix: str,
    finding: ReportFinding,
    answers: Mapping[tuple[int, str], Sequence[str]],
    given: dict[tuple[int, str], str],
) -> str:
    """A finding's fix for one rank, as escaped HTML: the text the first time it is given (with
    the findings it answers where several give it), a pointer to that finding after."""
    earlier, kinds = fix_given(rank, fix, finding.kind, answers, given)
    if earlier is not None:
        return f'<span class="muted">the fix given under {_e(earlier)}, above</span>'
    text = _e(fix)
    if kinds:
        text += f' <span class="muted">(answers {_e(", ".join(kinds))})</span>'
    return text


def _ranks_section(ranks: Sequence[RankEntry]) -> str:
    head = (
        "rank",
        "host",
        "device",
        "steps",
        *titles(FIGURE_COLUMNS),
        "workers",
        "worker cpu",
        "rss MiB",
        "MFU",
    )
    out = ['<section id="ranks"><h2>Per rank (medians per step)</h2>']
    if not ranks:
        out.append('<p class="muted">No rank reported.</p></section>')
        return "\n".join(out)
    out.append("<table><thead><tr>")
    out.extend(f"<th>{_e(t)}</th>" for t in head)
    out.append("</tr></thead><tbody>")
    for r in ranks:
        configured = r.loader_workers
        worker_text = fmt_count(r.workers)
        if configured is not None:
            worker_text += f" (of {configured})"
        row = [
            str(r.rank),
            r.host or MISSING,
            r.device or MISSING,
            fmt_count(r.steps),
            *cells(r, FIGURE_COLUMNS),
            worker_text,
            fmt_cores(r.worker_cpu),
            fmt_mib(r.memory.rss_bytes),
            mfu_cell(r.mfu, r.flops_per_s),
        ]
        out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    unmeasured = [f"rank {r.rank}: {', '.join(r.unmeasured)}" for r in ranks if r.unmeasured]
    if unmeasured:
        out.append(f'<p class="muted">Not measured: {_e("; ".join(unmeasured))}</p>')
    out.append("</section>")
    return "\n".join(out)


def _work_section(job: JobSummary, ranks: Sequence[RankEntry]) -> str:
    """The work done: the job's MFU and where its gap goes, and each rank's counted FLOPs."""
    rows = work_rows(ranks)
    if not rows:
        return ""
    out = ['<section id="work-done"><h2>Work done (FLOPs counted on one step)</h2>']
    gap = gap_rows(job)
    if gap:
        out.append('<table id="mfu-gap"><thead><tr><th>where the time goes</th>')
        out.append("<th>share</th></tr></thead><tbody>")
        out.extend(f"<tr><td>{_e(a)}</td><td>{_e(b)}</td></tr>" for a, b in gap)
        out.append("</tbody></table>")
    out.append('<table id="work-ranks"><thead><tr>')
    out.extend(f"<th>{_e(t)}</th>" for t in WORK_TITLES)
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    for note in work_notes(job, ranks):
        out.append(f'<p class="muted">{_e(note)}</p>')
    out.append("</section>")
    return "\n".join(out)


def _notes_section(report: Report, problems: Sequence[str]) -> str:
    if not report.notes and not problems:
        return ""
    out = ['<section id="notes"><h2>Notes</h2><ul>']
    out.extend(f"<li>{_e(n)}</li>" for n in report.notes)
    out.extend(f'<li class="problem">skipped: {_e(p)}</li>' for p in problems)
    out.append("</ul></section>")
    return "\n".join(out)


def _headline(verdict_text: str, findings: Sequence[ReportFinding]) -> tuple[str, str]:
    """The verdict's first sentence (unwrapped) and the severity class of the page."""
    lines = verdict_text.splitlines()
    head = [lines[0]] if lines else ["Verdict: -"]
    for line in lines[1:]:
        if not line.startswith("    "):
            break
        head.append(line.strip())
    top = min((f.severity_key for f in findings), default=len(SEVERITY_ORDER))
    warned = top <= severity_key("warning")
    severity = SEVERITY_ORDER[top] if warned else "ok"
    if "balanced" not in head[0] and not warned:
        severity = "info"
    return " ".join(head), severity


def _run_facts(job: JobSummary, n_ranks: int) -> str:
    parts = []
    if job.name:
        parts.append(f"job {job.name}")
    world = job.world_size or n_ranks
    if world:
        parts.append(f"{world} rank{'' if world == 1 else 's'}")
    if job.parallel_mode and job.parallel_mode != "none":
        parts.append(str(job.parallel_mode))
    if job.hosts:
        parts.append(f"{len(job.hosts)} host{'' if len(job.hosts) == 1 else 's'}")
    if is_number(job.duration_s):
        parts.append(f"ran {fmt_duration(float(job.duration_s))}")
    if isinstance(job.exit_code, int):
        parts.append(f"exit code {job.exit_code}")
    return "Run: " + ", ".join(parts) if parts else ""


# --------------------------------------------------------------------------------------------
# helpers


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested evidence as ``a.b.c -> value`` rows (lists of scalars stay on one row)."""
    if isinstance(value, Mapping):
        rows: list[tuple[str, str]] = []
        for k, v in value.items():
            rows.extend(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return rows
    if isinstance(value, (list, tuple)) and any(isinstance(v, (Mapping, list)) for v in value):
        rows = []
        for i, v in enumerate(value):
            rows.extend(_flatten(v, f"{prefix}[{i}]"))
        return rows
    if isinstance(value, (list, tuple)):
        text = ", ".join(_scalar(v) for v in value)
    else:
        text = _scalar(value)
    return [(prefix or "value", text)]


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element (no closing tag or comment opener can appear)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


# --------------------------------------------------------------------------------------------
# the page's styles and script (package data beside this module)


@cache
def _asset(name: str) -> str:
    return resources.files("auditor.report").joinpath(name).read_text(encoding="utf-8")


def _css() -> str:
    return "\n" + _asset("page.css")


def _boot_js() -> str:
    """Draws every figure, then records what was drawn in #auditor-render-status."""
    return "\n" + _asset("page.js").replace("__CONFIG__", json.dumps(_CONFIG))
