"""A rank's whole run as series over steps, bounded in memory: what the rules that judge a run
over time read (memory that climbs, a rank that turned slow).

The sample store keeps the latest steps (its window) and the run's totals (the account); neither
says *when* something changed. :class:`RankHistory` keeps every step of the run folded into at
most ``max_buckets`` consecutive buckets of equal width in steps: while the run is short each
bucket is one step; when the buckets are full, neighbours are merged pairwise and the width
doubles. A run of a week costs what a run of a few minutes does (bounded, well under 1 MB a
rank: ``bench/history_cost.py``), and a
change is placed within one bucket: ``1/max_buckets`` to ``2/max_buckets`` of the run's steps.

Per bucket: its steps, the wall-clock time its first step started and its last step ended, the
summed time of each phase (means per step are read back), and the memory figures at its last
step (a level, not a sum: memory is judged where it stands). ``count`` > 1 samples (serve's
per-scrape means) weigh as the steps they stand for.

Pure data: no clock, no I/O. The store adds each step as it arrives (O(1) amortised).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from auditor.samples import StepSample

# Buckets kept per rank (each a few hundred bytes with its float objects). A change is placed
# within 0.2-0.4% of the run's steps.
MAX_BUCKETS = 512
# The per-step figures a bucket sums, as ``StepSample`` names them (``other_s``: time in no
# phase; ``local_s``: the step less its wait for peers, the rank's own time).
SUMMED = (
    "step_s",
    "data_wait_s",
    "h2d_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "collective_wait_s",
    "other_s",
    "local_s",
)
# Memory levels a bucket keeps (its last step's; None: not measured).
LEVELS = ("rss_bytes", "mem_allocated_bytes", "mem_reserved_bytes")


@dataclass(slots=True)
class Bucket:
    """Consecutive steps of one rank, folded (mutable while the history fills it)."""

    first_step: int
    last_step: int
    start: float
    end: float
    steps: int = 0
    step_s: float = 0.0
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    collective_wait_s: float = 0.0
    other_s: float = 0.0
    local_s: float = 0.0
    # Steps whose collective wait was measured (the rest count their wait as unknown).
    waits_measured: int = 0
    # Samples of the steps whose batch is known, and those steps (:attr:`batch`).
    samples: float = 0.0
    batches_measured: int = 0
    rss_bytes: float | None = None
    mem_allocated_bytes: float | None = None
    mem_reserved_bytes: float | None = None

    @classmethod
    def of(cls, s: StepSample) -> Bucket:
        b = cls(s.step, s.step, s.time - s.step_s * s.count, s.time)
        b.add(s)
        return b

    def add(self, s: StepSample) -> None:
        n = s.count
        self.last_step = max(self.last_step, s.step)
        self.end = max(self.end, s.time)
        self.steps += n
        self.step_s += s.step_s * n
        self.data_wait_s += s.data_wait_s * n
        self.h2d_s += s.h2d_s * n
        self.forward_s += s.forward_s * n
        self.backward_s += s.backward_s * n
        self.optimizer_s += s.optimizer_s * n
        wait = s.collective_wait_s
        if wait is not None:
            self.collective_wait_s += wait * n
            self.waits_measured += n
        self.other_s += s.other_s * n
        self.local_s += (s.step_s - (wait or 0.0)) * n
        if s.batch_size is not None:
            self.samples += s.batch_size * n
            self.batches_measured += n
        for name in LEVELS:
            value = getattr(s, name)
            if value is not None:
                setattr(self, name, float(value))

    def merge(self, later: Bucket) -> None:
        """Fold ``later`` (the next bucket in the run) into this one."""
        self.last_step = later.last_step
        self.end = max(self.end, later.end)
        self.steps += later.steps
        self.waits_measured += later.waits_measured
        self.samples += later.samples
        self.batches_measured += later.batches_measured
        for name in SUMMED:
            setattr(self, name, getattr(self, name) + getattr(later, name))
        for name in LEVELS:
            value = getattr(later, name)
            if value is not None:
                setattr(self, name, value)

    def mean(self, name: str) -> float:
        """Seconds per step of a summed figure (:data:`SUMMED`) over the bucket."""
        return getattr(self, name) / self.steps if self.steps else 0.0

    @property
    def batch(self) -> float | None:
        """Samples per step over the steps whose batch is known (None: none was)."""
        return self.samples / self.batches_measured if self.batches_measured else None

    @property
    def mid_step(self) -> float:
        return (self.first_step + self.last_step) / 2

    def copy(self) -> Bucket:
        return Bucket(**{f.name: getattr(self, f.name) for f in fields(self)})


class RankHistory:
    """One rank's run, folded into at most ``max_buckets`` buckets of ``width`` steps each (the
    last one filling)."""

    def __init__(self, rank: int, *, max_buckets: int = MAX_BUCKETS) -> None:
        if max_buckets < 4 or max_buckets % 2:
            raise ValueError("max_buckets must be an even number of at least 4")
        self.rank = rank
        self.max_buckets = max_buckets
        self.width = 1
        self._buckets: list[Bucket] = []

    def add(self, s: StepSample) -> None:
        last = self._buckets[-1] if self._buckets else None
        if last is not None and last.steps < self.width:
            last.add(s)
            return
        if len(self._buckets) >= self.max_buckets:
            self._halve()
            last = self._buckets[-1]
            if last.steps < self.width:
                last.add(s)
                return
        self._buckets.append(Bucket.of(s))

    def _halve(self) -> None:
        # New buckets, never the old ones changed: a full bucket is never changed again, so
        # frozen copies share them (only the filling last bucket is copied).
        merged: list[Bucket] = []
        for i in range(0, len(self._buckets) - 1, 2):
            a = self._buckets[i].copy()
            a.merge(self._buckets[i + 1])
            merged.append(a)
        if len(self._buckets) % 2:
            merged.append(self._buckets[-1])
        self._buckets = merged
        self.width *= 2

    @property
    def buckets(self) -> tuple[Bucket, ...]:
        """The buckets in step order (shared: do not change them)."""
        return tuple(self._buckets)

    @property
    def steps(self) -> int:
        return sum(b.steps for b in self._buckets)

    def frozen(self) -> RankHistory:
        """A copy that later steps do not change (what a snapshot holds): the full buckets
        are shared (the history never changes one), the filling last one is copied."""
        out = RankHistory(self.rank, max_buckets=self.max_buckets)
        out.width = self.width
        out._buckets = self._buckets[:-1] + [b.copy() for b in self._buckets[-1:]]
        return out

    @classmethod
    def of(
        cls, rank: int, steps: Sequence[StepSample], *, max_buckets: int = MAX_BUCKETS
    ) -> RankHistory:
        """The history of ``steps`` (in step order): tests and recordings."""
        out = cls(rank, max_buckets=max_buckets)
        for s in steps:
            out.add(s)
        return out
