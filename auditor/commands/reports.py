"""The report commands: ``auditor analyze``, ``auditor report`` and ``auditor compare``.

:func:`analyze` re-runs the rules on a recording (``auditor run --record``) and prints the
verdict; :func:`report` writes the self-contained HTML report of a recording (or of a JSON
report); :func:`compare` puts two runs side by side (each a JSON report or a recording): the
measured speed-up against the one BEFORE's verdict predicted, and the findings that went, came
or remain. The CLI (:mod:`auditor.cli.reports`) builds their configs from argv and the
``AUDITOR_*`` twins, and prints an :class:`InputError` as one ``auditor: error: ...`` line.

Recordings are analysed the way the live run builds its final verdict: every sample in one
:class:`SampleStore`, a snapshot ending at the newest sample, ``--window None`` (the whole run)
unless asked otherwise, and the same report builder and verdict text.

Exit status: 0 when something was analysed; 1 when the input holds no sample at all; 3 when
``analyze --fail-on`` finds a finding that severe (:mod:`auditor.report.exit_status`); 2 with one
``auditor: error: ...`` line for a usage error or an input that is neither a report nor a
recording. Unreadable lines of a recording are named ``FILE:LINE`` on stderr, one line each, and
the rest is still analysed.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from auditor.analysis import SampleStore
from auditor.analysis.snapshot import Snapshot
from auditor.audit import Audit
from auditor.configs import AnalysisConfig, CompareConfig
from auditor.report.compare import compare_reports, render_compare
from auditor.report.exit_status import exit_status
from auditor.report.json_report import SCHEMA as REPORT_SCHEMA
from auditor.report.model import Report
from auditor.report.terminal import render_verdict
from auditor.telemetry.recorded import SCHEMA as RECORDING_SCHEMA
from auditor.telemetry.recorded import SCHEMAS as RECORDING_SCHEMAS
from auditor.telemetry.recorded import RecordingError, read_recording


class InputError(ValueError):
    """An input that cannot be used at all: printed as one line, exit status 2."""


@dataclass
class Loaded:
    """One input, as a report: from a JSON report, or analysed from a recording."""

    path: str
    kind: str  # "report" or "recording"
    report: Report
    # The whole run's samples, for the HTML time series (recordings only).
    series: Snapshot | None = None
    problems: list[str] = field(default_factory=list)
    samples: int = 0

    @property
    def empty(self) -> bool:
        return self.kind == "recording" and self.samples == 0


# --------------------------------------------------------------------------------------------
# commands


def analyze(cfg: AnalysisConfig, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``auditor analyze``: the verdict of a recording; 1 if it holds no sample."""
    out = out or sys.stdout
    err = err or sys.stderr
    loaded = load_input(cfg.input, window=cfg.window, overrides=cfg.overrides, want="recording")
    _print_problems(loaded, err)
    if cfg.html:
        _write_html(cfg.html, loaded, err)
    _print_report(loaded.report, json_out=cfg.json, out=out)
    return exit_status(_status(loaded, err), loaded.report, cfg.fail_on)


