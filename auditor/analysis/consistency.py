"""One report, one story: the rules' findings checked against each other and against the run's
time before a verdict is shown.

Each rule judges its own figures; together they can disagree. Three disagreements are resolved
here, each by the stronger evidence, and the finding that loses is set aside with the reason
(:class:`SetAside`), which the report states:

* **A GPU both busy and idle.** ``idle_device`` reads NVML's utilisation; a finding that blames a
  rank owning the GPU for its compute (a straggler, a slowdown, a stall, an uneven batch) or
  names the GPU as working (a slower or throttled GPU, DataParallel's gather) rests on the ranks'
  own timings. The ranks' evidence wins: the idle finding is set aside (``gpu_works``).
* **A fix that undoes another.** Two findings whose fixes move the same lever on the same rank in
  opposite directions (a larger batch and a smaller one; more workers and fewer): the finding
  with the weaker claim (lower severity, then the smaller predicted speed-up, then the later in
  listing order) is set aside (``fix_undone``).
* **A larger batch on a rank whose memory climbs.** A fix that raises ``batch_size`` on a rank
  ``memory_growth`` names would bring its crash closer: the finding that gives it is set aside
  (``memory_climbs``), whatever its severity (``memory_headroom`` already holds back itself).
* **"Balanced" while a rank waits for one peer.** Where no finding of at least ``warning`` is
  left (``low_mfu``, the job's efficiency, not counted: :data:`JOB_WIDE`), yet over the run's
  steps after warm-up (:attr:`Snapshot.history`) a rank waited at the
  collectives ``WAIT_SHARE`` of its step time or more, and one peer (or a minority of them) did
  that work while waiting at most ``CULPRIT_SHARE`` of that, the verdict would say "balanced"
  against the time account. The account wins: a ``utilization_imbalance`` finding blames the
  peers waited for, over the whole run, with the info finding that names them (if any) as its
  cause and that finding's fixes; the info finding it replaces of the same kind is set aside
  (``account_wait``). Peers that wait alike blame no one (a slow collective is not a rank's).

Pure: findings and the snapshot in, findings and set-asides out; no words (``auditor.report``
phrases the reasons).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .findings import SEVERITY_RANK, Finding, severity_for
from .fixes import Fix
from .history import RankHistory
from .rules.utilization_imbalance import CAUSES, account_finding
from .snapshot import Snapshot

# Findings whose blame of a rank rests on the rank's own compute (its GPU works).
COMPUTING = frozenset(
    {"compute_straggler", "hardware_straggler", "slowdown", "stall", "batch_split"}
)
# Findings that name a GPU as working (busy, slower, gathering), whatever rank they blame.
GPU_WORKING = frozenset({"hardware_straggler", "dataparallel_gather"})
# Findings about the whole job's efficiency (the work its GPUs do), not about a rank: they say
# nothing about whether one rank holds the others back, so they do not stand in for a warning
# about one (a job at a low MFU can still wait for one peer).
JOB_WIDE = frozenset({"low_mfu"})
# A rank that waited this share of its steps' time at the collectives, over the run after
# warm-up, waited for its peers for a quarter of its training. The finding it gives is
# utilization_imbalance's, so that rule's ``min_spread`` (0.25 by default) is the share used
# where its thresholds are handed over (``--set utilization_imbalance.min_spread=...``).
WAIT_SHARE = 0.25
# The peers it waited for waited at most this share of the waiter's share (they were working).
CULPRIT_SHARE = 0.5
# Steps of each rank's history skipped as warm-up (the first all-reduce waits for the slowest
# rank's start: a rendezvous, not a straggler).
WARMUP_STEPS = 5
# Steps after warm-up a rank needs before its waits are judged.
MIN_STEPS = 50

GPU_WORKS = "gpu_works"
FIX_UNDONE = "fix_undone"
ACCOUNT_WAIT = "account_wait"
MEMORY_CLIMBS = "memory_climbs"


@dataclass(frozen=True)
class SetAside:
    """A finding left out of the verdict: ``reason`` (a code: :data:`GPU_WORKS`,
    :data:`FIX_UNDONE`, :data:`MEMORY_CLIMBS`, :data:`ACCOUNT_WAIT`), the finding whose evidence
    won (its kind and ranks), and for a fix the lever."""

    finding: Finding
    reason: str
    by_kind: str
    by_ranks: tuple[int, ...] = ()
    lever: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.finding.kind,
            "ranks": list(self.finding.ranks),
            "gpus": list(self.finding.gpus),
            "reason": self.reason,
            "by": {"kind": self.by_kind, "ranks": list(self.by_ranks)},
            "lever": self.lever,
        }


@dataclass(frozen=True)
class Review:
    """The findings that stand, in the order given, and those set aside."""

    findings: tuple[Finding, ...]
    set_aside: tuple[SetAside, ...] = ()


def review(
    findings: Sequence[Finding], snapshot: Snapshot, *, wait_share: float = WAIT_SHARE
) -> Review:
    """``findings`` (most severe first) with their contradictions resolved; ``wait_share``:
    see :data:`WAIT_SHARE`."""
    kept = list(findings)
    aside: list[SetAside] = []
    kept, out = _busy_and_idle(kept, snapshot.owners)
    aside += out
    # A larger batch on a climbing rank goes first: it never wins a clash of fixes.
    kept, out = _no_larger_batch(kept)
    aside += out
    kept, out = _fixes_undone(kept)
    aside += out
    kept, out = _account_waits(kept, snapshot.history, wait_share)
    aside += out
    return Review(tuple(kept), tuple(aside))


def _busy_and_idle(
    findings: list[Finding], owners: Mapping[str, tuple[int, ...]]
) -> tuple[list[Finding], list[SetAside]]:
    kept: list[Finding] = []
    aside: list[SetAside] = []
    for f in findings:
        if f.kind != "idle_device":
            kept.append(f)
            continue
        mine = {r for g in f.gpus for r in owners.get(g, ())}
        winner = next(
            (
                o
                for o in findings
                if o is not f
                and (
                    (o.kind in COMPUTING and mine & set(o.ranks))
                    or (o.kind in GPU_WORKING and set(f.gpus) & set(o.gpus))
                )
            ),
            None,
        )
        if winner is None:
            kept.append(f)
        else:
            aside.append(SetAside(f, GPU_WORKS, winner.kind, winner.ranks))
    return kept, aside


def _direction(fix: Fix) -> int:
    """+1 where the fix raises its lever, -1 where it lowers it, 0 where not a number."""
    a, b = fix.current, fix.proposed
    if isinstance(a, bool) or isinstance(b, bool):
        return 0
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a == b:
        return 0
    return 1 if b > a else -1


def _strength(f: Finding, place: int) -> tuple[int, float, int]:
    return (SEVERITY_RANK[f.severity], f.predicted_speedup or 1.0, -place)


def _fixes_undone(findings: list[Finding]) -> tuple[list[Finding], list[SetAside]]:
    moves: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for i, f in enumerate(findings):
        for fix in f.fixes:
            d = _direction(fix)
            if d and fix.rank is not None:
                moves.setdefault((fix.rank, fix.lever), []).append((i, d))
    losers: dict[int, SetAside] = {}
    for (_, lever), seen in moves.items():
        ups = [i for i, d in seen if d > 0]
        downs = [i for i, d in seen if d < 0]
        if not ups or not downs:
            continue
        best = max(ups + downs, key=lambda i: _strength(findings[i], i))
        beaten = downs if best in ups else ups
        for i in beaten:
            if i != best and i not in losers:
                w = findings[best]
                losers[i] = SetAside(findings[i], FIX_UNDONE, w.kind, w.ranks, lever)
    kept = [f for i, f in enumerate(findings) if i not in losers]
    return kept, [losers[i] for i in sorted(losers)]


def _no_larger_batch(findings: list[Finding]) -> tuple[list[Finding], list[SetAside]]:
    growth = [f for f in findings if f.kind == "memory_growth"]
    climbing = {r: f for f in growth for r in f.ranks}
    kept: list[Finding] = []
    aside: list[SetAside] = []
    for f in findings:
        raises = [
            x.rank
            for x in f.fixes
            if x.lever == "batch_size" and x.rank in climbing and _direction(x) > 0
        ]
        if f.kind == "memory_growth" or not raises:
            kept.append(f)
            continue
        by = climbing[raises[0]]
        aside.append(SetAside(f, MEMORY_CLIMBS, by.kind, by.ranks, "batch_size"))
    return kept, aside


@dataclass(frozen=True)
class _Waits:
    wait_s: float
    local_s: float
    step_s: float
    steps: int

    @property
    def share(self) -> float:
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0


def _trained(history: RankHistory) -> _Waits | None:
    """A rank's collective wait, own time and step time summed over its steps after warm-up
    (only ranks whose every such step had its wait measured)."""
    wait = local = step = 0.0
    steps = 0
    for b in history.buckets:
        if b.first_step < WARMUP_STEPS:
            continue
        if b.waits_measured < b.steps:
            return None
        wait += b.collective_wait_s
        local += b.local_s
        step += b.step_s
        steps += b.steps
    if steps < MIN_STEPS:
        return None
    return _Waits(wait, local, step, steps)


def _account_waits(
    findings: list[Finding], history: Mapping[int, RankHistory], wait_share: float
) -> tuple[list[Finding], list[SetAside]]:
    if any(
        SEVERITY_RANK[f.severity] >= SEVERITY_RANK["warning"]
        for f in findings
        if f.kind not in JOB_WIDE
    ):
        return findings, []
    waits = {r: w for r, h in history.items() if (w := _trained(h)) is not None}
    if len(waits) < 2:
        return findings, []
    waiting = {r for r, w in waits.items() if w.share >= wait_share}
    if not waiting:
        return findings, []
    least = min(waits[r].share for r in waiting)
    culprits = sorted(r for r, w in waits.items() if w.share <= CULPRIT_SHARE * least)
    if not culprits or len(culprits) > len(waits) // 2:
        return findings, []
    # The job's step over the run; the culprits at their waiters' median own time.
    others = sorted(waits[r].local_s / waits[r].steps for r in waits if r not in culprits)
    peer_local = others[len(others) // 2]
    local = {r: w.local_s / w.steps for r, w in waits.items()}
    floor = min(w.wait_s / w.steps for w in waits.values())
    before = max(local.values()) + floor
    after = max({**local, **dict.fromkeys(culprits, peer_local)}.values()) + floor
    speedup = max(1.0, before / after) if after > 0 else 1.0
    # The cause is a finding of a kind that explains a spread (never e.g. memory headroom).
    cause = next((f for f in findings if f.kind in CAUSES and set(f.ranks) & set(culprits)), None)
    severity = severity_for(speedup)
    if severity == "info":
        return findings, []
    if cause is not None and severity == "critical":
        severity = "warning"  # the symptom stays one level below its cause
    found = account_finding(
        culprits=tuple(culprits),
        busy={r: 1.0 - w.share for r, w in waits.items()},
        wait_share={r: round(w.share, 3) for r, w in waits.items()},
        steps={r: w.steps for r, w in waits.items()},
        speedup=speedup,
        severity=severity,
        cause=cause,
    )
    aside = [
        SetAside(f, ACCOUNT_WAIT, found.kind, found.ranks) for f in findings if f.kind == found.kind
    ]
    kept = [f for f in findings if f.kind != found.kind]
    return [found, *kept], aside
