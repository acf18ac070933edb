"""slow_collective: the transfer itself is slow, not a rank: every rank spends a large share of
its step inside one collective after the last rank has arrived.

Measure. A rank's time in a collective is its wait for the last peer to arrive plus the
transfer. The rank that arrives last waits for nobody, so in each step the least time any rank
spent in an op is that op's transfer (plus the ranks' skew at the exit); each rank's time beyond
it is its wait for peers. Over the steps every rank holds, the median transfer per op, the
bytes the op carried in a step (``StepSample.collective_bytes``, NCCL-tests' size), and from
them the bandwidth achieved, in NCCL-tests' two figures: the algorithm bandwidth (bytes / time)
and the bus bandwidth (scaled by the op's traffic per rank: ``2(n-1)/n`` for an all-reduce,
``(n-1)/n`` for an all-gather, reduce-scatter or all-to-all, 1 for a broadcast or reduce), which
is comparable with the link's own speed whatever the rank count.

Decide. A finding when the ops' transfer takes at least ``min_share`` of the job's median step
on every rank: never blamed on a rank (every rank pays it alike). Its levers are the job's:
the network settings (NCCL on the right interface, not TCP on a management NIC), gradient
bucketing, overlap with backward, compression, fewer collectives per step. Its speed-up is not
predicted: it depends on the link the fix reaches, which nothing here measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rule import Explained, Rule
from auditor.analysis.snapshot import Snapshot
from auditor.analysis.stats import is_object_op
from auditor.samples import StepSample

KIND = "slow_collective"

# Each op's bus bandwidth factor as a function of the rank count n (NCCL-tests' convention,
# doc/PERFORMANCE.md there): the share of the op's size each rank's link carries.
_ALL_REDUCE = ("all_reduce", "all_reduce_coalesced", "ddp_allreduce")
_ALL_TO_ONE = ("broadcast", "reduce", "gather", "scatter")
_SPREAD = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_coalesced",
    "_all_gather_base",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
)

# Evidence code (the report words it): the speed-up is not predicted.
NOT_PREDICTED = "depends_on_the_link"


def bus_factor(op: str, n: int) -> float | None:
    """NCCL-tests' bus bandwidth factor of ``op`` over ``n`` ranks; None: not a data op."""
    if n < 2:
        return None
    if op in _ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if op in _SPREAD:
        return (n - 1) / n
    if op in _ALL_TO_ONE:
        return 1.0
    return None


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps every rank must hold in the window (the transfer is a per-step minimum
        over ranks: a few steps' noise must not decide it).
    min_share: the ops' transfer as a share of the job's median step, on every rank, from
        which the collective itself is named: a quarter of the step is what overlapping the
        transfer with compute, or a link at its rated speed, would win back first.
    min_transfer_s: transfers shorter than this a step are never named (a scalar's all-reduce
        is latency, not bandwidth).
    """

    min_steps: int = 8
    min_share: float = 0.25
    min_transfer_s: float = 0.005


@dataclass(frozen=True)
class OpSteps:
    """One op over the steps every rank holds: per step, each rank's time in it and the bytes
    it carried (the ranks' largest figure; None where no rank knew them)."""

    op: str
    seconds: tuple[Mapping[int, float], ...]
    nbytes: tuple[int | None, ...]


@dataclass(frozen=True)
class Inputs:
    ranks: tuple[int, ...]
    hosts: int  # the machines the ranks run on
    steps: tuple[int, ...]  # the step numbers every rank holds, in order
    step_s: tuple[float, ...]  # the job's time of each (its slowest rank's)
    ops: tuple[OpSteps, ...]
    on_gpu: bool = True  # every rank drives a GPU (else gloo on the host's CPU)


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    views = snapshot.view_of
    if len(views) < 2:
        return None
    by_rank: dict[int, dict[int, StepSample]] = {}
    for r, view in views.items():
        if not view.steps or view.steps[0].count > 1:
            return None  # serve: per-scrape means, no step to take a minimum over ranks in
        by_rank[r] = {s.step: s for s in view.steps if not s.flops_counted}
    common = set.intersection(*(set(steps) for steps in by_rank.values()))
    if len(common) < t.min_steps:
        return None
    steps = sorted(common)
    ranks = tuple(sorted(by_rank))
    if any(by_rank[r][k].collective_ops is None for r in ranks for k in steps):
        return None  # a rank whose collective wait is not measured: no minimum to take
    names: set[str] = set()
    for r in ranks:
        for k in steps:
            names.update(by_rank[r][k].collective_ops or {})
    ops: list[OpSteps] = []
    for op in sorted(names):
        seconds: list[Mapping[int, float]] = []
        nbytes: list[int | None] = []
        for k in steps:
            row = {r: by_rank[r][k] for r in ranks}
            seconds.append(
                {r: float((s.collective_ops or {}).get(op, 0.0)) for r, s in row.items()}
            )
            known = [
                b for s in row.values() if (b := (s.collective_bytes or {}).get(op)) is not None
            ]
            nbytes.append(max(known) if known else None)
        ops.append(OpSteps(op, tuple(seconds), tuple(nbytes)))
    step_s = tuple(max(by_rank[r][k].step_s for r in ranks) for k in steps)
    on_gpu = all(v.info.device != "cpu" for v in views.values())
    return Inputs(ranks, len(snapshot.hosts()), tuple(steps), step_s, tuple(ops), on_gpu)


@dataclass(frozen=True)
class OpTransfer:
    """One op's transfer a step (the least time any rank spent in it), its share of the job's
    step, the bytes a step, and the bandwidth achieved (bytes/s; None where the bytes are not
    known); each rank's wait for its peers in it beyond the transfer. ``since_step``: the op
    runs in every step from this one on (it began inside the window), and the figures are of
    those steps; None: of the whole window, the op's time spread over every step."""

    op: str
    transfer_s: float
    share: float
    nbytes: int | None
    algbw: float | None
    busbw: float | None
    wait_s: Mapping[int, float]
    since_step: int | None = None


@dataclass(frozen=True)
class Facts:
    """The ops whose transfer takes ``share`` of the job's step on every rank, largest first;
    ``same_host``: every rank on one machine (the link is the host's own, not a network);
    ``on_gpu``: every rank drives a GPU (else the collectives are gloo's, on the CPU)."""

    ops: tuple[OpTransfer, ...]
    share: float
    step_s: float
    ranks: int
    same_host: bool
    on_gpu: bool = True


def _every_step_since(o: OpSteps) -> int:
    """The index of the first of the window's last steps in all of which every rank ran the op
    (len(seconds) where the last step lacks it)."""
    k = len(o.seconds)
    while k > 0 and min(o.seconds[k - 1].values()) > 0.0:
        k -= 1
    return k


def transfers(i: Inputs, min_steps: int) -> list[OpTransfer]:
    """Every op's transfer and wait, largest transfer first. An op run in every step of the
    window's last ``min_steps`` or more is judged on those steps (what it costs now, though it
    began mid-window); any other (a metric gathered every N steps) by its time spread over
    every step of the window."""
    out: list[OpTransfer] = []
    n = len(i.ranks)
    for o in i.ops:
        since = _every_step_since(o)
        tail = len(o.seconds) - since >= min_steps
        at = range(since, len(o.seconds)) if tail else range(len(o.seconds))
        rows = [o.seconds[k] for k in at]
        mins = [min(row.values()) for row in rows]
        steps_s = [i.step_s[k] for k in at]
        if tail:
            transfer = statistics.median(mins)
            share = statistics.median(m / s for m, s in zip(mins, steps_s, strict=True) if s > 0)
        else:
            transfer = statistics.fmean(mins)
            share = sum(mins) / sum(steps_s) if sum(steps_s) > 0 else 0.0
        waits = {
            r: statistics.median(row[r] - m for row, m in zip(rows, mins, strict=True))
            for r in i.ranks
        }
        known = [b for k in at if (b := o.nbytes[k]) is not None]
        nbytes = int(statistics.median(known)) if known else None
        # The bandwidth of the steps that ran the op: bytes over that step's transfer.
        rates = [
            b / m for k, m in zip(at, mins, strict=True) if (b := o.nbytes[k]) is not None and m > 0
        ]
        algbw = statistics.median(rates) if rates else None
        factor = bus_factor(o.op, n)
        busbw = algbw * factor if algbw is not None and factor is not None else None
        since_step = i.steps[since] if tail and since > 0 else None
        out.append(OpTransfer(o.op, transfer, share, nbytes, algbw, busbw, waits, since_step))
    out.sort(key=lambda x: (-x.share, x.op))
    return out


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    ops = [o for o in transfers(i, t.min_steps) if o.transfer_s >= t.min_transfer_s]
    share = sum(o.share for o in ops)
    if not ops or share < t.min_share:
        return []
    facts = Facts(
        tuple(ops), share, statistics.median(i.step_s), len(i.ranks), i.hosts <= 1, i.on_gpu
    )
    # One host's gloo ranks reduce through its memory: no network to set.
    levers = [
        lever
        for lever in _levers(ops[0].op)
        if not (lever == "collective_network" and facts.same_host and not facts.on_gpu)
    ]
    fixes = tuple(Fix(lever, None, answers=(KIND,)) for lever in levers)
    evidence = {
        "share": round(share, 4),
        "step_ms": round(facts.step_s * 1e3, 2),
        "speedup_model": NOT_PREDICTED,
        "ops": [
            {
                "op": o.op,
                "transfer_ms": round(o.transfer_s * 1e3, 2),
                "share": round(o.share, 4),
                "bytes": o.nbytes,
                "algbw_gbps": None if o.algbw is None else round(o.algbw / 1e9, 4),
                "busbw_gbps": None if o.busbw is None else round(o.busbw / 1e9, 4),
                "wait_ms": {str(r): round(w * 1e3, 2) for r, w in sorted(o.wait_s.items())},
                "since_step": o.since_step,
            }
            for o in ops
        ],
    }
    return [
        Finding(
            kind=KIND,
            severity="warning",
            ranks=(),
            facts=facts,
            evidence=evidence,
            predicted_speedup=None,
            fixes=fixes,
        )
    ]


def _levers(op: str) -> tuple[str, ...]:
    """The job's levers, the network's first; the gradient all-reduce's own after it; for an
    object collective, less of it first (its cost is the pickling on every rank)."""
    if op == "ddp_allreduce":
        return ("collective_network", "bucket_cap_mb", "comm_hook")
    if is_object_op(op):
        return ("fewer_collectives", "collective_overlap")
    return ("collective_network", "collective_overlap", "fewer_collectives")


RULE = Rule(
    kind=KIND,
    place=47,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
)