def report(cfg: AnalysisConfig, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``auditor report``: the HTML report of a recording or a JSON report (``cfg.html`` is
    required); 1 if a recording holds no sample."""
    if cfg.html is None:
        raise InputError("--html is required: where to write the HTML report")
    out = out or sys.stdout
    err = err or sys.stderr
    loaded = load_input(cfg.input, window=cfg.window, overrides=cfg.overrides)
    _print_problems(loaded, err)
    _write_html(cfg.html, loaded, err)
    _print_report(loaded.report, json_out=cfg.json, out=out)
    return _status(loaded, err)


def compare(cfg: CompareConfig, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``auditor compare``: two runs side by side; 1 if a recording holds no sample."""
    out = out or sys.stdout
    err = err or sys.stderr
    before = load_input(cfg.before)
    after = load_input(cfg.after)
    for loaded in (before, after):
        _print_problems(loaded, err)
    result = compare_reports(
        before.report, after.report, before_source=before.path, after_source=after.path
    )
    if cfg.json:
        print(json.dumps(result, indent=2), file=out, flush=True)
    else:
        print(render_compare(result), file=out, flush=True)
    code = 0
    for loaded in (before, after):
        if loaded.empty:
            print(f"auditor: error: {loaded.path}: the recording holds no sample", file=err)
            code = 1
    return code


# --------------------------------------------------------------------------------------------
# inputs


def load_input(
    path: str,
    *,
    window: float | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    want: str | None = None,
) -> Loaded:
    """A JSON report or a recording, told apart by content (not by file name)."""
    kind = sniff(path)
    if want is not None and kind != want:
        raise InputError(
            f"{path}: is a JSON report, not a recording; analyze needs the samples that "
            "'auditor run --record PATH' writes"
        )
    if kind == "report":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            report = Report.from_dict(data, source=path)
        except (OSError, ValueError) as exc:
            raise InputError(str(exc)) from None
        return Loaded(path=path, kind="report", report=report)
    return analyze_recording(path, window=window, overrides=overrides)


def sniff(path: str) -> str:
    """``"report"`` or ``"recording"``; :class:`InputError` for anything else."""
    p = Path(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            first = ""
            for line in fh:
                if line.strip():
                    first = line
                    break
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    if not first:
        raise InputError(f"{path}: empty file, not an auditor report or recording")
    try:
        head = json.loads(first)
    except ValueError:
        head = None
    if isinstance(head, dict) and head.get("schema") in RECORDING_SCHEMAS:
        return "recording"
    if isinstance(head, dict) and head.get("schema") == REPORT_SCHEMA:
        return "report"  # a report on one line
    if first.lstrip().startswith("{") and head is None:
        try:
            doc = json.loads(p.read_text(encoding="utf-8", errors="replace"))
        except ValueError:
            doc = None
        if isinstance(doc, dict) and doc.get("schema") == REPORT_SCHEMA:
            return "report"
        if isinstance(doc, dict) and "schema" in doc:
            raise InputError(
                f"{path}: not an auditor report or recording (schema {doc['schema']!r})"
            )
    found = f"schema {head['schema']!r}" if isinstance(head, dict) and "schema" in head else ""
    raise InputError(
        f"{path}:1: not an auditor report or recording"
        + (f" ({found}, expected {REPORT_SCHEMA!r} or {RECORDING_SCHEMA!r})" if found else "")
    )


def analyze_recording(
    path: str,
    *,
    window: float | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Loaded:
    """The report the live run would have built from these samples (its final verdict)."""
    try:
        rec = read_recording(path)
    except RecordingError as exc:
        raise InputError(str(exc)) from None
    # The same pipeline as the live run (warm-up skip included): a replay gives its verdict.
    audit = Audit(rec.job, window_s=window, overrides=overrides)
    audit.add(rec.batch)
    store = audit.store
    b = rec.batch
    samples = len(b.steps) + len(b.processes) + len(b.nodes) + len(b.devices)
    now = store.latest_time()
    meta = rec.header.get("meta") if isinstance(rec.header.get("meta"), dict) else {}
    assert isinstance(meta, dict)
    command = [str(c) for c in meta.get("command") or ()]
    notes: list[str] = []
    if rec.problems:
        n = len(rec.problems)
        notes.append(f"{n} unreadable line{'' if n == 1 else 's'} of the recording skipped")
    if window is not None:
        notes.append(f"findings judge the last {window:g} s of the recording")
    series: Snapshot | None = None
    if now is None:
        now = float(rec.header.get("created") or 0.0)
        notes.append("the recording holds no training step")
    else:
        series = store.snapshot(now, None)
    try:
        report = audit.report(
            command=command,
            exit_code=None,
            duration_s=_duration(rec.header, store, now),
            notes=notes,
            now=now,
            window_s=window,
        )
    except ValueError as exc:
        raise InputError(f"--set: {exc}") from None
    return Loaded(
        path=path,
        kind="recording",
        report=report,
        series=series,
        problems=list(rec.problems),
        samples=samples,
    )


def _duration(header: Mapping[str, Any], store: SampleStore, now: float) -> float:
    """Seconds the run lasted as far as the recording tells: from its creation to the last
    sample (the live run counts from its start, a moment before the recording opens)."""
    created = header.get("created")
    if isinstance(created, (int, float)) and math.isfinite(created) and created <= now:
        return now - float(created)
    first = store.first_time()
    return now - first if first is not None else 0.0


# --------------------------------------------------------------------------------------------
# helpers


def _print_problems(loaded: Loaded, err: TextIO) -> None:
    for problem in loaded.problems:
        print(f"auditor: error: {problem}; skipped", file=err)


def _print_report(report: Report, *, json_out: bool, out: TextIO) -> None:
    if json_out:
        print(json.dumps(report.to_dict(), indent=2), file=out, flush=True)
    else:
        print(render_verdict(report), file=out, flush=True)


def _write_html(path: str, loaded: Loaded, err: TextIO) -> None:
    from auditor.report.html import write_html  # plotly is imported only when needed

    try:
        write_html(
            path, loaded.report, series=loaded.series, source=loaded.path, problems=loaded.problems
        )
    except OSError as exc:
        raise InputError(f"{path}: cannot write the HTML report: {exc.strerror or exc}") from None
    print(f"auditor: wrote the HTML report to {path}", file=err, flush=True)


def _status(loaded: Loaded, err: TextIO) -> int:
    if loaded.empty:
        print(f"auditor: error: {loaded.path}: the recording holds no sample", file=err)
        return 1
    return 0
