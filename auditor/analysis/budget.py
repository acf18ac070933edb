"""A rank's measured memory budget, and what each lever frees: the arithmetic the memory rules
share.

The model (DOMAIN.md): memory = fixed part + batch x activations per sample. The fixed part is
the parameters, their gradients, the optimizer's state and the buffers, as the probe measured
them (:class:`auditor.samples.MemoryBudget`), plus modules outside the model (an EMA or
evaluation copy). No fit, no batch variation: every term is measured.

The memory a rank may use (its *capacity*):

* on a GPU, the device's total less a safety ``margin``, less what the device holds outside the
  rank's caching allocator (its CUDA context, NCCL's buffers, other processes), as measured;
* on a CPU job, what the rank's tensors hold now plus its share of the host's available memory
  (available / ranks on the host), that share less the ``margin``.

The levers, each in bytes freed per rank at the current batch (and the largest batch it allows):

* ``checkpointing``: gradient checkpointing keeps only the segment boundaries and recomputes the
  rest in backward; with about sqrt(layers) segments the activations shrink several-fold. The
  conservative end of the usual 4-10x is taken: activations / :data:`CHECKPOINT_FACTOR`.
* ``autocast_bf16``: ``torch.autocast(dtype=torch.bfloat16)`` saves the activations of its
  matrix products in bf16: float32 activations halve (:data:`AUTOCAST_FACTOR`). Parameters and
  gradients keep their dtype under autocast; halving them too needs bf16 parameters (FSDP's
  ``MixedPrecisionPolicy``, or the model in bf16), which ``bf16_params`` counts.
* ``sgd_momentum`` / ``sgd``: an optimizer with less state. Adam keeps two tensors per parameter
  (x4 the parameters with the parameters and gradients), SGD with momentum one (x3), plain SGD
  none (x2): the state beyond that is freed. Scalar ``step`` counters are left aside.
* ``shard``: FSDP / ZeRO-3 shards parameters, gradients and optimizer state over the ranks:
  the fixed part / world size stays, the rest is freed (not offered where already sharded).

On a GPU the allocator's measured peak also holds what the tensors above do not: a step's
temporaries, fragmentation, DDP's gradient buckets. Where that peak exceeds the model at the
current batch, the excess is counted as growing with the batch (the cautious reading: a batch
that fits by the model alone can run out of memory), so the largest batch is never sized from
the tensors alone.

Which lever is *the* lever: the fixed part where it is at least the activations at the current
batch (a smaller batch or checkpointing cannot help much), else the activations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from auditor.samples import MemoryBudget

from .fixes import Fix

# Gradient checkpointing: activations cut 4x (the conservative end of the usual 4-10x).
CHECKPOINT_FACTOR = 4.0
# bf16 autocast: float32 activations saved at half the size.
AUTOCAST_FACTOR = 2.0
# Optimizer state per byte of trainable parameters: Adam 2, SGD with momentum 1, SGD 0.
STATE_PER_PARAM = {"adam": 2.0, "sgd_momentum": 1.0, "sgd": 0.0}
# State kinds that are counters, not per-parameter copies.
COUNTER_KINDS = frozenset({"step"})
_HALF_DTYPES = frozenset({"bfloat16", "float16"})
# Where a rank's capacity comes from (:func:`capacity`), as codes (the report words them).
DEVICE_TOTAL = "device_total"  # the device's total; its CUDA context not measured
DEVICE_LESS_OUTSIDE = "device_total_less_outside"  # less what the context and others hold
HOST_SHARE = "host_share"  # the host's available memory per rank
UNKNOWN = "unknown"
# Each lever of :meth:`BudgetModel.levers` as a fix: the lever it moves and the value proposed.
FIX_LEVERS: dict[str, tuple[str, bool | str]] = {
    "checkpointing": ("gradient_checkpointing", True),
    "autocast_bf16": ("autocast_bf16", True),
    "bf16_params": ("bf16_params", True),
    "sgd_momentum": ("optimizer", "sgd_momentum"),
    "sgd": ("optimizer", "sgd"),
    "shard": ("sharding", True),
}


@dataclass(frozen=True)
class Lever:
    """One way to make room: bytes freed per rank at the current batch, and the largest batch
    that fits with it."""

    name: str
    frees_bytes: int
    largest_batch: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"frees_bytes": self.frees_bytes, "largest_batch": self.largest_batch}


@dataclass(frozen=True)
class BudgetModel:
    """One rank's measured budget against its capacity."""

    budget: MemoryBudget
    batch: int | None
    capacity_bytes: float | None
    capacity_source: str  # a code: DEVICE_TOTAL, DEVICE_LESS_OUTSIDE, HOST_SHARE or UNKNOWN
    world_size: int = 1
    # Micro-batches per step (gradient accumulation): ``batch`` is then the micro-batch, the
    # one whose activations are alive at a time.
    accumulated: int = 1

    @property
    def rank(self) -> int:
        return self.budget.rank

    @property
    def fixed_bytes(self) -> int:
        """Everything that does not grow with the batch, extra module copies included."""
        return self.budget.fixed_bytes + self.budget.other_module_bytes

    @property
    def per_sample_bytes(self) -> float | None:
        return self.budget.activations_per_sample

    @property
    def activation_bytes(self) -> float | None:
        """Activations at the current batch."""
        per = self.per_sample_bytes
        if per is None or self.batch is None:
            return None
        return per * self.batch

    @property
    def overhead_bytes(self) -> float:
        """What the allocator's measured peak holds beyond the fixed part and the activations
        at the current batch (0 where no peak was measured, e.g. on CPU)."""
        peak, act = self.budget.device_peak_bytes, self.activation_bytes
        if not peak or act is None:
            return 0.0
        return max(0.0, peak - self.fixed_bytes - act)

    @property
    def overhead_per_sample(self) -> float:
        return self.overhead_bytes / self.batch if self.batch else 0.0

    def at(self, batch: float) -> float:
        """Predicted memory at ``batch`` (the measured overhead growing with it)."""
        per = (self.per_sample_bytes or 0.0) + self.overhead_per_sample
        return self.fixed_bytes + per * batch

    def usable(self, device_bytes: float) -> float:
        """Of ``device_bytes`` of the GPU, what this rank's allocator may take: less what the
        device holds outside it (the CUDA context and other processes)."""
        return device_bytes - (self.budget.device_outside_bytes or 0)

    @property
    def current_bytes(self) -> float | None:
        return None if self.batch is None else self.at(self.batch)

    def largest_batch(
        self,
        capacity: float | None = None,
        *,
        fixed_freed: float = 0.0,
        per_sample_factor: float = 1.0,
    ) -> int | None:
        """The largest batch whose memory stays within ``capacity`` (default: the rank's)."""
        cap = self.capacity_bytes if capacity is None else capacity
        per = self.per_sample_bytes
        if cap is None or not per or per <= 0:
            return None
        # A lever shrinks the activations, not the step's temporaries: those stay per sample.
        per_sample = per / per_sample_factor + self.overhead_per_sample
        return max(0, math.floor((cap - (self.fixed_bytes - fixed_freed)) / per_sample))

    @property
    def trainable_param_bytes(self) -> int:
        """Float parameter bytes (what an optimizer keeps state for)."""
        return self.budget.param_bytes

    @property
    def state_bytes(self) -> int:
        """Optimizer state apart from scalar counters."""
        b = self.budget
        return b.optimizer_bytes - sum(
            v for k, v in b.optimizer_bytes_by_kind.items() if k in COUNTER_KINDS
        )

    def levers(self) -> dict[str, Lever]:
        """What each lever frees per rank at the current batch (levers that free nothing are
        left out)."""
        out: dict[str, Lever] = {}
        act = self.activation_bytes
        if act is not None and act > 0:
            freed = act * (1.0 - 1.0 / CHECKPOINT_FACTOR)
            out["checkpointing"] = Lever(
                "checkpointing",
                round(freed),
                self.largest_batch(per_sample_factor=CHECKPOINT_FACTOR),
            )
            if not self._half_precision():
                out["autocast_bf16"] = Lever(
                    "autocast_bf16",
                    round(act * (1.0 - 1.0 / AUTOCAST_FACTOR)),
                    self.largest_batch(per_sample_factor=AUTOCAST_FACTOR),
                )
        if not self._half_precision():
            halved = (self.budget.param_bytes + self.budget.grad_bytes) / 2
            if halved > 0:
                out["bf16_params"] = Lever(
                    "bf16_params", round(halved), self.largest_batch(fixed_freed=halved)
                )
        params = self.trainable_param_bytes
        state = self.state_bytes
        for name in ("sgd_momentum", "sgd"):
            freed = state - STATE_PER_PARAM[name] * params
            if freed > 0 and params > 0:
                out[name] = Lever(name, round(freed), self.largest_batch(fixed_freed=freed))
        if self.world_size > 1 and not self.budget.sharded:
            core = self.budget.param_bytes + self.budget.grad_bytes + self.budget.optimizer_bytes
            freed = core * (1.0 - 1.0 / self.world_size)
            if freed > 0:
                out["shard"] = Lever("shard", round(freed), self.largest_batch(fixed_freed=freed))
        return out

    def _half_precision(self) -> bool:
        by = self.budget.param_bytes_by_dtype
        return bool(by) and all(k in _HALF_DTYPES for k in by)

    @property
    def main_lever(self) -> str:
        """``fixed`` where the fixed part is at least the activations at the current batch,
        else ``activations``."""
        act = self.activation_bytes
        return "fixed" if act is None or self.fixed_bytes >= act else "activations"

    def largest_levers(self, limit: int = 3) -> list[Lever]:
        """The levers that free the most, largest saving first (the ones a fix names)."""
        return sorted(self.levers().values(), key=lambda lv: -lv.frees_bytes)[:limit]

    def fixes(
        self,
        rank: int | None,
        answers: Sequence[str],
        *,
        gpu: str | None = None,
        limit: int = 3,
    ) -> list[Fix]:
        """:meth:`largest_levers` as fixes (no speed-up: memory does not set the step time)."""
        out = []
        for lv in self.largest_levers(limit):
            lever, proposed = FIX_LEVERS[lv.name]
            current = self.budget.optimizer if lever == "optimizer" else None
            out.append(Fix(lever, rank, current, proposed, None, tuple(answers), gpu))
        return out

    def evidence(self) -> dict[str, Any]:
        b = self.budget
        return {
            "source": "budget",
            "device": b.device,
            "param_bytes": b.param_bytes,
            "param_bytes_by_dtype": dict(b.param_bytes_by_dtype),
            "grad_bytes": b.grad_bytes,
            "optimizer": b.optimizer,
            "optimizer_bytes": b.optimizer_bytes,
            "optimizer_bytes_by_kind": dict(b.optimizer_bytes_by_kind),
            "buffer_bytes": b.buffer_bytes,
            "other_module_bytes": b.other_module_bytes,
            "fixed_bytes": self.fixed_bytes,
            "activations_per_sample_bytes": _round(self.per_sample_bytes),
            "current_batch": self.batch,
            **({"micro_batches": self.accumulated} if self.accumulated > 1 else {}),
            "activation_bytes": _round(self.activation_bytes),
            "device_outside_bytes": b.device_outside_bytes,
            "device_peak_bytes": b.device_peak_bytes,
            "overhead_bytes": _round(self.overhead_bytes),
            "predicted_at_current_bytes": _round(self.current_bytes),
            "capacity_bytes": _round(self.capacity_bytes),
            "capacity_source": self.capacity_source,
            "largest_batch": self.largest_batch(),
            "main_lever": self.main_lever,
            "levers": {k: v.to_dict() for k, v in self.levers().items()},
        }


