"""Recordings: a versioned JSON-lines file of everything a run saw, and its replay.

Format ``auditor.recording/v2``: the first line is a header object
``{"schema": "auditor.recording/v2", "created": <epoch s>, "job": ..., "meta": {...}}``; every
other line is one record with a ``"t"`` type:

* ``{"t": "rank", "info": {RankInfo}}``            a rank's identity (repeated when it changes)
* ``{"t": "step", ...StepSample fields}``          one training step of one rank
  (``micro_batches`` only where the step accumulated several; absent reads as 1; ``outside``
  only where the probe named work outside the phases)
* ``{"t": "process", ...ProcessCpu fields}``       CPU of a rank's main process and its workers
* ``{"t": "node", ...NodeCpu fields}``             a node's CPU
* ``{"t": "device", ...DeviceSample fields}``      one NVML read of one GPU
* ``{"t": "ended", "rank": r}``                    a rank's connection closed
* ``{"t": "memory", ...MemoryBudget fields}``      a rank's measured memory budget (when it
  changed; readers that predate it skip it)
* ``{"t": "flops", ...FlopCount fields}``          a rank's FLOPs per step, counted on a sampled
  step (readers that predate it skip it); the counted step's record has ``"flops_counted": true``
  (absent on every other step); a step's ``collective_bytes`` only where its collectives
  carried known bytes, its ``loader_start_s`` only where it started DataLoader workers

v2 differs from v1 in one meaning: a step's ``backward_s`` excludes the collective wait (the
phases are exclusive, see :class:`~auditor.samples.StepSample`); v1 steps counted it inside
``backward_s``, and the reader takes it out, so both read the same.

Readers skip record types they do not know (newer writers may add some). A malformed or
truncated line is reported with its line number and skipped: whatever is readable is kept.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from auditor.samples import (
    Batch,
    DeviceSample,
    FlopCount,
    MemoryBudget,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)

SCHEMA = "auditor.recording/v2"
# v1: ``backward_s`` included the collective wait (converted on read).
SCHEMA_V1 = "auditor.recording/v1"
SCHEMAS = (SCHEMA, SCHEMA_V1)


class RecordingError(ValueError):
    """A recording that cannot be read at all (missing, empty, not a recording)."""


@dataclass
class Recording:
    """A parsed recording: its header, its samples as one :class:`Batch`, and the bad lines."""

    header: dict[str, Any]
    batch: Batch
    problems: list[str] = field(default_factory=list)

    @property
    def job(self) -> str:
        return str(self.header.get("job", ""))


def batch_records(batch: Batch) -> Iterator[dict[str, Any]]:
    """The records of one batch, in the order a reader needs them (identities first)."""
    for info in batch.infos:
        yield {"t": "rank", "info": info.to_dict()}
    for s in batch.steps:
        row = _single(_single(asdict(s), "count"), "micro_batches")
        if row.get("outside") is None:
            row.pop("outside", None)  # nothing named outside the phases: the older shape
        if not row.get("flops_counted"):
            row.pop("flops_counted", None)  # only the step whose FLOPs were counted says so
        if row.get("collective_bytes") is None:
            row.pop("collective_bytes", None)  # no bytes known: the older shape
        if row.get("loader_start_s") is None:
            row.pop("loader_start_s", None)  # no workers started in the step: the older shape
        yield {"t": "step", **row}
    for c in batch.processes:
        row = asdict(c)
        for name in ("main_wait", "worker_wait"):
            if row[name] is None:
                del row[name]  # not measured: the older shape
        yield {"t": "process", **row}
    for n in batch.nodes:
        yield {"t": "node", **_single(asdict(n), "samples")}
    for d in batch.devices:
        yield {"t": "device", **d.to_dict()}
    for r in batch.ended:
        yield {"t": "ended", "rank": r}
    for m in batch.memory:
        yield {"t": "memory", **m.to_dict()}
    for f in batch.flops:
        yield {"t": "flops", **f.to_dict()}


def _single(row: dict[str, Any], field: str) -> dict[str, Any]:
    """Drops ``field`` when it is 1 (a live sample stands for itself): recordings keep the shape
    they had before aggregated samples existed."""
    if row.get(field) == 1:
        del row[field]
    return row


class RecordingWriter:
    """Appends batches to a recording; each write is flushed so a crash loses at most a line."""

    def __init__(
        self, path: str | os.PathLike[str], *, job: str = "", meta: dict[str, Any] | None = None
    ) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (kept open)
        self._lock = threading.Lock()
        header = {"schema": SCHEMA, "created": time.time(), "job": job, "meta": meta or {}}
        self._write_line(header)

    def _write_line(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps(record, separators=(",", ":")) + "\n")

    def write(self, batch: Batch) -> None:
        with self._lock:
            if self._f.closed:
                return
            for record in batch_records(batch):
                self._write_line(record)
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()


def write_recording(
    path: str | os.PathLike[str],
    batches: Iterable[Batch],
    *,
    job: str = "",
    meta: dict[str, Any] | None = None,
) -> None:
    w = RecordingWriter(path, job=job, meta=meta)
    try:
        for b in batches:
            w.write(b)
    finally:
        w.close()


def read_recording(path: str | os.PathLike[str]) -> Recording:
    """Parse a recording. Raises :class:`RecordingError` only if nothing usable is there."""
    p = Path(path)
    try:
        f = open(p, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise RecordingError(f"{p}: cannot open: {exc.strerror or exc}") from None
    infos: dict[int, RankInfo] = {}
    steps: list[StepSample] = []
    procs: list[ProcessCpu] = []
    nodes: list[NodeCpu] = []
    devices: list[DeviceSample] = []
    ended: list[int] = []
    memory: list[MemoryBudget] = []
    flops: list[FlopCount] = []
    problems: list[str] = []
    header: dict[str, Any] | None = None
    with f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                if header is None:
                    raise RecordingError(
                        f"{p}:{lineno}: not an auditor recording ({exc})"
                    ) from None
                truncated = not line.endswith("\n")
                what = "truncated line" if truncated else f"malformed line ({exc})"
                problems.append(f"{p}:{lineno}: {what}")
                continue
            if header is None:
                if rec.get("schema") not in SCHEMAS:
                    raise RecordingError(
                        f"{p}:{lineno}: not an auditor recording (schema {rec.get('schema')!r}, "
                        f"expected {SCHEMA!r})"
                    )
                header = rec
                continue
            try:
                kind = rec.get("t")
                body = {k: v for k, v in rec.items() if k != "t"}
                if kind == "rank":
                    info = RankInfo.from_dict(body["info"])
                    infos[info.rank] = info
                elif kind == "step":
                    step = StepSample(**body)
                    if header.get("schema") == SCHEMA_V1:
                        step = step.with_wait_out_of_backward()
                    steps.append(step)
                elif kind == "process":
                    procs.append(ProcessCpu.from_dict(body))
                elif kind == "node":
                    nodes.append(NodeCpu.from_dict(body))
                elif kind == "device":
                    devices.append(DeviceSample.from_dict(body))
                elif kind == "ended":
                    ended.append(int(body["rank"]))
                elif kind == "memory":
                    memory.append(MemoryBudget.from_dict(body))
                elif kind == "flops":
                    flops.append(FlopCount.from_dict(body))
                # Unknown types: a newer writer; skip silently.
            except (KeyError, TypeError, ValueError) as exc:
                problems.append(f"{p}:{lineno}: bad {rec.get('t')!r} record ({exc})")
    if header is None:
        raise RecordingError(f"{p}: empty file, not an auditor recording")
    batch = Batch(
        infos=tuple(infos.values()),
        steps=tuple(steps),
        processes=tuple(procs),
        nodes=tuple(nodes),
        devices=tuple(devices),
        ended=tuple(ended),
        memory=tuple(memory),
        flops=tuple(flops),
    )
    return Recording(header=header, batch=batch, problems=problems)
