"""The per-rank figure columns every rank table shows: the live panel, the terminal verdict and
the HTML page.

Each column is a title, the field it reads and how it is worded. The fields are named alike on
:class:`~auditor.analysis.stats.RankStats` (the live window) and on
:class:`~auditor.report.model.RankEntry` (the report), so one definition serves both: a rank's
``step ms`` reads the same on the panel while the job runs and in the verdict after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.wording import fmt_batch, fmt_ms_value, fmt_pct, fmt_rate


@dataclass(frozen=True)
class Column:
    """One figure column: its title, the attribute it reads, how a value is worded."""

    title: str
    field: str
    fmt: Callable[[Any], str]

    def cell(self, rank: object) -> str:
        return self.fmt(getattr(rank, self.field))


# Medians per step over the window, in the order the tables show them.
FIGURE_COLUMNS = (
    Column("step ms", "step_s", fmt_ms_value),
    Column("data %", "data_wait_ratio", fmt_pct),
    Column("compute ms", "compute_s", fmt_ms_value),
    Column("wait ms", "collective_wait_s", fmt_ms_value),
    Column("batch", "batch_size", fmt_batch),
    Column("samples/s", "samples_per_s", fmt_rate),
)
# The verdict's table (80 columns): every figure but the rate.
VERDICT_COLUMNS = FIGURE_COLUMNS[:5]


def titles(columns: Sequence[Column]) -> tuple[str, ...]:
    return tuple(c.title for c in columns)


def cells(rank: object, columns: Sequence[Column] = FIGURE_COLUMNS) -> list[str]:
    """``rank``'s cells (a RankStats or a RankEntry) for ``columns``."""
    return [c.cell(rank) for c in columns]
