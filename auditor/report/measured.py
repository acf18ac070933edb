"""What the report holds of a rank's memory and work, and of the job's work: the measured
memory budget (:class:`BudgetEntry`), a rank's memory (:class:`MemoryEntry`) and counted FLOPs
(:class:`FlopsEntry`), and the job's MFU (:class:`MfuEntry`). Parts of
:class:`~auditor.report.model.Report`; values are what the JSON holds, ``None`` for what was not
measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from auditor.wording import is_number


@dataclass(frozen=True)
class BudgetEntry:
    """A rank's measured memory budget (``memory.budget``), parts first, then what it runs on."""

    measured_at_step: int | None = None
    optimizer: str | None = None
    param_count: int | None = None
    param_bytes: int | None = None
    param_bytes_by_dtype: Mapping[str, int] = field(default_factory=dict)
    grad_bytes: int | None = None
    optimizer_bytes: int | None = None
    optimizer_bytes_by_kind: Mapping[str, int] = field(default_factory=dict)
    buffer_bytes: int | None = None
    fixed_bytes: int | None = None
    other_module_bytes: int | None = None
    activation_bytes_per_step: int | None = None
    activation_batch: int | None = None
    activation_bytes_per_sample: float | None = None
    activations_every: int | None = None
    sharded: bool | None = None
    per_device: Mapping[str, Any] = field(default_factory=dict)
    device_total_bytes: int | None = None
    host_total_bytes: int | None = None
    host_available_bytes: int | None = None
    local_ranks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BudgetEntry:
        mappings = ("param_bytes_by_dtype", "optimizer_bytes_by_kind", "per_device")
        values: dict[str, Any] = {
            f.name: (dict(d.get(f.name) or {}) if f.name in mappings else d.get(f.name))
            for f in fields(cls)
        }
        return cls(**values)


@dataclass(frozen=True)
class MemoryEntry:
    """A rank's memory: RSS and allocated (medians), the window's peak, the measured budget."""

    rss_bytes: int | None = None
    allocated_bytes: int | None = None
    peak_bytes: int | None = None
    budget: BudgetEntry | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rss_bytes": self.rss_bytes,
            "allocated_bytes": self.allocated_bytes,
            "peak_bytes": self.peak_bytes,
            "budget": None if self.budget is None else self.budget.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryEntry:
        budget = d.get("budget")
        return cls(
            rss_bytes=d.get("rss_bytes"),
            allocated_bytes=d.get("allocated_bytes"),
            peak_bytes=d.get("peak_bytes"),
            budget=BudgetEntry.from_dict(budget) if isinstance(budget, Mapping) else None,
        )


@dataclass(frozen=True)
class FlopsEntry:
    """A rank's counted work (``flops``; :class:`~auditor.analysis.mfu.RankFlops`): FLOPs of one
    step (counted on ``counted_step``, by dtype), FLOP/s at the rank's pace, and on a GPU the
    peak table knows, MFU against ``peak_flops_per_s`` (the effective peak of its dtype mix on
    ``device_name``); ``count_cost_s``: the extra seconds the counted step took."""

    flops_per_step: float | None = None
    flops_per_s: float | None = None
    mfu: float | None = None
    peak_flops_per_s: float | None = None
    dtype: str | None = None
    by_dtype: Mapping[str, float] = field(default_factory=dict)
    device: str | None = None
    device_name: str | None = None
    counted_step: int | None = None
    count_cost_s: float | None = None
    micro_batches: int | None = None
    samples: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["by_dtype"] = dict(self.by_dtype)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FlopsEntry:
        values: dict[str, Any] = {f.name: d.get(f.name) for f in fields(cls)}
        by = d.get("by_dtype")
        values["by_dtype"] = (
            {str(k): v for k, v in by.items() if is_number(v)} if isinstance(by, Mapping) else {}
        )
        return cls(**values)


@dataclass(frozen=True)
class MfuEntry:
    """The job's work (``job.mfu``; :class:`~auditor.analysis.mfu.JobMfu`): its FLOP/s (every
    counted rank's, added up), on GPUs the peak table knows its MFU and ``gap``, the MFU gap
    split by part (shares of the time, adding up to ``1 - mfu``), ``basis`` (``run``: the ranks'
    whole runs; ``step``: a step at their pace), ``precision``/``tf32`` (the share of the time
    bf16, or TF32 alone, would give back from fp32 matmuls), the card and dtype most ranks ran
    on, ``gpu`` (whether they ran on GPUs) and the ``ranks`` counted."""

    flops_per_s: float | None = None
    mfu: float | None = None
    gap: Mapping[str, float] = field(default_factory=dict)
    basis: str | None = None
    precision: float | None = None
    tf32: float | None = None
    device_name: str | None = None
    dtype: str | None = None
    gpu: bool = False
    ranks: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["gap"] = dict(self.gap)
        out["ranks"] = list(self.ranks)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MfuEntry:
        values: dict[str, Any] = {f.name: d.get(f.name) for f in fields(cls)}
        gap = d.get("gap")
        values["gap"] = (
            {str(k): v for k, v in gap.items() if is_number(v)} if isinstance(gap, Mapping) else {}
        )
        values["gpu"] = bool(d.get("gpu"))
        values["ranks"] = tuple(int(r) for r in d.get("ranks") or () if isinstance(r, int))
        return cls(**values)
