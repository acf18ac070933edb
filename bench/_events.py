"""Reading ``auditor run --events`` streams: when each live finding first existed.

Each verdict line carries the wall time at which the live judge produced it, on this machine's
clock, the same clock as the job's ``FAULT_ONSET <epoch>``: detection is read from there, not
from when a terminal line happened to be printed or read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

SEVERE = ("warning", "critical")


@dataclass(frozen=True)
class Appearance:
    """A finding (kind, blamed ranks) as it first appeared in the live stream."""

    kind: str
    ranks: tuple[int, ...]
    time: float
    severity: str
    predicted_speedup: float | None
    actions: tuple[dict[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.kind} {','.join(map(str, self.ranks))}".strip()


@dataclass
class Stream:
    """One run's stream, read back."""

    start: float | None = None
    first_verdict: float | None = None
    # In order: every appearance, and every change of severity of a finding already there.
    appearances: list[Appearance] = field(default_factory=list)
    final: list[dict[str, Any]] | None = None  # the final verdict's findings
    bad_lines: int = 0

    def first(
        self, match: Callable[[Appearance], bool], *, after: float | None = None
    ) -> Appearance | None:
        """The first appearance that ``match`` accepts, at or after ``after`` where given."""
        for a in self.appearances:
            if (after is None or a.time >= after) and match(a):
                return a
        return None

    def first_seen(self) -> dict[str, float]:
        """Each (kind, ranks) and when it first appeared."""
        seen: dict[str, float] = {}
        for a in self.appearances:
            seen.setdefault(a.key, a.time)
        return seen


def parse(lines: Iterable[str]) -> Stream:
    s = Stream()
    for raw in lines:
        raw = raw.strip()
        if not raw:
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            s.bad_lines += 1  # a line cut short by a killed run
            continue
        event = rec.get("event")
        t = float(rec.get("time") or 0.0)
        if event == "start":
            s.start = t
        elif event == "verdict":
            if s.first_verdict is None:
                s.first_verdict = t
            # A severity that moved counts as a new appearance at that severity.
            for f in [*(rec.get("appeared") or ()), *(rec.get("changed") or ())]:
                s.appearances.append(
                    Appearance(
                        kind=str(f.get("kind")),
                        ranks=tuple(int(r) for r in f.get("ranks") or ()),
                        time=t,
                        severity=str(f.get("severity")),
                        predicted_speedup=f.get("predicted_speedup"),
                        actions=tuple(f.get("actions") or ()),
                    )
                )
        elif event == "final":
            s.final = list(rec.get("findings") or ())
    return s


def read(path: str) -> Stream:
    try:
        with open(path, encoding="utf-8") as f:
            return parse(f)
    except OSError:
        return Stream()