def capacity(budget: MemoryBudget, *, margin: float, batch: int | None) -> tuple[float | None, str]:
    """The memory this rank may use, and where that figure comes from (a code: see
    :data:`DEVICE_TOTAL` and the others; the module doc)."""
    if budget.device_total_bytes:
        cap = (1.0 - margin) * budget.device_total_bytes
        if budget.device_outside_bytes is None:
            return cap, DEVICE_TOTAL
        outside = budget.device_outside_bytes
        return cap - outside, DEVICE_LESS_OUTSIDE
    if budget.host_available_bytes is None:
        return None, UNKNOWN
    share = budget.host_available_bytes / max(1, budget.local_ranks)
    held = float(budget.fixed_bytes + budget.other_module_bytes)
    per = budget.activations_per_sample
    if per is not None and batch:
        held += per * batch
    return held + (1.0 - margin) * share, HOST_SHARE


def host_short(budget: MemoryBudget, short_ratio: float) -> bool:
    """The host's available memory is below ``short_ratio`` of its total."""
    return short_of(budget.host_available_bytes, budget.host_total_bytes, short_ratio)


def short_of(available: float | None, total: float | None, short_ratio: float) -> bool:
    """``available`` is below ``short_ratio`` of ``total`` (False where either is unknown)."""
    if available is None or not total:
        return False
    return available < short_ratio * total


def model_for(
    budget: MemoryBudget,
    *,
    batch: int | None,
    margin: float,
    world_size: int,
    accumulated: int = 1,
) -> BudgetModel:
    """``batch``: the micro-batch under gradient accumulation (``accumulated`` per step)."""
    cap, source = capacity(budget, margin=margin, batch=batch)
    return BudgetModel(budget, batch, cap, source, max(1, world_size), max(1, accumulated))


def _round(v: float | None) -> int | None:
    return None if v is None else round(v)
