"""The report as a typed object: what an audit produces and what every renderer reads.

:class:`Report` is one run's verdict: the job (:class:`JobSummary`, with the job's work done,
:class:`MfuEntry`), one :class:`RankEntry` per rank (with its :class:`MemoryEntry` and measured
:class:`BudgetEntry`, and its counted FLOPs, :class:`FlopsEntry`), the findings
(:class:`ReportFinding`), the notes, and for a job that spans several nodes its
:class:`NodeEntry` list and :class:`DeadRank` list. :class:`~auditor.audit.Audit` builds it
(:func:`auditor.report.json_report.make_report`); the terminal verdict, the HTML page and
``compare`` render it; :meth:`Report.to_dict` is the JSON document (schema
``auditor.report/v2``, described in :mod:`auditor.report.json_report`) and
:meth:`Report.from_dict` reads one back, so a saved report renders exactly as the live one.

Values are what the JSON holds (rounded as written, ``None`` for what was not measured), so
``Report.from_dict(r.to_dict()) == r``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from auditor.analysis.accounting import Account
from auditor.analysis.findings import Finding, severity_key
from auditor.analysis.fixes import Fix
from auditor.report.measured import BudgetEntry, FlopsEntry, MemoryEntry, MfuEntry
from auditor.report.phrasing import phrase

SCHEMA = "auditor.report/v2"
# Older documents this version still reads (``compare``, ``--apply``): v1 has no typed fixes.
SCHEMA_V1 = "auditor.report/v1"
SCHEMAS = (SCHEMA, SCHEMA_V1)

JOB_KEYS = (
    "name",
    "command",
    "exit_code",
    "world_size",
    "parallel_mode",
    "duration_s",
    "interrupted",
    "hosts",
)
RANK_KEYS = (
    "rank",
    "host",
    "local_rank",
    "pid",
    "device",
    "parallel_mode",
    "steps",
    "window_steps",
    "step_s",
    "data_wait_s",
    "h2d_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "collective_wait_s",
    "collective_ops",
    "compute_s",
    "data_wait_ratio",
    "busy_ratio",
    "batch_size",
    "samples_per_s",
    "main_cpu",
    "worker_cpu",
    "workers",
    "loader",
    "memory",
    "flops",
    "unmeasured",
    "off_thread_collectives",
    "ended",
    "time",
    "applied",
    "not_applied",
)
MEMORY_KEYS = ("rss_bytes", "allocated_bytes", "peak_bytes", "budget")
TOP_KEYS = ("schema", "generated_at", "job", "ranks", "findings", "notes")


# --------------------------------------------------------------------------------------------
# the parts


@dataclass(frozen=True)
class RankEntry:
    """One rank: per-step medians over the window (``window_steps`` steps), the step, data wait
    and collective wait at the rank's pace (:meth:`RankStats.paced`); ``steps`` over the whole
    run; ``None`` for anything not measured."""

    rank: int
    host: str | None = None
    local_rank: int | None = None
    pid: int | None = None
    device: str | None = None
    parallel_mode: str | None = None
    steps: int | None = None
    window_steps: int | None = None
    step_s: float | None = None
    data_wait_s: float | None = None
    h2d_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    collective_wait_s: float | None = None
    collective_ops: Mapping[str, float | None] | None = None
    compute_s: float | None = None
    data_wait_ratio: float | None = None
    busy_ratio: float | None = None
    batch_size: float | None = None
    samples_per_s: float | None = None
    main_cpu: float | None = None
    worker_cpu: float | None = None
    workers: int | None = None
    loader: Mapping[str, Any] | None = None
    memory: MemoryEntry = field(default_factory=MemoryEntry)
    # The rank's counted FLOPs, FLOP/s and MFU; None where it counted none (a CPU job counts
    # too: FLOP/s, no MFU), and in reports from before it.
    flops: FlopsEntry | None = None
    unmeasured: tuple[str, ...] = ()
    off_thread_collectives: int | None = None
    ended: bool = False
    # Where the rank's whole run went, every second once (``analysis.accounting``); None in
    # reports from before it, or where the run's samples could not make one.
    time: Account | None = None
    # ``auditor run --apply``: the loader levers the probe moved on this rank ({"lever", "from",
    # "to"}) and those planned that it did not ({"lever", "value", "reason"}), both empty on a
    # run without a plan (``auditor.report.applied``).
    applied: tuple[Mapping[str, Any], ...] = ()
    not_applied: tuple[Mapping[str, Any], ...] = ()

    @property
    def budget(self) -> BudgetEntry | None:
        return self.memory.budget

    @property
    def loader_workers(self) -> Any:
        """The DataLoader's configured ``num_workers``, where the probe saw the loader."""
        return None if self.loader is None else self.loader.get("num_workers")

    @property
    def mfu(self) -> float | None:
        """The rank's MFU, where counted on a GPU the peak table knows."""
        return None if self.flops is None else self.flops.mfu

    @property
    def flops_per_s(self) -> float | None:
        return None if self.flops is None else self.flops.flops_per_s

    @property
    def timed(self) -> bool:
        """Whether the rank has a measured step time."""
        return self.step_s is not None and self.step_s > 0

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["memory"] = self.memory.to_dict()
        out["flops"] = None if self.flops is None else self.flops.to_dict()
        out["unmeasured"] = list(self.unmeasured)
        out["collective_ops"] = None if self.collective_ops is None else dict(self.collective_ops)
        out["loader"] = None if self.loader is None else dict(self.loader)
        out["time"] = None if self.time is None else self.time.to_dict()
        out["applied"] = [dict(a) for a in self.applied]
        out["not_applied"] = [dict(a) for a in self.not_applied]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankEntry:
        values: dict[str, Any] = {f.name: d.get(f.name) for f in fields(cls)}
        values["rank"] = d.get("rank", 0)
        # A report from before window_steps existed: its steps were the window's.
        values["window_steps"] = d["window_steps"] if "window_steps" in d else d.get("steps")
        memory = d.get("memory")
        values["memory"] = MemoryEntry.from_dict(memory if isinstance(memory, Mapping) else {})
        flops = d.get("flops")
        values["flops"] = FlopsEntry.from_dict(flops) if isinstance(flops, Mapping) else None
        values["unmeasured"] = tuple(str(p) for p in d.get("unmeasured") or ())
        values["ended"] = bool(d.get("ended"))
        ops = d.get("collective_ops")
        values["collective_ops"] = dict(ops) if isinstance(ops, Mapping) else None
        loader = d.get("loader")
        values["loader"] = dict(loader) if isinstance(loader, Mapping) else None
        time = d.get("time")
        values["time"] = (
            Account.from_dict(values["rank"], time) if isinstance(time, Mapping) else None
        )
        for key in ("applied", "not_applied"):
            values[key] = tuple(dict(a) for a in _items(d.get(key)))
        return cls(**values)


