"""The HTML report: one self-contained file that opens offline, built from the JSON report.

Everything the page needs is inside it: the styles, the data, and the plotly.js bundle that
ships with the ``plotly`` package (inlined once). It fetches nothing when viewed: no CDN, no web
font, no image. Top to bottom:

* the verdict and the fixes per rank (the same text as the terminal verdict);
* a stacked bar of each rank's step: data wait, h2d, forward, backward apart from the wait at the
  all-reduce, optimizer, the collective wait itself (medians, from the report); beside it, where
  the ranks measured their memory budget, a stacked bar of each rank's memory by part
  (parameters, gradients, optimizer state, buffers, modules outside the model, activations at
  the rank's batch) against what the rank may use (its GPU's total, or its share of the host's
  available memory);
* each rank's step time over the run;
* a GPU-by-time heatmap of busy time and a memory chart per GPU, where GPUs were seen;
* DataLoader worker CPU per rank;
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
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs, get_plotlyjs_version
from plotly.subplots import make_subplots

from auditor.analysis.findings import SEVERITY_ORDER, severity_key
from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.files import write_text_atomic
from auditor.report.columns import FIGURE_COLUMNS, cells, titles
from auditor.report.model import (
    BudgetEntry,
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
from auditor.samples import DeviceSample
from auditor.wording import (
    MISSING,
    fmt_bytes,
    fmt_cores,
    fmt_count,
    fmt_duration,
    fmt_mib,
    fmt_speedup,
    is_number,
    ranks_text,
    speedup_worth_naming,
)
from auditor.wording import finite_or_zero as _num

# The step breakdown, in step order (labels of the stacked bar).
BREAKDOWN = (
    "data wait",
    "h2d",
    "forward",
    "backward (own work)",
    "optimizer",
    "collective wait",
)
_PHASE_COLORS = {
    "data wait": "#d62728",
    "h2d": "#9467bd",
    "forward": "#1f77b4",
    "backward (own work)": "#2ca02c",
    "optimizer": "#8c564b",
    "collective wait": "#bcbd22",
    "other": "#c7c7c7",
}
# The measured memory budget by part (labels of the stacked bar) and the report's field for each.
MEMORY_PARTS = (
    ("parameters", "param_bytes"),
    ("gradients", "grad_bytes"),
    ("optimizer state", "optimizer_bytes"),
    ("buffers", "buffer_bytes"),
    ("other modules", "other_module_bytes"),
    ("activations", "activation_bytes_per_step"),
)
_MEMORY_COLORS = {
    "parameters": "#1f77b4",
    "gradients": "#2ca02c",
    "optimizer state": "#ff7f0e",
    "buffers": "#9467bd",
    "other modules": "#e377c2",
    "activations": "#17becf",
}
# The limit marker is drawn (not only listed in the legend) where some rank's bar reaches this
# share of its limit; below it the bars would be slivers under an axis sized for the limit.
LIMIT_SHOWN_FROM = 0.2
# Most points one trace carries; longer series are thinned to bucket medians.
MAX_POINTS = 2_000
# Most time columns in the GPU heatmap.
MAX_HEAT_COLUMNS = 240
FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial, sans-serif"
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

    figures: list[tuple[str, str, go.Figure | None, str]] = []
    figures.append(
        (
            "breakdown",
            "Step breakdown per rank (median ms per step)",
            breakdown_figure(ranks),
            "No rank has timed steps.",
        )
    )
    memory = memory_figure(ranks)
    if memory is not None:  # only where the ranks measured their budget
        figures.append(
            ("memory-budget", "Memory per rank (measured budget)", memory, "No budget measured.")
        )
    no_series = "Not available: this page was made from a JSON report without its samples."
    figures.append(
        (
            "step-time",
            "Step time per rank over the run",
            step_time_figure(series) if series else None,
            no_series if series is None else "No steps were measured.",
        )
    )
    figures.append(
        (
            "gpu-busy",
            "GPU busy time (NVML utilisation) over the run",
            gpu_busy_figure(series) if series else None,
            no_series if series is None else "No GPU was seen (a CPU run, or NVML unavailable).",
        )
    )
    figures.append(
        (
            "gpu-memory",
            "GPU memory over the run",
            gpu_memory_figure(series) if series else None,
            no_series if series is None else "No GPU memory was measured.",
        )
    )
    figures.append(
        (
            "worker-cpu",
            "DataLoader worker CPU per rank (cores)",
            worker_cpu_figure(series) if series else None,
            no_series if series is None else "No DataLoader worker CPU was measured.",
        )
    )

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
        f"<style>{_CSS}</style>",
        # The bundled plotly.js, inline: the page must open without a network.
        f'<script id="plotlyjs">{get_plotlyjs()}</script>',
        "</head>",
        "<body>",
        "<main>",
        _verdict_section(headline, severity, job, ranks, findings, verdict_text),
        plot_sections,
        _findings_section(findings),
        _ranks_section(ranks),
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
        f"<script>{_BOOT_JS}</script>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------------------------
# figures


def breakdown_figure(ranks: Sequence[RankEntry]) -> go.Figure | None:
    """Stacked bar per rank: the step's phases in ms (medians; 'other' is what they leave)."""
    timed = [r for r in ranks if _num(r.step_s)]
    if not timed:
        return None
    labels = [f"rank {r.rank}" for r in timed]
    values: dict[str, list[float]] = {name: [] for name in (*BREAKDOWN, "other")}
    for r in timed:
        parts = breakdown_ms(r)
        for name in values:
            values[name].append(parts[name])
    fig = go.Figure()
    for name, ys in values.items():
        if name == "other" and not any(y > 0.05 for y in ys):
            continue
        fig.add_trace(
            go.Bar(
                name=name,
                x=labels,
                y=[round(y, 3) for y in ys],
                marker_color=_PHASE_COLORS[name],
                hovertemplate="%{x}: " + name + " %{y:.1f} ms<extra></extra>",
            )
        )
    steps = [round(_num(r.step_s) * 1e3, 3) for r in timed]
    fig.add_trace(
        go.Scatter(
            name="step (median)",
            x=labels,
            y=steps,
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 28, "color": "#222", "line": {"width": 2}},
            hovertemplate="%{x}: step %{y:.1f} ms<extra></extra>",
        )
    )
    fig.update_layout(barmode="stack", yaxis_title="ms per step")
    _style(fig, height=400)
    # Below the bars, clear of the mode bar (the x axis has no title to collide with).
    fig.update_layout(legend={"y": -0.08, "yanchor": "top", "traceorder": "normal"})
    return fig


