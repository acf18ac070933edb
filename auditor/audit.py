"""The audit pipeline: batches in, verdicts out.

One :class:`Audit` owns the window, the sample store, the rules and the final verdict; whatever
feeds it batches is its source: this node's agent, the job view with every other node's batches
(:mod:`auditor.cluster.jobview`), a recording, Prometheus answers. It also keeps what the store
does not: which ranks died (their connection closed without the probe's goodbye) at which step,
and the state of every node of a job that spans several.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from auditor.analysis import SampleStore
from auditor.analysis.changes import latest_change
from auditor.analysis.consistency import SetAside
from auditor.analysis.consistency import review as check
from auditor.analysis.engine import review
from auditor.analysis.findings import Finding, finding_order
from auditor.analysis.rules import slowdown
from auditor.analysis.rules.slowdown import Facts as Slowdown
from auditor.analysis.snapshot import LIVE_WARMUP_S, WARMUP_STEPS, Snapshot
from auditor.analysis.spread import (
    PARTS,
    Key,
    capped_at,
    host_ceiling,
    job_pace,
    key,
    pace_spread,
    part_bounds,
    with_ceiling,
    with_pace,
    with_ranges,
)
from auditor.report.json_report import make_report
from auditor.report.model import DeadRank as DeadRank
from auditor.report.model import Report, ReportFinding
from auditor.report.set_aside import sentence as set_aside_sentence
from auditor.samples import Batch

Overrides = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Verdict:
    """The verdict on one job's window: what every path shows (``auditor run``'s live panel and
    final report, ``analyze`` and ``replay``'s reports, ``auditor serve``'s answers and metrics),
    from one :func:`judge`. Holds no snapshot: ``auditor serve`` keeps its verdicts published
    until the next evaluation, the snapshots it judged freed."""

    job: str
    ranks: int
    world_size: int
    # Each rank's node (host).
    nodes: dict[int, str]
    findings: tuple[Finding, ...]
    imbalance_ratio: float | None
    # The window judged: (start, end), wall-clock seconds.
    window: tuple[float, float]
    # Findings the review set aside, each with the reason (one report, one story).
    set_aside: tuple[SetAside, ...] = ()

    @property
    def predicted_speedup(self) -> float:
        gains = [f.predicted_speedup for f in self.findings if f.predicted_speedup is not None]
        return max(gains, default=1.0)

    def to_dict(self) -> dict[str, Any]:
        """The verdict as ``auditor serve`` answers it (``/api/v1/jobs``)."""
        return {
            "job": self.job,
            "ranks": self.ranks,
            "world_size": self.world_size,
            "window": {"start": self.window[0], "end": self.window[1]},
            "imbalance_ratio": None
            if self.imbalance_ratio is None
            else round(self.imbalance_ratio, 4),
            "predicted_speedup": round(self.predicted_speedup, 3),
            "findings": [finding_dict(self, f) for f in self.findings],
            "set_aside": [s.to_dict() for s in self.set_aside],
        }


def finding_dict(verdict: Verdict, finding: Finding) -> dict[str, Any]:
    """A finding as served over HTTP: the report's form plus its job and each rank's node."""
    return {
        "job": verdict.job,
        **ReportFinding.of(finding).to_dict(),
        "nodes": {str(r): verdict.nodes.get(r, "") for r in finding.ranks},
    }


def imbalance_ratio(snapshot: Snapshot, *, min_steps: int = 1) -> float | None:
    """``1 - fastest/slowest`` local step time (step time minus the wait for peers) among the
    ranks with steps in the window: the share of each step the least-loaded rank idles at the
    barrier. None with fewer than two such ranks."""
    stats = snapshot.ready(min_steps)
    local = [s.local_s for s in stats.values() if s.local_s > 0]
    if len(local) < 2:
        return None
    return 1.0 - min(local) / max(local)


def judge(snapshot: Snapshot, overrides: Overrides | None = None) -> Verdict:
    """The verdict on one snapshot: every rule (with ``overrides``' thresholds), and the job's
    shape. The one place outside the rules that runs them, whichever path built the snapshot
    (the live store, a recording, Prometheus' window aggregates)."""
    reviewed = review(snapshot, overrides)
    return Verdict(
        job=snapshot.job,
        ranks=len(snapshot.ranks),
        world_size=snapshot.world_size,
        nodes={v.info.rank: v.info.host for v in snapshot.ranks},
        findings=reviewed.findings,
        set_aside=reviewed.set_aside,
        imbalance_ratio=imbalance_ratio(snapshot),
        window=(snapshot.start, snapshot.end),
    )


# A live finding short of critical whose predicted gain is under this (or not predicted) is shown
# once the live verdicts have held it for LIVE_CONFIRM_S (:meth:`Audit.judge_live`): a loader's
# hiccup on a busy host moves a window's medians for about a second.
LIVE_CONFIRM_SPEEDUP = 1.25
LIVE_CONFIRM_S = 1.0
# A finding short of critical on a window cut at a change is shown once the verdicts have held
# it this long: a second verdict at the default cadence (0.5 s).
LIVE_CUT_CONFIRM_S = 0.5
# A live window whose steps span less than this share of it (the run's first seconds) is little
# evidence: every finding on it waits LIVE_YOUNG_CONFIRM_S, critical too (start-up's uneven
# steps raised a 1.27x straggler for a second, and a critical one for one verdict, on balanced
# jobs).
LIVE_YOUNG_SHARE = 0.9
LIVE_YOUNG_CONFIRM_S = 2.0
# Verdicts come on a timer that wakes a little early or late: a hold is met within this.
_CONFIRM_SLACK_S = 0.1


def _marginal(f: Finding) -> bool:
    if f.severity == "critical" or f.severity == "info":
        return False
    return f.predicted_speedup is None or f.predicted_speedup < LIVE_CONFIRM_SPEEDUP


class Audit:
    """One job's audit, fed batch by batch."""

    def __init__(
        self,
        job: str,
        *,
        window_s: float | None = 10.0,
        overrides: Mapping[str, Mapping[str, Any]] | None = None,
        on_add: Callable[[Batch], None] | None = None,
        warmup_steps: int = WARMUP_STEPS,
    ) -> None:
        self.job = job
        self.window_s = window_s
        self.overrides: dict[str, dict[str, Any]] = {
            k: dict(v) for k, v in (overrides or {}).items()
        }
        self.store = SampleStore(job, on_add=on_add, warmup_steps=warmup_steps)
        self.findings: list[Finding] = []
        self.set_aside: tuple[SetAside, ...] = ()
        # Each live finding's first verdict in its current unbroken run of verdicts.
        self._live_since: dict[Key, float] = {}
        # Where the latest live window was cut: the job's step changed then (None: not cut).
        self.changed_at: float | None = None
        # Whether the latest live window's steps spanned less than most of it (start-up).
        self.young = False
        self._last_step: dict[int, int] = {}
        self._died: dict[int, DeadRank] = {}
        self.nodes: list[dict[str, Any]] = []  # the job view's node states (multi-node jobs)

    # --- in ---------------------------------------------------------------------------------
    def add(self, batch: Batch) -> None:
        for s in batch.steps:
            if s.step > self._last_step.get(s.rank, -1):
                self._last_step[s.rank] = s.step
        self.store.add(batch)
        if batch.died:
            first = not self._died
            infos = self.store.infos
            for r in batch.died:
                if r not in self._died:
                    host = infos[r].host if r in infos else ""
                    self._died[r] = DeadRank(r, host, self._last_step.get(r), first)

    def add_all(self, batches: Sequence[Batch]) -> None:
        for b in batches:
            self.add(b)

    def set_exit_status(self, pid: int, status: int) -> None:
        """A dead rank's exit status, where the auditor reaped it itself (its direct child)."""
        for r, d in self._died.items():
            info = self.store.infos.get(r)
            if info is not None and info.pid == pid:
                self._died[r] = DeadRank(d.rank, d.node, d.last_step, d.first, status)

    # --- out --------------------------------------------------------------------------------
    @property
    def dead_ranks(self) -> list[DeadRank]:
        return sorted(self._died.values(), key=lambda d: (not d.first, d.rank))

    def judge(self, now: float) -> tuple[Snapshot, Verdict]:
        """The live verdict over the window ending at ``now`` (this node's clock), and the
        window judged: where the job's step changed for good inside the window
        (:func:`~auditor.analysis.changes.latest_change`), the steps since that change only. A
        fault that began four seconds ago is most of those steps, and a minority of a 10 s
        window's, whose medians still show the job before it."""
        snap = self.store.snapshot(now, self.window_s, warmup_s=LIVE_WARMUP_S)
        self.young = self._young(snap)
        since = latest_change(snap) if self.window_s is not None else None
        if since is not None:
            snap = self.store.snapshot(now, now - since, warmup_s=LIVE_WARMUP_S)
        self.changed_at = since
        return snap, self.judge_snapshot(snap)

    def judge_live(self, now: float) -> tuple[Snapshot, Verdict]:
        """:meth:`judge` as the live panel, the events and the endpoint show it. A finding short
        of critical whose predicted gain is under :data:`LIVE_CONFIRM_SPEEDUP` (or not predicted)
        is shown once the verdicts have held it for :data:`LIVE_CONFIRM_S`: one window that
        catches a loader's hiccup on a busy host raised a 1.1x warning for a second on balanced
        jobs. On the steps since a change (a window cut short, seconds of steps), every finding
        short of critical waits :data:`LIVE_CUT_CONFIRM_S`: a rank slowed for a moment on a
        loaded host is not a straggler. In the run's first seconds (steps over less than
        :data:`LIVE_YOUNG_SHARE` of the window) every finding waits
        :data:`LIVE_YOUNG_CONFIRM_S`, critical too. A
        fault worth more on a whole window, or critical past start-up, shows at once."""
        snap, verdict = self.judge(now)
        since = {k: self._live_since.get(k, now) for k in map(key, verdict.findings)}
        self._live_since = since
        cut, young = self.changed_at is not None, self.young

        def hold_s(f: Finding) -> float:
            if f.severity == "info":
                return 0.0
            if young:
                return LIVE_YOUNG_CONFIRM_S
            if f.severity == "critical":
                return 0.0
            return max(LIVE_CONFIRM_S if _marginal(f) else 0.0, LIVE_CUT_CONFIRM_S if cut else 0.0)

        shown = tuple(
            f for f in verdict.findings if now - since[key(f)] >= hold_s(f) - _CONFIRM_SLACK_S
        )
        if len(shown) == len(verdict.findings):
            return snap, verdict
        return snap, replace(verdict, findings=shown)

    def _young(self, snap: Snapshot) -> bool:
        """Whether the window's steps span less than :data:`LIVE_YOUNG_SHARE` of it (the run's
        first seconds); never for a whole-run window."""
        if self.window_s is None:
            return False
        first = min((v.steps[0].time for v in snap.ranks if v.steps), default=None)
        return first is None or snap.end - first < LIVE_YOUNG_SHARE * self.window_s

    def judge_snapshot(self, snap: Snapshot) -> Verdict:
        """The verdict on ``snap`` (:func:`judge`, with this audit's overrides), kept as the
        latest findings."""
        verdict = judge(snap, self.overrides)
        self.findings = list(verdict.findings)
        self.set_aside = verdict.set_aside
        return verdict

    def final(
        self, now: float | None = None, window_s: float | None = None
    ) -> tuple[Snapshot, list[Finding]]:
        """The verdict over the whole run (what the store still holds), or over the last
        ``window_s`` seconds before ``now`` (default: the newest sample); where the run turned
        slow, with the steps since the change judged as well (:meth:`_judge_latest_segment`);
        each predicted speed-up with the range it is sure of (:meth:`_with_ranges`)."""
        end = now if now is not None else self.store.latest_time()
        snap = self.store.snapshot(end if end is not None else 0.0, window_s)
        if self.store.ranks:
            self.judge_snapshot(snap)
            since = self._judge_latest_segment(snap)
            spread = self._with_ranges(snap, since)
            self._no_faster_than_before(snap)
            self.findings = with_pace(self.findings, spread)
        return snap, list(self.findings)

    def _no_faster_than_before(self, whole: Snapshot) -> None:
        """Where the run turned slow for good (a ``slowdown`` found), a finding that appeared
        with the change promises at most the job's time per step now over its time per step
        before the change (means, not medians: a periodic stall's steps count): its fix takes
        the job back to the pace it kept without the fault, not past it. The
        model's figures come from the slow steps, which run cheaper than the job will once
        every rank works again (a starved rank's peer computes alone on a shared host, and its
        collectives wait on an idle peer). A finding the steps before the change have too is
        left as it is: its fix may take the job past that pace."""
        changes = [f.facts for f in self.findings if isinstance(f.facts, Slowdown)]
        if not changes:
            return
        change = max(changes, key=lambda c: c.time)
        cap = change.pace_slowdown
        over = [
            f
            for f in self.findings
            if f.predicted_speedup is not None
            and f.predicted_speedup > cap
            and not isinstance(f.facts, Slowdown)
        ]
        if cap <= 1.0 or not over or not whole.start < change.time < whole.end:
            return
        before = judge(self.store.snapshot(change.time, change.time - whole.start), self.overrides)
        had = {key(f) for f in before.findings}
        capped = {key(f): capped_at(f, cap, change.step) for f in over if key(f) not in had}
        self.findings = [capped.get(key(f), f) for f in self.findings]

    def _with_ranges(self, whole: Snapshot, since: float | None) -> dict[Key, float]:
        """Each predicted speed-up with its range (:mod:`auditor.analysis.spread`): the rules
        on each part of the window its finding was judged on, the whole window or, for a
        finding marked ``since_step``, the segment since the change (starting at ``since``);
        its low end no higher than the hosts' CPUs allow (:func:`host_ceiling`). Returns the
        job's pace spread over the parts that found each ranged finding (:func:`pace_spread`),
        for :func:`with_pace` once every cap is in."""
        spread: dict[Key, float] = {}
        if not any(f.predicted_speedup is not None for f in self.findings):
            return spread

        def ranged(found: list[Finding], start: float) -> list[Finding]:
            left = {key(f) for f in found if f.predicted_speedup is not None}
            for parts in PARTS:  # quarters, then halves for what quarters were too short for
                if not left:
                    break
                snaps = [
                    self.store.snapshot(hi, hi - lo)
                    for lo, hi in part_bounds(start, whole.end, parts)
                ]
                judged = [judge(s, self.overrides).findings for s in snaps]
                found, done = with_ranges(found, judged, only=left)
                paces = pace_spread(judged, [job_pace(s) for s in snaps])
                spread.update((k, q) for k, q in paces.items() if k in done)
                left -= done
            return found

        segment = [f for f in self.findings if "since_step" in f.evidence]
        rest = ranged([f for f in self.findings if "since_step" not in f.evidence], whole.start)
        if segment and since is not None:
            segment = ranged(segment, since)
        ranged_all = with_ceiling(rest + segment, host_ceiling(whole))
        self.findings = sorted(ranged_all, key=finding_order)
        return spread

    def _judge_latest_segment(self, whole: Snapshot) -> float | None:
        """Where the run changed for good (a ``slowdown`` found), the steps since the latest
        change judged too: the findings that segment shows and the whole run's medians miss
        join the verdict, marked with the step the segment starts at (``since_step``); of a
        finding of the same kind and ranks in both, the more severe is kept. A segment shorter
        than ``slowdown``'s ``min_lasting_s`` is not judged on its own: a slow spell of a second
        or two on a busy host (its ranks descheduled at random) is no lasting change, and its
        few steps named a balanced job's rank a straggler. Returns when the segment starts
        (None: no segment judged)."""
        changes = [
            (f.facts.time, f.facts.step) for f in self.findings if isinstance(f.facts, Slowdown)
        ]
        if not changes:
            return None
        at, step = max(changes)
        if not whole.start < at < whole.end:
            return None
        lasting = slowdown.RULE.settings(self.overrides.get(slowdown.KIND)).min_lasting_s
        if whole.end - at < lasting:
            return None
        segment = judge(self.store.snapshot(whole.end, whole.end - at), self.overrides)
        kept = {key(f): f for f in self.findings}
        for f in segment.findings:
            mine = kept.get(key(f))
            if mine is None or finding_order(f) < finding_order(mine):
                kept[key(f)] = replace(f, evidence={**f.evidence, "since_step": step})
        checked = check(sorted(kept.values(), key=finding_order), whole)
        self.findings = list(checked.findings)
        self.set_aside += checked.set_aside
        return at

    def report(
        self,
        *,
        command: Sequence[str],
        exit_code: int | None,
        duration_s: float,
        notes: Sequence[str] = (),
        interrupted: bool = False,
        now: float | None = None,
        window_s: float | None = None,
    ) -> Report:
        """The final report, with the job's nodes and dead ranks where there are."""
        snap, findings = self.final(now, window_s)
        notes = list(notes)
        labels = {u: d.label for u, d in snap.gpu_stats.items()}
        notes += [set_aside_sentence(s, labels) for s in self.set_aside]
        dead = self.dead_ranks
        if not interrupted:
            notes += [d.sentence() for d in dead if d.first]
        lost = [n for n in self.nodes if n.get("state") == "lost"]
        for n in lost:
            ranks = ", ".join(str(r) for r in n.get("ranks") or ()) or "none"
            notes.append(
                f"node {n['node']} was lost mid-run (ranks {ranks}); its last samples are kept"
            )
        return make_report(
            command=command,
            exit_code=exit_code,
            duration_s=duration_s,
            snapshot=snap,
            findings=findings,
            job=self.job,
            notes=notes,
            interrupted=interrupted,
            nodes=[dict(n) for n in self.nodes] if self.nodes else None,
            dead_ranks=dead if dead and not interrupted else None,
        )
