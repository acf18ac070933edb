"""The HTML report's plotly figures, built from the report and the run's samples.

* a stacked bar of each rank's whole run (start-up, the steps' phases, named work such as
  checkpoints and evaluation, other, teardown: every second once, from the report's ``time``);
* a stacked bar of each rank's step: data wait, h2d, forward, backward apart from the wait at the
  all-reduce, optimizer, the collective wait itself (medians, from the report); beside it, where
  the ranks measured their memory budget, a stacked bar of each rank's memory by part
  (parameters, gradients, optimizer state, buffers, modules outside the model, activations at
  the rank's batch) against what the rank may use (its GPU's total, or its share of the host's
  available memory);
* each rank's step time over the run;
* a GPU-by-time heatmap of busy time and a memory chart per GPU, where GPUs were seen;
* DataLoader worker CPU per rank.

:func:`page_figures` is the page's list of plots, in page order; the time series come from a
:class:`Snapshot` of the whole run, and without one those plots are None.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from auditor.analysis.snapshot import Snapshot
from auditor.report.measured import BudgetEntry
from auditor.report.model import RankEntry
from auditor.report.time_account import fmt_seconds, part_label
from auditor.samples import DeviceSample
from auditor.wording import finite_or_zero as _num
from auditor.wording import fmt_bytes, is_number

# The step breakdown, in step order (labels of the stacked bar).
BREAKDOWN = (
    "data wait",
    "h2d",
    "forward",
    "backward (own work)",
    "optimizer",
    "collective wait",
)
# The run's parts (``Account.parts``) by color; named work beyond these gets a gray.
_TIME_COLORS = {
    "startup": "#7f7f7f",
    "data_wait": "#d62728",
    "h2d": "#9467bd",
    "forward": "#1f77b4",
    "backward": "#2ca02c",
    "optimizer": "#8c564b",
    "collective_wait": "#bcbd22",
    "checkpoint": "#ff7f0e",
    "evaluation": "#17becf",
    "logging": "#e377c2",
    "loader_start": "#ff9896",
    "other": "#c7c7c7",
    "gaps": "#dbdb8d",
    "teardown": "#525252",
}
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


# One plot of the page: (key, title, the figure or None, what the page says in its place).
PlotEntry = tuple[str, str, go.Figure | None, str]


def page_figures(ranks: Sequence[RankEntry], series: Snapshot | None) -> list[PlotEntry]:
    """The page's plots in page order; the memory bar only where the ranks measured a budget."""
    figures: list[PlotEntry] = []
    figures.append(
        (
            "run-time",
            "Where each rank's run went (seconds, every second once)",
            time_figure(ranks),
            "No rank's run could be accounted for (a report from before the account).",
        )
    )
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
    # The plots over the run: one table of (key, title, figure maker, what an empty one says).
    over_run = (
        ("step-time", "Step time per rank over the run", step_time_figure,
         "No steps were measured."),
        ("gpu-busy", "GPU busy time (NVML utilisation) over the run", gpu_busy_figure,
         "No GPU was seen (a CPU run, or NVML unavailable)."),
        ("gpu-memory", "GPU memory over the run", gpu_memory_figure,
         "No GPU memory was measured."),
        ("worker-cpu", "DataLoader worker CPU per rank (cores)", worker_cpu_figure,
         "No DataLoader worker CPU was measured."),
    )  # fmt: skip
    for key, title, make, empty in over_run:
        figure = make(series) if series else None
        figures.append((key, title, figure, no_series if series is None else empty))
    return figures


# --------------------------------------------------------------------------------------------
# figures


def time_figure(ranks: Sequence[RankEntry]) -> go.Figure | None:
    """Horizontal stacked bar per rank: its whole run by part, in seconds (the report's
    ``time``), with the rank's wall time as a marker."""
    accounted = [r for r in sorted(ranks, key=lambda r: r.rank) if r.time is not None]
    if not accounted:
        return None
    labels = [f"rank {r.rank}" for r in accounted]
    names: list[str] = []
    for r in accounted:
        assert r.time is not None
        names += [n for n in r.time.parts() if n not in names]
    fig = go.Figure()
    for name in names:
        xs = [r.time.parts().get(name, 0.0) if r.time is not None else 0.0 for r in accounted]
        if not any(x > 0 for x in xs):
            continue
        label = part_label(name)
        fig.add_trace(
            go.Bar(
                name=label,
                y=labels,
                x=[round(x, 3) for x in xs],
                orientation="h",
                marker_color=_TIME_COLORS.get(name, "#aaaaaa"),
                hovertext=[fmt_seconds(x) for x in xs],
                hovertemplate="%{y}: " + label + " %{hovertext}<extra></extra>",
            )
        )
    walls = [round(r.time.wall_s, 3) if r.time is not None else 0.0 for r in accounted]
    fig.add_trace(
        go.Scatter(
            name="wall time",
            y=labels,
            x=walls,
            mode="markers",
            marker={"symbol": "line-ns-open", "size": 22, "color": "#222", "line": {"width": 2}},
            hovertemplate="%{y}: wall %{x:.1f} s<extra></extra>",
        )
    )
    fig.update_layout(barmode="stack", xaxis_title="seconds of the run")
    fig.update_yaxes(autorange="reversed")
    _style(fig, height=max(220, 60 + 40 * len(accounted)))
    fig.update_layout(legend={"y": -0.25, "yanchor": "top", "orientation": "h"})
    return fig


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