def breakdown_ms(rank: RankEntry) -> dict[str, float]:
    """One report rank entry's step split into the breakdown's parts, in ms (0 if unmeasured)."""
    parts = {
        "data wait": _num(rank.data_wait_s),
        "h2d": _num(rank.h2d_s),
        "forward": _num(rank.forward_s),
        # exclusive: the collective wait is not in it
        "backward (own work)": _num(rank.backward_s),
        "optimizer": _num(rank.optimizer_s),
        "collective wait": _num(rank.collective_wait_s),
    }
    step = _num(rank.step_s)
    parts["other"] = max(0.0, step - sum(parts.values()))
    return {k: v * 1e3 for k, v in parts.items()}


def memory_figure(ranks: Sequence[RankEntry]) -> go.Figure | None:
    """Stacked bar per rank: its measured memory budget by part, with the rank's limit.

    None where no rank sent a budget. Activations are at the rank's median batch (activations
    per sample x batch, as the memory rules count them), else the sampled forward's own batch.
    The limit (the GPU's total, or on a CPU job the host's available memory over its ranks) is a
    marker per rank, listed in the legend but hidden where every bar is under
    :data:`LIMIT_SHOWN_FROM` of it; each bar's total and its share of the limit are written
    above it either way.
    """
    rows = [(r, r.budget) for r in ranks if r.budget is not None]
    if not rows:
        return None
    parts = [memory_parts(r, b) for r, b in rows]
    totals = [sum(p.values()) for p in parts]
    limits = [budget_limit(b) for _, b in rows]
    unit, size = ("GiB", float(1 << 30))
    biggest = max([*totals, *(lim for lim, _ in limits if lim is not None)], default=0.0)
    if biggest < (1 << 30):
        unit, size = ("MiB", float(1 << 20))
    labels = [f"rank {r.rank}" for r, _ in rows]
    fig = go.Figure()
    for name, _key in MEMORY_PARTS:
        ys = [p[name] for p in parts]
        if name == "other modules" and not any(ys):
            continue
        fig.add_trace(
            go.Bar(
                name=name,
                x=labels,
                y=[round(y / size, 4) for y in ys],
                customdata=[fmt_bytes(y) for y in ys],
                marker_color=_MEMORY_COLORS[name],
                hovertemplate="%{x}: " + name + " %{customdata}<extra></extra>",
            )
        )
    texts = []
    for total, (limit, _source) in zip(totals, limits, strict=True):
        text = fmt_bytes(total)
        if limit:
            text += f" of {fmt_bytes(limit)} ({100 * total / limit:.0f}%)"
        texts.append(text)
    fig.add_trace(
        go.Scatter(
            name="total",
            x=labels,
            y=[round(t / size, 4) for t in totals],
            text=texts,
            mode="text",
            textposition="top center",
            cliponaxis=False,  # the text above the tallest bar stays visible
            hoverinfo="skip",
            showlegend=False,
        )
    )
    if any(lim is not None for lim, _ in limits):
        shown = any(
            lim is not None and total >= LIMIT_SHOWN_FROM * lim
            for total, (lim, _) in zip(totals, limits, strict=True)
        )
        sources = {source for lim, source in limits if lim is not None}
        fig.add_trace(
            go.Scatter(
                name="limit per rank" + (f" ({sources.pop()})" if len(sources) == 1 else ""),
                x=labels,
                y=[None if lim is None else round(lim / size, 4) for lim, _ in limits],
                customdata=[
                    [fmt_bytes(lim) if lim is not None else "-", source] for lim, source in limits
                ],
                mode="markers",
                marker={
                    "symbol": "line-ew-open",
                    "size": 28,
                    "color": "#b91c1c",
                    "line": {"width": 2},
                },
                visible=True if shown else "legendonly",
                hovertemplate="%{x}: limit %{customdata[0]} (%{customdata[1]})<extra></extra>",
            )
        )
    fig.update_layout(barmode="stack", yaxis_title=unit, yaxis_rangemode="tozero")
    _style(fig, height=400)
    fig.update_layout(legend={"y": -0.08, "yanchor": "top", "traceorder": "normal"})
    return fig


