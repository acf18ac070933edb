"""A closed step as the step clock keeps it until its device marks are read
(:class:`~auditor.probe.clock.StepClock` closes steps into these on the training thread, and
resolves them into :class:`~auditor.samples.StepSample` off it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

# One booked segment: (phase, start mark, end mark, collective name or None).
Span = tuple[int, Any, Any, "str | None"]


NO_MEMORY: tuple[None, None, None] = (None, None, None)
# ``PendingStep`` from a tuple in one call (what ``PendingStep._make`` does, less its checks).
new_step = tuple.__new__


class PendingStep(NamedTuple):
    """A closed step whose device-side phase marks may still be in flight. Built on the hot
    path with ``tuple.__new__`` (one call, where a class's ``__init__`` runs a line a field)."""

    step: int
    wall_time: float
    step_s: float
    data_wait_s: float
    batch_size: int | None
    data_cpu_s: float | None
    # DDP gradient all-reduce wait (host clock); None: no DDP bucket seen this step.
    ddp_wait_s: float | None
    collectives_seen: bool
    spans: list[Span]
    # Bytes each collective carried this step (NCCL-tests' size: what the bus bandwidth is
    # computed from), by the name its time is booked under.
    coll_bytes: dict[str, int]
    memory: tuple[int | None, int | None, int | None]
    # The DataLoader batches of known size the step consumed (its micro-batches; several under
    # gradient accumulation); 1 where it saw none.
    micro_batches: int
    # Device timer only (None / empty with the host clock): the step's first mark and the next
    # step's, the marks around each data wait, the last bucket's launch and backward's end.
    start_mark: Any
    end_mark: Any
    data_marks: Sequence[tuple[Any, Any]]
    ddp_marks: tuple[Any, Any] | None
    # Marks of this step read by nothing (earlier buckets' launches): released with it.
    spare_marks: Sequence[Any]
    # Host seconds spent starting the loader's workers in this step (0.0: none started).
    loader_start_s: float

    def marks(self) -> list[Any]:
        """Every mark the step's figures read."""
        out = [m for s in self.spans for m in (s[1], s[2])]
        out += [m for pair in self.data_marks for m in pair]
        if self.ddp_marks is not None:
            out += self.ddp_marks
        if self.start_mark is not None:
            out += (self.start_mark, self.end_mark)
        return out