@dataclass(frozen=True)
class ReportFinding:
    """A finding as the report holds it: :class:`~auditor.analysis.findings.Finding`'s fields
    with JSON values (the speed-up rounded as written), of any kind or severity a report names."""

    kind: str
    severity: str
    ranks: tuple[int, ...] = ()
    summary: str = ""
    evidence: Mapping[str, Any] = field(default_factory=dict)
    fixes: Mapping[int, str] = field(default_factory=dict)
    predicted_speedup: float | None = None
    cause: str | None = None
    # The least and the most the prediction is sure of (None: no range judged).
    predicted_range: tuple[float, float] | None = None
    # The fixes as data (:class:`~auditor.analysis.fixes.Fix`): what ``fixes`` says, per lever.
    actions: tuple[Fix, ...] = ()

    @property
    def severity_key(self) -> int:
        """Sort key, most severe first (:func:`auditor.analysis.findings.severity_key`)."""
        return severity_key(self.severity)

    def at_least(self, severity: str) -> bool:
        """Whether the finding is at ``severity`` or more severe."""
        return self.severity_key <= severity_key(severity)

    @property
    def unowned_fix(self) -> str | None:
        """The change to make where the finding blames no rank (a GPU no rank of the job owns,
        held by processes outside it): the JSON's ``evidence.fix``; None where every change is a
        rank's."""
        fix = self.evidence.get("fix")
        return fix if isinstance(fix, str) and fix and not self.fixes else None

    @property
    def speedup(self) -> float:
        """The predicted speed-up, 1.0 where it predicts none."""
        return 1.0 if self.predicted_speedup is None else float(self.predicted_speedup)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "ranks": list(self.ranks),
            "summary": self.summary,
            "evidence": dict(self.evidence),
            "fixes": {str(r): fix for r, fix in sorted(self.fixes.items())},
            "predicted_speedup": (
                None if self.predicted_speedup is None else round(self.predicted_speedup, 3)
            ),
            "predicted_range": (
                None
                if self.predicted_range is None
                else [round(x, 3) for x in self.predicted_range]
            ),
            "cause": self.cause,
            "actions": [jsonable(a.to_dict()) for a in self.actions],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReportFinding:
        fixes: dict[int, str] = {}
        for key, fix in (d.get("fixes") or {}).items():
            try:
                fixes[int(key)] = str(fix)
            except (TypeError, ValueError):
                continue
        speedup = d.get("predicted_speedup")
        return cls(
            kind=str(d.get("kind", "?")),
            severity=str(d.get("severity", "info")),
            ranks=tuple(int(r) for r in d.get("ranks") or ()),
            summary=str(d.get("summary") or ""),
            evidence=dict(d.get("evidence") or {}),
            fixes=fixes,
            predicted_speedup=(
                speedup
                if isinstance(speedup, (int, float)) and not isinstance(speedup, bool)
                else None
            ),
            cause=d.get("cause"),
            predicted_range=_span(d.get("predicted_range")),
            actions=tuple(a for a in map(Fix.from_dict, _items(d.get("actions"))) if a is not None),
        )

    @classmethod
    def of(cls, finding: Finding) -> ReportFinding:
        """The report's view of a rule's finding: its words
        (:func:`~auditor.report.phrasing.phrase`) and JSON values, as the document holds them."""
        words = phrase(finding)
        speedup = finding.predicted_speedup
        return cls(
            kind=finding.kind,
            severity=finding.severity,
            ranks=tuple(int(r) for r in finding.ranks),
            summary=words.summary,
            evidence=jsonable({**finding.evidence, **words.notes}),
            fixes={int(r): str(fix) for r, fix in sorted(words.fixes.items())},
            predicted_speedup=None if speedup is None else jsonable(round(speedup, 3)),
            cause=finding.cause,
            predicted_range=(
                None
                if finding.predicted_range is None
                else (round(finding.predicted_range[0], 3), round(finding.predicted_range[1], 3))
            ),
            # Rounded as the JSON writes it, so a report read back holds equal fixes.
            actions=tuple(
                replace(a, speedup=None if a.speedup is None else round(a.speedup, 3))
                for a in finding.fixes
            ),
        )