def memory_parts(rank: RankEntry, budget: BudgetEntry) -> dict[str, float]:
    """One rank's budget by part in bytes (0 where not measured); activations at the rank's
    median batch where both are known."""
    out = {name: _num(getattr(budget, key)) for name, key in MEMORY_PARTS}
    per = _num(budget.activation_bytes_per_sample)
    batch = _num(rank.batch_size)
    if per > 0 and batch > 0:
        out["activations"] = per * batch
    return out


def budget_limit(budget: BudgetEntry) -> tuple[float | None, str]:
    """What the rank may use, and what that is: its GPU's total, else its share of the host's
    available memory (available / the ranks on the host)."""
    device = _num(budget.device_total_bytes)
    if device > 0:
        return device, "device total"
    avail = budget.host_available_bytes
    if is_number(avail):
        local = budget.local_ranks
        n = local if isinstance(local, int) and local > 0 else 1
        return float(avail) / n, "the host's available memory / its ranks"
    return None, "not measured"


def step_time_figure(snap: Snapshot) -> go.Figure | None:
    t0 = _t0(snap)
    fig = go.Figure()
    for view in sorted(snap.ranks, key=lambda v: v.info.rank):
        if not view.steps:
            continue
        xs = [s.time - t0 for s in view.steps]
        ys = [s.step_s * 1e3 for s in view.steps]
        xs, ys = _thin(xs, ys)
        fig.add_trace(
            go.Scatter(
                name=f"rank {view.info.rank}",
                x=_r(xs, 3),
                y=_r(ys, 3),
                mode="lines",
                line={"width": 1.5},
                hovertemplate="%{x:.1f} s: %{y:.1f} ms<extra>" + f"rank {view.info.rank}</extra>",
            )
        )
    if not fig.data:
        return None
    fig.update_layout(xaxis_title="seconds since the first sample", yaxis_title="ms per step")
    return _style(fig, height=360)


