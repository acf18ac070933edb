"""memory_imbalance: one GPU of a job holding far more memory than its peers.

Metric: per rank, the median memory in use on its GPU over the window (NVML, as ``nvidia-smi``
shows it: the caching allocator's reserved memory plus the CUDA context), or where no GPU was
sampled the probe's per-step peak (``torch.cuda.max_memory_allocated``). One source for every
rank compared, never a mix. Decision: a rank's memory is at least ``min_ratio`` times the median
of its peers' and at least ``min_extra_bytes`` above it (so small models' noise does not count).

Why it matters: DDP ranks run the same model on equal batches, so their memory should match. A
heavy rank limits the batch every rank can use (the heaviest one runs out first) and usually
does work the others do not. Two causes are told apart:

* *stray allocations*: other ranks' processes hold memory on this GPU (NVML lists their PIDs):
  they touched ``cuda:0`` before ``torch.cuda.set_device`` or loaded a checkpoint without
  ``map_location``. Those ranks are blamed, not the GPU's owner.
* *rank-specific work*: evaluation, metrics, an EMA or checkpoint copy kept on one rank only.
  The rank itself is blamed.

DataParallel: one process drives every GPU, so the comparison is between the GPUs of that process.
GPU 0 carrying the gathered outputs is the ``dataparallel_gather`` rule's; it emits its own
``memory_imbalance`` finding (:func:`auditor.analysis.measures.imbalance_finding`), and this rule
(explained by ``dataparallel_gather``) leaves out its own findings on a GPU that finding names
(``Finding.gpus``).

Measured budgets (the probe's, :class:`auditor.samples.MemoryBudget`): the ranks' parts are
compared one by one (parameters, gradients, optimizer state, buffers, activations per step and
modules outside the model). DDP ranks should hold the same bytes in each; a rank whose parts
exceed its peers' medians by at least ``min_budget_extra_bytes`` in all and ``min_budget_share``
of the peers' median total is blamed with the extra bytes by part: a rank keeping an extra copy
of the model (EMA, evaluation) shows as ``other_module_bytes``. Ranks an NVML or probe-peak
finding already blamed are not named twice. Works on a CPU job (no GPU needed); there, and
wherever the rank's total stays below ``near_full`` of its GPU, the finding is ``info``.

Fixes (:class:`~auditor.analysis.fixes.Fix`): ``stray_process`` for a rank allocating on another
rank's GPU (its bytes there -> 0), else ``memory_release`` on the heavy rank (its bytes over the
peers' median -> 0), with the GPU's UUID where one is named. Evidence codes (the report words
them): ``source`` ``probe_peak`` or ``budget``, ``speedup_model`` ``not_predicted``.

Speed-up: not predicted. Memory does not set the step time; it caps the batch. Severity:
``warning`` when the heavy GPU is at least ``near_full`` of its total at its peak, else ``info``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..budget import short_of
from ..devices import GIB
from ..findings import Finding
from ..fixes import Fix
from ..measures import (
    NOT_PREDICTED,
    GpuMemory,
    PeerMedians,
    heavy,
    imbalance_finding,
    measured_gpus,
    peer_median_bytes,
)
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "memory_imbalance"
MIB = 1024**2
# The parts of a measured budget compared across ranks (activation_bytes: one sampled step's).
BUDGET_PARTS = (
    "param_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "buffer_bytes",
    "activation_bytes",
    "other_module_bytes",
)
# Evidence ``source`` codes: the probe's per-step peaks, the probe's measured budgets.
PROBE_PEAK = "probe_peak"
BUDGET = "budget"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_samples: NVML samples a GPU needs in the window before it is judged.
    min_ratio: memory relative to the peers' median that counts as heavy (1.5 = 50% more).
    min_extra_bytes: the excess over the peers' median must be at least this.
    near_full: share of the GPU's total at which the finding becomes a warning.
    stray_share: other ranks' processes holding at least this share of the excess are
        the cause (blamed instead of the GPU's owner).
    min_budget_extra_bytes: measured budgets: least extra bytes over the peers' medians.
    min_budget_share: measured budgets: least extra as a share of the peers' median total.
    host_short: a CPU job's host with available memory below this share of its total is
        short (the budget finding then warns).
    """

    min_steps: int = 8
    min_samples: int = 5
    min_ratio: float = 1.5
    min_extra_bytes: int = GIB
    near_full: float = 0.8
    stray_share: float = 0.5
    min_budget_extra_bytes: int = MIB
    min_budget_share: float = 0.10
    host_short: float = 0.05


