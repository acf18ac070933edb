"""What every fault job of ``bench/faults.py`` shares: when its fault starts, the fixes it was
told to apply, and the rate it trained at once the fault was on.

* ``FAULT_ONSET <epoch seconds> rank=<r>``: printed up front by the faulty rank, the wall-clock
  time its fault starts (the benchmark's detection latency starts there).
* ``--fix RANK.LEVER=VALUE`` (repeatable): a typed fix of the auditor's report
  (:class:`auditor.analysis.fixes.Fix`) as the job's own knob. ``VALUE`` ``none`` means "remove
  it" (``rank_work``, ``loading_cost``, ``memory_release``: the rank's extra work, slow loading or
  extra memory). Each job says which levers it knows; the rest are listed as not applied.
* ``FAULT_RATE steps=<n> seconds=<s> rate=<steps/s>``: printed by rank 0 at the end, the job's
  step rate from the onset to the end (ranks of a DDP job step together, so rank 0's rate is the
  job's). The benchmark's achieved speed-up is the ratio of two runs' rates.
* ``FAULT_STEP step=<i> steps=<n> rank=<r>``: printed by the faulty rank at the end, the index
  (from 0) of its first step that began after the onset, of the ``n`` steps it ran: where a
  finding that places a change in the run (``slowdown``) should place it.
* ``FAULT_MEMORY bytes_per_step=<b> bytes_per_s=<b> steps=<n> rank=<r>``: printed by a rank
  that traced its own memory (:class:`MemoryTrace`: its resident set, read from
  ``/proc/self/statm`` after every step from the onset on), the least-squares slope of that
  memory against its steps and against the wall clock: the rate a ``memory_growth`` finding
  should give.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.distributed as dist


def parser(**defaults: object) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=defaults.get("seconds", 20.0))
    p.add_argument("--fault-after", type=float, default=defaults.get("fault_after", 6.0))
    p.add_argument("--fault-rank", type=int, default=defaults.get("fault_rank", 1))
    p.add_argument("--batch-size", type=int, default=defaults.get("batch_size", 32))
    p.add_argument("--workers", type=int, default=defaults.get("workers", 1))
    p.add_argument("--fix", action="append", default=[], metavar="RANK.LEVER=VALUE")
    return p


def _value(text: str) -> object:
    low = text.strip().lower()
    if low in ("none", "null", ""):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


@dataclass
class Fixes:
    """The ``--fix`` options, per rank: lever -> value."""

    by_rank: dict[int, dict[str, object]] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Sequence[str]) -> Fixes:
        out = cls()
        for spec in specs:
            head, _, value = spec.partition("=")
            rank, _, lever = head.partition(".")
            out.by_rank.setdefault(int(rank), {})[lever] = _value(value)
        return out

    def has(self, rank: int, lever: str) -> bool:
        return lever in self.by_rank.get(rank, {})

    def get(self, rank: int, lever: str, default: object = None) -> object:
        return self.by_rank.get(rank, {}).get(lever, default)

    def say(self, rank: int, known: Sequence[str]) -> None:
        """One line per fix this rank was given: applied, or not a knob of this job."""
        for lever, value in self.by_rank.get(rank, {}).items():
            state = "applied" if lever in known else "not a knob of this job"
            print(f"FIX rank={rank} {lever}={value} {state}", flush=True)


class Onset:
    """The fault's start, announced by the faulty rank; the job's rate from there, by rank 0."""

    def __init__(self, rank: int, fault_rank: int, after_s: float, *, faulty: bool = True) -> None:
        self.rank = rank
        self.at = time.time() + after_s
        if faulty and rank == fault_rank:
            print(f"FAULT_ONSET {self.at:.6f} rank={rank}", flush=True)
        self.faulty_rank = faulty and rank == fault_rank
        self.steps = 0
        self.first: float | None = None
        self.last: float | None = None
        self.taken = 0  # steps this rank finished
        self.first_step: int | None = None  # the first step that began after the onset

    @property
    def on(self) -> bool:
        return time.time() >= self.at

    def step_begins(self) -> None:
        """Called as a step begins (before its data): the first one at or after the onset is
        the fault's step."""
        if self.first_step is None and time.time() >= self.at:
            self.first_step = self.taken

    def step_done(self) -> None:
        self.taken += 1
        now = time.time()
        if now < self.at:
            return
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now

    def report(self) -> None:
        if self.faulty_rank and self.first_step is not None:
            print(
                f"FAULT_STEP step={self.first_step} steps={self.taken} rank={self.rank}",
                flush=True,
            )
        if self.rank != 0:
            return
        if self.first is None or self.last is None or self.last <= self.first:
            print("FAULT_RATE steps=0 seconds=0 rate=0", flush=True)
            return
        secs = self.last - self.first
        print(
            f"FAULT_RATE steps={self.steps} seconds={secs:.3f} rate={self.steps / secs:.4f}",
            flush=True,
        )


class Stopper:
    """Rank 0 decides when to stop (every 5 steps), so ranks never disagree at a collective."""

    def __init__(self, seconds: float) -> None:
        import torch

        self.start = time.time()
        self.seconds = seconds
        self.flag = torch.zeros(1)

    def done(self, step: int) -> bool:
        if step % 5:
            return False
        self.flag.fill_(1.0 if time.time() - self.start >= self.seconds else 0.0)
        dist.broadcast(self.flag, src=0)
        return bool(self.flag.item())


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """The least-squares slope of ``ys`` against ``xs`` (None for fewer than 3 points)."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


class MemoryTrace:
    """A rank's own measure of how fast its memory climbs: its resident set after every step
    (``/proc/self/statm``, a few microseconds), from ``after`` on; :meth:`report` prints the
    slope against steps and against time (``FAULT_MEMORY``)."""

    def __init__(self, rank: int, after: float) -> None:
        self.rank, self.after = rank, after
        self.steps: list[float] = []
        self.times: list[float] = []
        self.bytes: list[float] = []

    def step_done(self, step: int) -> None:
        now = time.time()
        if now >= self.after:
            self.steps.append(step)
            self.times.append(now)
            self.bytes.append(_rss_bytes())

    def report(self) -> None:
        per_step = slope(self.steps, self.bytes)
        per_s = slope(self.times, self.bytes)
        if per_step is None or per_s is None:
            return
        print(
            f"FAULT_MEMORY bytes_per_step={per_step:.0f} bytes_per_s={per_s:.0f} "
            f"steps={len(self.steps)} rank={self.rank}",
            flush=True,
        )