@dataclass(frozen=True)
class DeadRank:
    """A rank that ended without its probe's goodbye while the job ran."""

    rank: int
    node: str
    last_step: int | None
    # Seen dead in the first batch that reported deaths: the cause, not a casualty of the
    # launcher tearing down the others.
    first: bool
    exit_status: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "last_step": self.last_step,
            "first": self.first,
            "exit_status": self.exit_status,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeadRank:
        return cls(
            rank=d.get("rank"),  # type: ignore[arg-type]
            node=str(d.get("node") or ""),
            last_step=d.get("last_step"),
            first=bool(d.get("first")),
            exit_status=d.get("exit_status"),
        )

    def sentence(self) -> str:
        where = f" on {self.node}" if self.node else ""
        step = "before its first step" if self.last_step is None else f"after step {self.last_step}"
        status = (
            f"exit status {self.exit_status}"
            if self.exit_status is not None
            else "exit status unknown (its launcher reaped it)"
        )
        return f"rank {self.rank}{where} died {step} ({status})"


@dataclass(frozen=True)
class NodeEntry:
    """One node of a multi-node job as the job view last saw it (``details``: the rest of its
    state: last steps, exit code, Ray node id)."""

    node: str
    state: str
    ranks: tuple[int, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "ranks": list(self.ranks), **self.details}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeEntry:
        return cls(
            node=str(d.get("node")),
            state=str(d.get("state")),
            ranks=tuple(int(r) for r in d.get("ranks") or ()),
            details={k: v for k, v in d.items() if k not in ("node", "state", "ranks")},
        )


