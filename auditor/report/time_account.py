"""The account of each rank's run in words: where every second went, and the largest loss.

The figures come from :mod:`auditor.analysis.accounting` (each rank's ``RankEntry.time``); this
module words them for the terminal verdict and the HTML page: the loss the verdict leads with
("rank 0 spent 9.8s (35% of its run) saving checkpoints while rank 1 waited") and one line per
rank of its whole run.
"""

from __future__ import annotations

from collections.abc import Sequence

from auditor.analysis.accounting import Account, Loss, largest_loss
from auditor.report.model import RankEntry
from auditor.wording import fmt_duration, fmt_gib, fmt_pct, ranks_text

# Each part of an account as the reports name it (legend, lines), in run order.
PART_LABELS = {
    "startup": "start-up",
    "data_wait": "data wait",
    "h2d": "h2d",
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "collective_wait": "waiting for peers",
    "checkpoint": "checkpoint",
    "evaluation": "evaluation",
    "logging": "logging",
    "loader_start": "starting workers",
    "other": "other (in steps)",
    "gaps": "between steps",
    "teardown": "teardown",
}
# What a rank did while it lost the time.
_DOING = {
    "startup": "starting up before the first step",
    "teardown": "ending after the last step",
    "data_wait": "waiting for data",
    "collective_wait": "waiting for its peers",
    "checkpoint": "saving checkpoints",
    "evaluation": "evaluating",
    "logging": "logging",
    "loader_start": "starting DataLoader workers",
}


def part_label(name: str) -> str:
    return PART_LABELS.get(name, name)


def fmt_seconds(seconds: float) -> str:
    """``0.42s``, ``9.8s``, ``3m05s`` (one word: a wrapped line never splits a figure)."""
    if seconds < 1:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    return fmt_duration(seconds)


def accounts_of(ranks: Sequence[RankEntry]) -> dict[int, Account]:
    return {r.rank: r.time for r in ranks if r.time is not None}


def loss_sentence(loss: Loss) -> str:
    """``rank 0 spent 9.8s (35% of its run) saving checkpoints while rank 1 waited``."""
    doing = _DOING.get(loss.kind, f"on {loss.kind}")
    if loss.alike:
        # Every rank alike (start-up, say): the job's loss, worded for the ranks together.
        return (
            f"{ranks_text((loss.rank, *loss.alike))} each spent up to "
            f"{fmt_seconds(loss.seconds)} ({fmt_pct(loss.share)} of the run) {doing}"
        )
    text = (
        f"{ranks_text([loss.rank])} spent {fmt_seconds(loss.seconds)} "
        f"({fmt_pct(loss.share)} of its run) {doing}"
    )
    if loss.waiting:
        text += f" while {ranks_text(loss.waiting)} waited"
    return text


def lead_line(ranks: Sequence[RankEntry]) -> str | None:
    """The verdict's line on the largest loss; None where no rank has an account or nothing
    was lost."""
    loss = largest_loss(accounts_of(ranks))
    if loss is None or loss.seconds <= 0:
        return None
    return f"Largest loss: {loss_sentence(loss)}."


def rank_line(a: Account) -> str:
    """``rank 0: 27.9s = start-up 3.1s, 200 steps 20.2s (...), teardown 0.40s``: the parts over
    1% of the run, largest first within the steps; the GPU memory held while starting up or
    ending where measured (``start-up 12.0s (GPU memory held 0.6 GiB)``)."""
    wall = a.wall_s
    parts = a.parts()
    inside = {
        k: v
        for k, v in parts.items()
        if k not in ("startup", "gaps", "teardown") and wall > 0 and v >= 0.01 * wall
    }
    steps = ", ".join(
        f"{part_label(k)} {fmt_seconds(v)}"
        for k, v in sorted(inside.items(), key=lambda kv: -kv[1])
    )
    pieces = (
        [f"start-up {fmt_seconds(a.startup_s)}{_held(a.startup_gpu_bytes)}"] if a.started else []
    )
    pieces.append(f"{a.steps} steps {fmt_seconds(a.steps_s)}" + (f" ({steps})" if steps else ""))
    if a.gaps_s >= 0.01 * wall and wall > 0:
        pieces.append(f"between steps {fmt_seconds(a.gaps_s)}")
    if a.ended:
        pieces.append(f"teardown {fmt_seconds(a.teardown_s)}{_held(a.teardown_gpu_bytes)}")
    return f"{ranks_text([a.rank])}: {fmt_seconds(wall)} = " + ", ".join(pieces)


def _held(gpu_bytes: float | None) -> str:
    """`` (GPU memory held 1.6 GiB)``: what the rank held on its GPU in that part of its run
    (starting up or ending, not idle); empty where not measured."""
    return "" if gpu_bytes is None else f" (GPU memory held {fmt_gib(gpu_bytes)})"


def account_lines(ranks: Sequence[RankEntry]) -> list[str]:
    """One line per rank with an account, in rank order."""
    return [rank_line(r.time) for r in sorted(ranks, key=lambda r: r.rank) if r.time is not None]
