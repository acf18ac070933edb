"""Work done, in words and tables: the job's FLOP/s and MFU with where its gap goes, and each
rank's counted FLOPs (:class:`~auditor.report.model.MfuEntry`,
:class:`~auditor.report.model.FlopsEntry`), as the terminal verdict and the HTML page show them.
"""

from __future__ import annotations

from collections.abc import Sequence

from auditor.report.model import JobSummary, RankEntry
from auditor.report.phrasing.low_mfu import fmt_mfu, mfu_text
from auditor.wording import MISSING, fmt_flops, fmt_pct, is_number, ranks_text

# The gap's parts as a line names them, in the order :data:`auditor.analysis.mfu.GAP_PARTS`
# lists them.
PART_NAMES = {
    "startup": "start-up",
    "data_wait": "data wait",
    "h2d": "copy to GPU",
    "collective_wait": "collective wait",
    "stalls": "stalls",
    "host_overhead": "host overhead",
    "small_batch": "batch too small",
    "device": "kernels below peak",
    "teardown": "teardown",
}
BASIS = {"run": "over the whole run", "step": "over a step at each rank's pace"}
# Parts under this share are left out of the line.
MIN_SHARE = 0.01


def work_line(job: JobSummary) -> str:
    """``Work: 12% MFU (37 TFLOP/s on NVIDIA H100 80GB HBM3) in bf16 over the whole run; the
    gap: data wait 60%, ...``; empty where no rank counted its FLOPs."""
    m = job.mfu
    if m is None:
        return ""
    dtype = f" in {m.dtype}" if m.dtype else ""
    basis = BASIS.get(m.basis or "")
    text = f"Work: {mfu_text(m.mfu, m.flops_per_s, m.device_name, gpu=m.gpu)}{dtype}"
    if basis:
        text += f" {basis}"
    parts = gap_text(m.gap)
    if parts:
        text += f"; the gap: {parts}"
    if is_number(m.precision) and m.precision >= MIN_SHARE:
        text += f"; bf16 would give back {fmt_pct(m.precision)} of the time"
    return text


def gap_text(gap: object) -> str:
    """The gap's parts, largest first: ``data wait 60%, collective wait 12%``."""
    if not isinstance(gap, dict):
        return ""
    items = sorted(
        ((k, v) for k, v in gap.items() if is_number(v) and v >= MIN_SHARE),
        key=lambda kv: -kv[1],
    )
    return ", ".join(f"{PART_NAMES.get(k, k)} {fmt_pct(v)}" for k, v in items)


def mfu_cell(mfu: float | None, flops_per_s: float | None) -> str:
    """The MFU column's cell: the MFU on a GPU the peak table knows (``41%``), else the FLOP/s
    (``3.2G/s``: a CPU job, an unknown card); ``-`` where the rank counted no FLOPs."""
    if mfu is not None:
        return fmt_mfu(mfu)
    if is_number(flops_per_s):
        return f"{fmt_flops(flops_per_s)}/s"
    return MISSING


def gap_rows(job: JobSummary) -> list[list[str]]:
    """The job's gap by part, largest first (parts under :data:`MIN_SHARE` left out): ``[part,
    share]`` rows (none without an MFU)."""
    m = job.mfu
    if m is None or m.mfu is None:
        return []
    items = sorted(
        ((k, v) for k, v in m.gap.items() if is_number(v) and v >= MIN_SHARE), key=lambda kv: -kv[1]
    )
    rows = [["MFU (the work done)", fmt_mfu(m.mfu)]]
    rows += [[PART_NAMES.get(k, k), fmt_pct(v)] for k, v in items]
    if is_number(m.precision) and m.precision > 0:
        rows.append(["apart: bf16 would give back", fmt_pct(m.precision)])
    return rows


WORK_TITLES = ("rank", "FLOPs/step", "FLOP/s", "MFU", "dtype", "counted", "cost")


def work_rows(ranks: Sequence[RankEntry]) -> list[list[str]]:
    """One row per rank that counted its FLOPs: FLOPs per step, FLOP/s, MFU (``-`` on a CPU
    or an unknown card), the dtype most FLOPs ran in, the step counted and what it cost."""
    rows = []
    for r in ranks:
        f = r.flops
        if f is None:
            continue
        cost = f.count_cost_s
        rows.append(
            [
                str(r.rank),
                fmt_flops(f.flops_per_step),
                fmt_flops(f.flops_per_s),
                fmt_mfu(f.mfu) if f.mfu is not None else MISSING,
                f.dtype or MISSING,
                MISSING if f.counted_step is None else f"step {f.counted_step}",
                f"{cost * 1e3:.0f} ms" if is_number(cost) else MISSING,
            ]
        )
    return rows


def work_notes(job: JobSummary, ranks: Sequence[RankEntry]) -> list[str]:
    """What the table cannot say: why a rank has no MFU."""
    counted = [r for r in ranks if r.flops is not None]
    if not counted:
        return []
    unknown = sorted(
        {
            r.flops.device_name
            for r in counted
            if r.flops is not None and r.flops.mfu is None and r.flops.device_name
        }
    )
    cpu = [r.rank for r in counted if r.flops is not None and r.flops.device == "cpu"]
    nameless = [
        r.rank
        for r in counted
        if r.flops is not None
        and r.flops.device != "cpu"
        and r.flops.mfu is None
        and not r.flops.device_name
    ]
    notes = []
    if cpu:
        notes.append("FLOP/s only on a CPU: MFU is judged against a GPU's peak.")
    for name in unknown:
        notes.append(f"No MFU on {name}: no peak figure for it or its dtype (FLOP/s only).")
    if nameless:
        notes.append(
            f"No MFU on {ranks_text(nameless)}: no GPU sample named the card (FLOP/s only)."
        )
    return notes