@dataclass(frozen=True)
class JobSummary:
    """The job: what ran, how it ended, where its ranks ran (``hosts``: host -> ranks)."""

    name: str | None = None
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    world_size: int | None = None
    parallel_mode: str | None = None
    duration_s: float | None = None
    interrupted: bool = False
    hosts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # Multi-node jobs only (absent from the document otherwise).
    nodes: tuple[NodeEntry, ...] | None = None
    # Ranks that died mid-run (absent when none did, or the run was interrupted).
    dead_ranks: tuple[DeadRank, ...] | None = None
    # ``auditor run --apply`` only (absent otherwise): the plan, ``{"sources", "levers",
    # "not_applied"}`` (``auditor.report.applied.plan_entry``).
    apply: Mapping[str, Any] | None = None
    # The job's FLOP/s, MFU and its gap's split (absent where no rank counted its FLOPs).
    mfu: MfuEntry | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "command": list(self.command),
            "exit_code": self.exit_code,
            "world_size": self.world_size,
            "parallel_mode": self.parallel_mode,
            "duration_s": self.duration_s,
            "interrupted": self.interrupted,
            "hosts": {h: list(rs) for h, rs in self.hosts.items()},
        }
        if self.nodes is not None:
            out["nodes"] = [n.to_dict() for n in self.nodes]
        if self.dead_ranks is not None:
            out["dead_ranks"] = [d.to_dict() for d in self.dead_ranks]
        if self.apply is not None:
            out["apply"] = dict(self.apply)
        if self.mfu is not None:
            out["mfu"] = self.mfu.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobSummary:
        hosts = d.get("hosts")
        nodes = d.get("nodes")
        dead = d.get("dead_ranks")
        apply = d.get("apply")
        mfu = d.get("mfu")
        return cls(
            name=d.get("name"),
            command=tuple(str(c) for c in d.get("command") or ()),
            exit_code=d.get("exit_code"),
            world_size=d.get("world_size"),
            parallel_mode=d.get("parallel_mode"),
            duration_s=d.get("duration_s"),
            interrupted=bool(d.get("interrupted")),
            hosts=(
                {str(h): tuple(int(r) for r in rs or ()) for h, rs in hosts.items()}
                if isinstance(hosts, Mapping)
                else {}
            ),
            nodes=(
                tuple(NodeEntry.from_dict(n) for n in nodes if isinstance(n, Mapping))
                if isinstance(nodes, list)
                else None
            ),
            dead_ranks=(
                tuple(DeadRank.from_dict(x) for x in dead if isinstance(x, Mapping))
                if isinstance(dead, list)
                else None
            ),
            apply=dict(apply) if isinstance(apply, Mapping) else None,
            mfu=MfuEntry.from_dict(mfu) if isinstance(mfu, Mapping) else None,
        )