def gpu_busy_figure(snap: Snapshot) -> go.Figure | None:
    devices = _devices(snap)
    if not devices or not any(d.gpu_util is not None for ds in devices.values() for d in ds):
        return None
    t0 = _t0(snap)
    times = [d.time - t0 for ds in devices.values() for d in ds]
    lo, hi = min(times), max(times)
    n_cols = max(1, min(MAX_HEAT_COLUMNS, len({round(t, 1) for t in times})))
    width = (hi - lo) / n_cols if hi > lo else 1.0
    xs = [round(lo + width * (i + 0.5), 3) for i in range(n_cols)]
    z: list[list[float | None]] = []
    labels = []
    for label, samples in devices.items():
        buckets: list[list[float]] = [[] for _ in range(n_cols)]
        for d in samples:
            if d.gpu_util is None or d.lost:
                continue
            i = min(n_cols - 1, int((d.time - t0 - lo) / width)) if hi > lo else 0
            buckets[i].append(d.gpu_util * 100)
        z.append([round(statistics.fmean(b), 1) if b else None for b in buckets])
        labels.append(label)
    fig = go.Figure(
        go.Heatmap(
            name="GPU busy %",
            x=xs,
            y=labels,
            z=z,
            zmin=0,
            zmax=100,
            colorscale="Viridis",
            colorbar={"title": {"text": "busy %"}},
            hoverongaps=False,
            hovertemplate="%{y} at %{x:.0f} s: %{z:.0f}% busy<extra></extra>",
        )
    )
    fig.update_layout(xaxis_title="seconds since the first sample", yaxis_autorange="reversed")
    return _style(fig, height=max(220, 60 + 34 * len(labels)))


def gpu_memory_figure(snap: Snapshot) -> go.Figure | None:
    devices = {
        label: ds
        for label, ds in _devices(snap).items()
        if any(d.mem_used_bytes is not None for d in ds)
    }
    if not devices:
        return None
    t0 = _t0(snap)
    fig = make_subplots(
        rows=len(devices),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / len(devices)),
        subplot_titles=list(devices),
    )
    gib = float(1 << 30)
    for row, (label, ds) in enumerate(devices.items(), start=1):
        used = [d for d in ds if d.mem_used_bytes is not None]
        xs, ys = _thin([d.time - t0 for d in used], [(d.mem_used_bytes or 0) / gib for d in used])
        fig.add_trace(
            go.Scatter(
                name=f"{label} used",
                x=_r(xs, 3),
                y=_r(ys, 3),
                mode="lines",
                line={"color": "#1f77b4"},
                hovertemplate="%{x:.0f} s: %{y:.2f} GiB<extra>" + label + "</extra>",
                showlegend=row == 1,
                legendgroup="used",
            ),
            row=row,
            col=1,
        )
        totals = [d.mem_total_bytes for d in ds if d.mem_total_bytes is not None]
        if totals and used:
            total = max(totals) / gib
            fig.add_trace(
                go.Scatter(
                    name=f"{label} total",
                    x=[round(used[0].time - t0, 3), round(used[-1].time - t0, 3)],
                    y=[round(total, 3)] * 2,
                    mode="lines",
                    line={"color": "#7f7f7f", "dash": "dot"},
                    hovertemplate="total %{y:.1f} GiB<extra>" + label + "</extra>",
                    showlegend=row == 1,
                    legendgroup="total",
                ),
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="GiB", rangemode="tozero", row=row, col=1)
    fig.update_xaxes(title_text="seconds since the first sample", row=len(devices), col=1)
    return _style(fig, height=120 + 170 * len(devices))


