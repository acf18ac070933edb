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
"""

from __future__ import annotations

import argparse
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
        self.steps = 0
        self.first: float | None = None
        self.last: float | None = None

    @property
    def on(self) -> bool:
        return time.time() >= self.at

    def step_done(self) -> None:
        now = time.time()
        if now < self.at:
            return
        if self.first is None:
            self.first = now
        else:
            self.steps += 1
        self.last = now

    def report(self) -> None:
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