# --------------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class Report:
    """One run's report: ranks in rank order, findings as the rules gave them."""

    job: JobSummary = field(default_factory=JobSummary)
    ranks: tuple[RankEntry, ...] = ()
    findings: tuple[ReportFinding, ...] = ()
    notes: tuple[str, ...] = ()
    generated_at: str | None = None
    schema: str = SCHEMA

    # --- views the renderers share ------------------------------------------------------------
    @property
    def sorted_ranks(self) -> list[RankEntry]:
        return sorted(self.ranks, key=lambda r: r.rank)

    @property
    def sorted_findings(self) -> list[ReportFinding]:
        """Most severe first; among equals the largest predicted speed-up first."""
        return sorted(self.findings, key=lambda f: (f.severity_key, -f.speedup))

    @property
    def budgets(self) -> dict[int, BudgetEntry]:
        """Each rank's measured budget, where it sent one."""
        return {r.rank: r.budget for r in self.sorted_ranks if r.budget is not None}

    @property
    def first_dead(self) -> list[DeadRank]:
        """The ranks whose death ended the run (not the casualties of the teardown)."""
        return [d for d in self.job.dead_ranks or () if d.first]

    # --- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON document (plain JSON types, keys in the schema's order)."""
        out = jsonable(
            {
                "schema": self.schema,
                "generated_at": self.generated_at,
                "job": self.job.to_dict(),
                "ranks": [r.to_dict() for r in self.ranks],
                "findings": [f.to_dict() for f in self.findings],
                "notes": list(self.notes),
            }
        )
        assert isinstance(out, dict)
        return out

    @classmethod
    def from_dict(cls, data: object, *, source: str = "report", strict: bool = True) -> Report:
        """The report a JSON document holds.

        ``strict`` (the default): ``ValueError`` unless ``data`` has the shape of an
        ``auditor.report`` document, v1 or v2 (:func:`validate_report`). Not strict: whatever
        sections are there (a partial document a test or a caller built), the rest empty.
        """
        if strict:
            validate_report(data, source=source)
        d: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        job = d.get("job")
        return cls(
            job=JobSummary.from_dict(job if isinstance(job, Mapping) else {}),
            ranks=tuple(RankEntry.from_dict(r) for r in _items(d.get("ranks"))),
            findings=tuple(ReportFinding.from_dict(f) for f in _items(d.get("findings"))),
            notes=tuple(str(n) for n in d.get("notes") or ()),
            generated_at=d.get("generated_at"),
            schema=str(d.get("schema") or SCHEMA),
        )


ReportLike = Report | Mapping[str, Any]


def as_report(report: ReportLike) -> Report:
    """``report`` itself, or the report a (possibly partial) JSON document holds."""
    if isinstance(report, Report):
        return report
    return Report.from_dict(report, strict=False)


def validate_report(data: object, *, source: str = "report") -> None:
    """Raise ``ValueError`` unless ``data`` has the shape of an ``auditor.report`` document (v1 or
    v2)."""
    if not isinstance(data, dict):
        raise ValueError(
            f"{source}: not an auditor report (expected a JSON object, got {type(data).__name__})"
        )
    schema = data.get("schema")
    if schema not in SCHEMAS:
        found = "no 'schema' key" if schema is None else f"schema {schema!r}"
        raise ValueError(f"{source}: not an auditor report ({found}, expected {SCHEMA!r})")
    expected: dict[str, type] = {"job": dict, "ranks": list, "findings": list, "notes": list}
    for key, kind in expected.items():
        if not isinstance(data.get(key), kind):
            raise ValueError(
                f"{source}: malformed auditor report ('{key}' must be a {kind.__name__})"
            )
    for i, rank in enumerate(data["ranks"]):
        if not isinstance(rank, dict) or not isinstance(rank.get("rank"), int):
            raise ValueError(f"{source}: malformed auditor report (ranks[{i}] has no rank number)")
    for i, finding in enumerate(data["findings"]):
        if not isinstance(finding, dict) or "kind" not in finding or "severity" not in finding:
            raise ValueError(
                f"{source}: malformed auditor report (findings[{i}] lacks kind or severity)"
            )


def _span(value: Any) -> tuple[float, float] | None:
    """A report's ``[low, high]`` range; None where it holds no such pair."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2:
        return None
    lo, hi = value
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (lo, hi)):
        return None
    return (float(lo), float(hi))


def _items(value: Any) -> Iterable[Mapping[str, Any]]:
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, Sequence) else []


def jsonable(value: Any) -> Any:
    """Plain JSON types only: tuples become lists, keys strings, NaN/inf become null."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return v if math.isfinite(v) else None
    return str(value)