def worker_cpu_figure(snap: Snapshot) -> go.Figure | None:
    t0 = _t0(snap)
    fig = go.Figure()
    for view in sorted(snap.ranks, key=lambda v: v.info.rank):
        cpu = list(view.cpu)
        if not cpu:
            continue
        xs, ys = _thin([c.time - t0 for c in cpu], [c.worker_cpu_total for c in cpu])
        _, ns = _thin([c.time - t0 for c in cpu], [float(c.workers) for c in cpu])
        fig.add_trace(
            go.Scatter(
                name=f"rank {view.info.rank}",
                x=_r(xs, 3),
                y=_r(ys, 3),
                customdata=[round(n) for n in ns],
                mode="lines",
                hovertemplate="%{x:.0f} s: %{y:.2f} cores in %{customdata} workers<extra>"
                + f"rank {view.info.rank}</extra>",
            )
        )
    if not fig.data:
        return None
    fig.update_layout(
        xaxis_title="seconds since the first sample",
        yaxis_title="cores (all workers of the rank)",
        yaxis_rangemode="tozero",
    )
    return _style(fig, height=320)


def _style(fig: go.Figure, *, height: int) -> go.Figure:
    fig.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        font={"family": FONT, "size": 12},
        legend={"orientation": "h", "y": -0.2 if height < 300 else 1.02, "yanchor": "bottom"},
        hovermode="closest",
    )
    return fig


def _devices(snap: Snapshot) -> dict[str, list[DeviceSample]]:
    """GPU samples grouped per physical GPU, labelled ``host GPU i`` and sorted."""
    by_uuid: dict[str, list[DeviceSample]] = {}
    for d in snap.devices:
        by_uuid.setdefault(d.uuid or f"{d.node}:{d.index}", []).append(d)
    keyed = sorted(by_uuid.values(), key=lambda ds: (ds[0].node, ds[0].index, ds[0].uuid))
    out: dict[str, list[DeviceSample]] = {}
    for ds in keyed:
        first = ds[0]
        label = f"{first.node or 'node'} GPU {first.index}"
        if label in out:  # two GPUs with the same index on one host name: tell them apart
            label = f"{label} ({first.uuid[-8:]})"
        out[label] = sorted(ds, key=lambda d: d.time)
    return out


def _t0(snap: Snapshot) -> float:
    times = [s.time for v in snap.ranks for s in v.steps[:1]]
    times += [c.time for v in snap.ranks for c in v.cpu[:1]]
    times += [d.time for d in snap.devices]
    finite = [t for t in times if math.isfinite(t)]
    return min(finite) if finite else 0.0