@dataclass(frozen=True)
class Inputs:
    """What the three comparisons read.

    * DataParallel ranks ready to judge (rank order): their measured GPUs (``min_samples`` or
      more), in the rank's GPU order.
    * Other ranks ready to judge that own exactly one measured GPU with its memory read: that GPU
      (``own_gpu``); other ranks' processes on those GPUs (``strays``: UUID to rank to bytes,
      None where unknown; read where two or more such GPUs are compared).
    * Per GPU of either: its median memory in use (``mem``) and what a memory finding names it
      by (``gpus``).
    * Without two such GPUs: the ready non-DataParallel ranks' per-step peak allocation.
    * Non-DataParallel ranks with a measured budget (ready or not): each compared part (part to
      rank to bytes), and the figures that say whether the rank is near full: its device's
      total (None on a CPU job) and its host's available and total memory.
    """

    dp_gpus: Mapping[int, tuple[str, ...]]
    own_gpu: Mapping[int, str]
    strays: Mapping[str, Mapping[int, int | None]]
    mem: Mapping[str, float | None]
    gpus: GpuMemory
    peaks: Mapping[int, float]
    budget_ranks: tuple[int, ...]
    parts: Mapping[str, Mapping[int, float]]
    device_total: Mapping[int, int | None]
    host_available: Mapping[int, int | None]
    host_total: Mapping[int, int | None]


@dataclass(frozen=True)
class HeavyDataParallelGpu:
    """A GPU of DataParallel ``rank`` (its label and index) holding ``ratio`` times the median
    memory of the process's other GPUs."""

    rank: int
    gpu: str
    index: int
    ratio: float
    mem_bytes: float | None
    peer_bytes: float


@dataclass(frozen=True)
class HeavyGpu:
    """The GPU (its label) of ``rank`` holding ``ratio`` times its peers' median memory, and the
    other ranks' processes that allocate on it, blamed instead of the owner (rank to bytes, None
    where unknown; empty: the owner is blamed)."""

    rank: int
    gpu: str
    ratio: float
    mem_bytes: float
    peer_bytes: float
    strays: Mapping[int, int | None]


@dataclass(frozen=True)
class HeavyPeak:
    """Without NVML: ``rank``'s per-step peak allocation, ``ratio`` times its peers' median."""

    rank: int
    ratio: float
    peak_bytes: float
    peer_bytes: float


