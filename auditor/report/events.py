"""``auditor run --events FILE``: the live verdict as a machine-readable stream (JSON lines).

One line per change of the live verdict, written when the live judge runs (every
``--live-interval``) and flushed at once, so a reader tailing the file sees a finding the moment
the auditor first holds it::

    {"event": "start", "time": 1732650000.12, "job": "train", "command": [...],
     "schema": "auditor.events/v1"}
    {"event": "verdict", "time": 1732650004.31, "job": "train", "window": {"start", "end"},
     "ranks": 2, "appeared": [FINDING, ...], "changed": [FINDING, ...],
     "disappeared": [{"kind", "ranks", "severity"}, ...], "findings": [{"kind", "ranks",
     "severity"}, ...]}
    ...
    {"event": "final", "time": ..., "job": "train", "exit_code": 0, "interrupted": false,
     "findings": [FINDING, ...]}

A finding is known by its kind and the ranks it blames: ``appeared`` holds each one that was not
in the previous verdict, ``disappeared`` each one that left it, ``changed`` each one whose
severity moved. The first verdict judged is always written (``appeared`` may be empty), so a
reader knows from when the job was judged. ``findings`` is the whole live verdict after the
change. FINDING is the JSON report's form of a finding (``kind``, ``severity``, ``ranks``,
``summary``, ``fixes`` in words per rank, ``predicted_speedup``, ``cause`` and ``actions``: the
typed fixes, :meth:`auditor.analysis.fixes.Fix.to_dict`), without its ``evidence``. The last
line is the final verdict over the whole run, the one the JSON report holds. Times are
wall-clock seconds (epoch) on this node's clock.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from typing import IO, Any

from auditor.analysis.findings import Finding
from auditor.report.model import Report, ReportFinding

SCHEMA = "auditor.events/v1"

Key = tuple[str, tuple[int, ...]]


def _key(kind: str, ranks: Sequence[int]) -> Key:
    return kind, tuple(ranks)


def finding_event(finding: ReportFinding) -> dict[str, Any]:
    """A finding as a stream line carries it: the report's form without ``evidence``."""
    d = finding.to_dict()
    d.pop("evidence", None)
    return d


def _brief(kind: str, ranks: Sequence[int], severity: str) -> dict[str, Any]:
    return {"kind": kind, "ranks": list(ranks), "severity": severity}


def _finite(x: float) -> float | None:
    return round(x, 3) if math.isfinite(x) else None


class EventStream:
    """Writes the stream to an open text file; the caller opens it (so that a path that cannot
    be written is refused before the job starts) and :meth:`close` closes it. A write that fails
    later (a full disk) stops the stream and is kept in :attr:`error`: the job goes on."""

    def __init__(self, f: IO[str], job: str, *, clock: Any = time.time) -> None:
        self._f: IO[str] | None = f
        self.job = job
        self._clock = clock
        self._live: dict[Key, str] | None = None  # None: no verdict judged yet
        self.error: OSError | None = None
        self.lines = 0

    @classmethod
    def open(cls, path: str, job: str) -> EventStream:
        """Opens (truncates) ``path``; raises :class:`OSError` where it cannot be written."""
        return cls(open(path, "w", encoding="utf-8"), job)  # closed in close()

    def _write(self, record: dict[str, Any]) -> None:
        if self._f is None:
            return
        try:
            self._f.write(json.dumps(record, allow_nan=False) + "\n")
            self._f.flush()
            self.lines += 1
        except OSError as exc:
            self.error = exc
            self._quietly_close()

    def start(self, command: Sequence[str]) -> None:
        self._write(
            {
                "event": "start",
                "time": self._clock(),
                "job": self.job,
                "command": list(command),
                "schema": SCHEMA,
            }
        )

    def verdict(
        self,
        findings: Sequence[Finding],
        *,
        window: tuple[float, float] | None = None,
        ranks: int | None = None,
    ) -> bool:
        """One live verdict: written where it differs from the previous one (and for the first
        one); returns whether a line was written."""
        now = {_key(f.kind, f.ranks): f for f in findings}
        before = self._live
        if before is not None and {k: f.severity for k, f in now.items()} == before:
            return False
        before = before or {}
        appeared = [f for k, f in now.items() if k not in before]
        changed = [f for k, f in now.items() if k in before and before[k] != f.severity]
        gone = [_brief(k[0], k[1], sev) for k, sev in before.items() if k not in now]
        record: dict[str, Any] = {"event": "verdict", "time": self._clock(), "job": self.job}
        if window is not None:
            record["window"] = {"start": _finite(window[0]), "end": _finite(window[1])}
        if ranks is not None:
            record["ranks"] = ranks
        record |= {
            "appeared": [finding_event(ReportFinding.of(f)) for f in appeared],
            "changed": [finding_event(ReportFinding.of(f)) for f in changed],
            "disappeared": gone,
            "findings": [_brief(f.kind, f.ranks, f.severity) for f in findings],
        }
        self._live = {k: f.severity for k, f in now.items()}
        self._write(record)
        return True

    def final(self, report: Report) -> None:
        """The last line: the final verdict, as the JSON report holds it."""
        self._write(
            {
                "event": "final",
                "time": self._clock(),
                "job": self.job,
                "exit_code": report.job.exit_code,
                "interrupted": report.job.interrupted,
                "findings": [finding_event(f) for f in report.findings],
            }
        )

    def _quietly_close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        self._quietly_close()