def _thin(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """At most ``MAX_POINTS`` points: longer series become medians of consecutive buckets."""
    n = len(xs)
    if n <= MAX_POINTS:
        return list(xs), list(ys)
    size = math.ceil(n / MAX_POINTS)
    out_x, out_y = [], []
    for i in range(0, n, size):
        out_x.append(statistics.median(xs[i : i + size]))
        out_y.append(statistics.median(ys[i : i + size]))
    return out_x, out_y


def _r(values: Sequence[float], digits: int) -> list[float]:
    return [round(v, digits) for v in values]


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
                        tag += f", predicted {fmt_speedup(f.predicted_speedup)}"
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
            facts.append(f"predicted speed-up {fmt_speedup(f.predicted_speedup, 2)}")
        if f.cause:
            facts.append(f"caused by {f.cause}")
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
        ]
        out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    unmeasured = [f"rank {r.rank}: {', '.join(r.unmeasured)}" for r in ranks if r.unmeasured]
    if unmeasured:
        out.append(f'<p class="muted">Not measured: {_e("; ".join(unmeasured))}</p>')
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


_CSS = """
:root { --crit: #b91c1c; --warn: #b45309; --ok: #15803d; --info: #1d4ed8; --muted: #6b7280; }
* { box-sizing: border-box; }
body { margin: 0; background: #f6f7f9; color: #111827;
  font: 15px/1.45 system-ui, -apple-system, 'Segoe UI', Roboto, 'Helvetica Neue', Arial,
  sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 18px 22px 40px; }
section { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; padding: 14px 18px;
  margin: 0 0 16px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 17px; margin: 0 0 10px; }
h3 { font-size: 15px; margin: 0 0 4px; }
.verdict { border-left: 6px solid var(--info); }
.verdict.sev-critical { border-left-color: var(--crit); }
.verdict.sev-warning { border-left-color: var(--warn); }
.verdict.sev-ok { border-left-color: var(--ok); }
.verdict.sev-critical h1 { color: var(--crit); }
.verdict.sev-warning h1 { color: var(--warn); }
.verdict.sev-ok h1 { color: var(--ok); }
.fixes { margin: 4px 0 10px; padding-left: 20px; }
.fixes li { margin: 3px 0; font-size: 16px; }
.muted { color: var(--muted); }
pre { background: #f3f4f6; padding: 10px; border-radius: 6px; overflow-x: auto;
  font: 12.5px/1.35 ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono',
  monospace; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e5e7eb; text-align: right; }
th { background: #f9fafb; }
td:nth-child(2), th:nth-child(2) { text-align: left; }
table.evidence td, table.evidence th { text-align: left; }
.finding { border-top: 1px solid #e5e7eb; padding: 10px 0 6px; }
.finding:first-of-type { border-top: 0; }
.finding.sev-critical h3 { color: var(--crit); }
.finding.sev-warning h3 { color: var(--warn); }
.plot { width: 100%; min-height: 200px; }
.pair { display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 16px;
  margin: 0 0 16px; }
.pair > section { margin: 0; min-width: 0; }
footer { font-size: 12px; }
"""

# Draws every figure, then records what was drawn in #auditor-render-status.
_BOOT_JS = """
(function () {
  var status = document.getElementById('auditor-render-status');
  var figs = JSON.parse(document.getElementById('auditor-figures').textContent);
  var config = __CONFIG__;
  var drawn = {};
  function record(id, gd) {
    var traces = (gd.data || []).map(function (t) {
      var n = 0;
      if (t.z) { t.z.forEach(function (row) { n += (row || []).length; }); }
      else if (t.y) { n = t.y.length; }
      return {name: t.name || '', points: n};
    });
    drawn[id] = {traces: traces, svg: gd.querySelectorAll('svg.main-svg').length,
                 drawnTraces: gd.querySelectorAll('.trace, .hm, image').length};
  }
  var jobs = figs.map(function (f) {
    var el = document.getElementById(f.id);
    return Plotly.newPlot(el, f.figure.data, f.figure.layout, config).then(function (gd) {
      record(f.id, gd);
    });
  });
  Promise.all(jobs).then(function () {
    status.setAttribute('data-rendered', String(Object.keys(drawn).length));
    status.textContent = JSON.stringify(drawn);
  }, function (err) {
    status.setAttribute('data-error', String(err));
  });
})();
""".replace("__CONFIG__", json.dumps(_CONFIG))