@dataclass(frozen=True)
class HeavyBudget:
    """``rank``'s measured budget parts above its peers' medians (part to extra bytes), their
    sum, and the part with the most."""

    rank: int
    extra_by_part: Mapping[str, int]
    extra_bytes: int
    main_part: str


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    budgets = {
        v.info.rank: v.memory
        for v in snapshot.ranks
        if v.memory is not None and v.info.parallel_mode != "dataparallel"
    }
    if not stats and len(budgets) < 2:
        return None
    dstats = measured_gpus(snapshot, t.min_samples) if stats else {}
    owners = snapshot.owners if stats else {}
    gpus_of = snapshot.gpus_of if stats else {}
    modes = {v.info.rank: v.info.parallel_mode for v in snapshot.ranks}
    dp_gpus = {
        r: tuple(u for u in gpus_of.get(r, ()) if u in dstats)
        for r in sorted(stats)
        if modes.get(r) == "dataparallel"
    }
    single = {
        r: gpus_of[r][0]
        for r in stats
        if modes.get(r) != "dataparallel"
        and len(gpus_of.get(r, ())) == 1
        and gpus_of[r][0] in dstats
        and owners.get(gpus_of[r][0]) == (r,)
        and dstats[gpus_of[r][0]].mem_used_bytes is not None
    }
    named = [dstats[u] for u in dict.fromkeys(u for g in dp_gpus.values() for u in g)]
    named += [dstats[u] for u in single.values()]
    peaks = (
        {}
        if len(single) >= 2
        else {
            r: s.mem_peak_bytes
            for r, s in stats.items()
            if modes.get(r) != "dataparallel" and s.mem_peak_bytes is not None
        }
    )
    in_budget = budgets if len(budgets) >= 2 else {}
    return Inputs(
        dp_gpus=dp_gpus,
        own_gpu=single,
        strays=snapshot.strays if len(single) >= 2 else {},
        mem={d.uuid: d.mem_used_bytes for d in named},
        gpus=GpuMemory.of(named, owners),
        peaks=peaks,
        budget_ranks=tuple(in_budget),
        parts={
            p: {r: float(getattr(b, p)) for r, b in in_budget.items() if getattr(b, p) is not None}
            for p in BUDGET_PARTS
        },
        device_total={r: b.device_total_bytes for r, b in in_budget.items()},
        host_available={r: b.host_available_bytes for r, b in in_budget.items()},
        host_total={r: b.host_total_bytes for r, b in in_budget.items()},
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find GPUs (or ranks) holding far more memory than their peers. A GPU an explaining
    finding already names as a ``memory_imbalance`` (dataparallel_gather's, on its primary GPU)
    is not named again."""
    findings = _dataparallel(i, t) + _ranks(i, t)
    blamed = {r for f in findings for r in f.ranks}
    findings.extend(_from_budgets(i, t, blamed))
    named = {g for f in explained.findings if f.kind == KIND for g in f.gpus}
    if named:
        findings = [f for f in findings if f.cause or not set(f.gpus) & named]
    return findings


def _dataparallel(i: Inputs, t: Thresholds) -> list[Finding]:
    """DataParallel: the GPUs of one process against each other."""
    findings: list[Finding] = []
    for r, mine in i.dp_gpus.items():
        mem = {u: i.mem[u] for u in mine if i.mem[u] is not None}
        for uuid, ratio in heavy(mem, t.min_ratio, t.min_extra_bytes).items():
            peer = peer_median_bytes(mem, uuid)
            facts = HeavyDataParallelGpu(
                rank=r,
                gpu=i.gpus.label[uuid],
                index=i.gpus.ref[uuid]["index"],
                ratio=ratio,
                mem_bytes=i.mem[uuid],
                peer_bytes=peer,
            )
            excess = round((i.mem[uuid] or 0.0) - peer)
            findings.append(
                imbalance_finding(
                    uuid,
                    i.gpus,
                    mine,
                    mem,
                    ranks=(r,),
                    facts=facts,
                    near_full=t.near_full,
                    fixes=[Fix("memory_release", r, excess, 0, None, (KIND,), uuid)],
                )
            )
    return findings


def _ranks(i: Inputs, t: Thresholds) -> list[Finding]:
    """One GPU per rank (DDP): ranks against each other; without two such GPUs, the probe's
    per-step peaks."""
    single = i.own_gpu
    if len(single) < 2:
        return _from_probe(i, t)
    findings: list[Finding] = []
    rank_mem = {r: float(i.mem[u] or 0.0) for r, u in single.items()}
    compared = [single[q] for q in single]
    by_uuid = {single[q]: m for q, m in rank_mem.items()}
    for r, ratio in heavy(rank_mem, t.min_ratio, t.min_extra_bytes).items():
        uuid = single[r]
        peer = peer_median_bytes(rank_mem, r)
        excess = rank_mem[r] - peer
        foreign = i.strays.get(uuid, {})
        known = sum(b for b in foreign.values() if b is not None)
        if foreign and (None in foreign.values() or known >= t.stray_share * excess):
            blamed = tuple(sorted(foreign))
            allocating: dict[int, int | None] = {q: foreign[q] for q in blamed}
            fixes = [
                Fix("stray_process", q, b, 0, None, (KIND,), uuid) for q, b in allocating.items()
            ]
        else:
            blamed = (r,)
            allocating = {}
            fixes = [Fix("memory_release", r, round(excess), 0, None, (KIND,), uuid)]
        findings.append(
            imbalance_finding(
                uuid,
                i.gpus,
                compared,
                by_uuid,
                ranks=blamed,
                facts=HeavyGpu(r, i.gpus.label[uuid], ratio, rank_mem[r], peer, allocating),
                near_full=t.near_full,
                fixes=fixes,
                extra={
                    "stray_processes": {str(q): {"bytes": b} for q, b in sorted(foreign.items())},
                },
            )
        )
    return findings


def _from_probe(i: Inputs, t: Thresholds) -> list[Finding]:
    """Without NVML samples: compare the probe's per-step peaks (no GPU to name)."""
    peaks = i.peaks
    out: list[Finding] = []
    for r, ratio in heavy(peaks, t.min_ratio, t.min_extra_bytes).items():
        peer = peer_median_bytes(peaks, r)
        mine = float(peaks[r] or 0.0)
        out.append(
            Finding(
                kind=KIND,
                severity="info",
                ranks=(r,),
                facts=HeavyPeak(r, ratio, mine, peer),
                evidence={
                    "gpus": [],
                    "source": PROBE_PEAK,
                    "mem_peak_bytes": {
                        str(q): round(float(v or 0)) for q, v in sorted(peaks.items())
                    },
                    "ratio_to_peers": round(ratio, 2),
                    "speedup_model": NOT_PREDICTED,
                },
                fixes=(Fix("memory_release", r, round(mine - peer), 0, None, (KIND,)),),
            )
        )
    return out


def _from_budgets(i: Inputs, t: Thresholds, blamed: set[int]) -> list[Finding]:
    """Ranks whose measured parts exceed their peers' (see the module doc)."""
    if len(i.budget_ranks) < 2:
        return []
    parts = i.parts
    totals = {r: sum(parts[p].get(r, 0.0) for p in BUDGET_PARTS) for r in i.budget_ranks}
    peer_totals = PeerMedians(totals)
    out: list[Finding] = []
    for r in sorted(i.budget_ranks):
        if r in blamed:
            continue
        extra: dict[str, int] = {}
        for p in BUDGET_PARTS:
            if r not in parts[p] or len(parts[p]) < 2:
                continue
            over = parts[p][r] - peer_median_bytes(parts[p], r)
            if over > 0:
                extra[p] = round(over)
        excess = sum(extra.values())
        peer_total = peer_totals.get(r) or 0.0
        if excess < t.min_budget_extra_bytes or excess < t.min_budget_share * peer_total:
            continue
        main = max(extra, key=lambda p: extra[p])
        device_total = i.device_total[r]
        full = (device_total is not None and totals[r] >= t.near_full * device_total) or (
            device_total is None and short_of(i.host_available[r], i.host_total[r], t.host_short)
        )
        facts = HeavyBudget(
            rank=r,
            extra_by_part=extra,
            extra_bytes=excess,
            main_part=main,
        )
        out.append(
            Finding(
                kind=KIND,
                severity="warning" if full else "info",
                ranks=(r,),
                facts=facts,
                evidence={
                    "gpus": [],
                    "source": BUDGET,
                    "extra_bytes": excess,
                    "extra_by_part": extra,
                    "per_rank": {
                        str(q): {p: parts[p].get(q) for p in BUDGET_PARTS}
                        for q in sorted(i.budget_ranks)
                    },
                    "peer_median_total_bytes": round(peer_total),
                    "speedup_model": NOT_PREDICTED,
                },
                predicted_speedup=None,
                fixes=(Fix("memory_release", r, excess, 0, None, (KIND,)),),
            )
        )
    return out


RULE = Rule(
    kind=KIND,
    place=70,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=("dataparallel_gather",),
)
