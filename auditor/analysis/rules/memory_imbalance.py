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
``memory_imbalance`` finding (:func:`auditor.analysis.measures.imbalance_finding`), and the
engine drops this rule's finding on the same GPU (:func:`auditor.analysis.causes.drop_repeats`).

Measured budgets (the probe's, :class:`auditor.samples.MemoryBudget`): the ranks' parts are
compared one by one (parameters, gradients, optimizer state, buffers, activations per step and
modules outside the model). DDP ranks should hold the same bytes in each; a rank whose parts
exceed its peers' medians by at least ``min_budget_extra_bytes`` in all and ``min_budget_share``
of the peers' median total is blamed with the extra bytes by part: a rank keeping an extra copy
of the model (EMA, evaluation) shows as ``other_module_bytes``. Ranks an NVML or probe-peak
finding already blamed are not named twice. Works on a CPU job (no GPU needed); there, and
wherever the rank's total stays below ``near_full`` of its GPU, the finding is ``info``.

Speed-up: not predicted. Memory does not set the step time; it caps the batch. Severity:
``warning`` when the heavy GPU is at least ``near_full`` of its total at its peak, else ``info``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..budget import host_short as is_host_short
from ..devices import GIB
from ..findings import Finding
from ..measures import (
    PeerMedians,
    heavy,
    imbalance_finding,
    measured_gpus,
    peer_median_bytes,
)
from ..snapshot import Snapshot

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
SPEEDUP_NOTE = (
    "not predicted: memory does not set the step time; it caps the batch every rank can use"
)


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


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_samples: int = 5,
    min_ratio: float = 1.5,
    min_extra_bytes: int = GIB,
    near_full: float = 0.8,
    stray_share: float = 0.5,
    min_budget_extra_bytes: int = MIB,
    min_budget_share: float = 0.10,
    host_short: float = 0.05,
) -> list[Finding]:
    """Find GPUs holding far more memory than their peers.

    Args:
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
    findings = _detect_devices(
        snapshot,
        min_steps=min_steps,
        min_samples=min_samples,
        min_ratio=min_ratio,
        min_extra_bytes=min_extra_bytes,
        near_full=near_full,
        stray_share=stray_share,
    )
    blamed = {r for f in findings for r in f.ranks}
    findings.extend(
        _from_budgets(
            snapshot,
            blamed,
            min_extra=min_budget_extra_bytes,
            min_share=min_budget_share,
            near_full=near_full,
            short=host_short,
        )
    )
    return findings


def _detect_devices(
    snapshot: Snapshot,
    *,
    min_steps: int,
    min_samples: int,
    min_ratio: float,
    min_extra_bytes: int,
    near_full: float,
    stray_share: float,
) -> list[Finding]:
    """GPU memory (NVML) or the probe's per-step peaks across ranks."""
    stats = snapshot.ready(min_steps)
    if not stats:
        return []
    dstats = measured_gpus(snapshot, min_samples)
    owners = snapshot.owners
    gpus_of = snapshot.gpus_of
    modes = {v.info.rank: v.info.parallel_mode for v in snapshot.ranks}

    findings: list[Finding] = []
    # DataParallel: the GPUs of one process against each other.
    for r in sorted(stats):
        if modes.get(r) != "dataparallel":
            continue
        mine = {u: dstats[u] for u in gpus_of.get(r, ()) if u in dstats}
        mem = {u: d.mem_used_bytes for u, d in mine.items() if d.mem_used_bytes is not None}
        for uuid, ratio in heavy(mem, min_ratio, min_extra_bytes).items():
            ds = mine[uuid]
            facts = HeavyDataParallelGpu(
                rank=r,
                gpu=ds.label,
                index=ds.index,
                ratio=ratio,
                mem_bytes=ds.mem_used_bytes,
                peer_bytes=peer_median_bytes(mem, uuid),
            )
            findings.append(
                imbalance_finding(
                    ds,
                    mine,
                    mem,
                    ranks=(r,),
                    facts=facts,
                    near_full=near_full,
                    owners=owners,
                )
            )

    # One GPU per rank (DDP): ranks against each other.
    single = {
        r: gpus_of[r][0]
        for r in stats
        if modes.get(r) != "dataparallel"
        and len(gpus_of.get(r, ())) == 1
        and gpus_of[r][0] in dstats
        and owners.get(gpus_of[r][0]) == (r,)
        and dstats[gpus_of[r][0]].mem_used_bytes is not None
    }
    if len(single) >= 2:
        rank_mem = {r: float(dstats[u].mem_used_bytes or 0.0) for r, u in single.items()}
        strays = snapshot.strays
        for r, ratio in heavy(rank_mem, min_ratio, min_extra_bytes).items():
            uuid = single[r]
            ds = dstats[uuid]
            peer = peer_median_bytes(rank_mem, r)
            excess = rank_mem[r] - peer
            foreign = strays.get(uuid, {})
            known = sum(b for b in foreign.values() if b is not None)
            if foreign and (None in foreign.values() or known >= stray_share * excess):
                blamed = tuple(sorted(foreign))
                allocating: dict[int, int | None] = {q: foreign[q] for q in blamed}
            else:
                blamed = (r,)
                allocating = {}
            by_uuid = {single[q]: dstats[single[q]] for q in single}
            findings.append(
                imbalance_finding(
                    ds,
                    by_uuid,
                    {single[q]: m for q, m in rank_mem.items()},
                    ranks=blamed,
                    facts=HeavyGpu(r, ds.label, ratio, rank_mem[r], peer, allocating),
                    near_full=near_full,
                    owners=owners,
                    extra={
                        "stray_processes": {
                            str(q): {"bytes": b} for q, b in sorted(foreign.items())
                        },
                    },
                )
            )
    else:
        findings.extend(_from_probe(stats, modes, min_ratio, min_extra_bytes))
    return findings


def _from_probe(
    stats: Mapping[int, Any], modes: Mapping[int, str], min_ratio: float, min_extra: float
) -> list[Finding]:
    """Without NVML samples: compare the probe's per-step peaks (no GPU to name)."""
    peaks = {
        r: s.mem_peak_bytes
        for r, s in stats.items()
        if modes.get(r) != "dataparallel" and s.mem_peak_bytes is not None
    }
    out: list[Finding] = []
    for r, ratio in heavy(peaks, min_ratio, min_extra).items():
        peer = peer_median_bytes(peaks, r)
        mine = float(peaks[r] or 0.0)
        out.append(
            Finding(
                kind="memory_imbalance",
                severity="info",
                ranks=(r,),
                facts=HeavyPeak(r, ratio, mine, peer),
                evidence={
                    "gpus": [],
                    "source": "probe: torch.cuda.max_memory_allocated per step",
                    "mem_peak_bytes": {
                        str(q): round(float(v or 0)) for q, v in sorted(peaks.items())
                    },
                    "ratio_to_peers": round(ratio, 2),
                    "speedup_model": SPEEDUP_NOTE,
                },
            )
        )
    return out


def _from_budgets(
    snapshot: Snapshot,
    blamed: set[int],
    *,
    min_extra: float,
    min_share: float,
    near_full: float,
    short: float,
) -> list[Finding]:
    """Ranks whose measured parts exceed their peers' (see the module doc)."""
    budgets = {
        v.info.rank: v.memory
        for v in snapshot.ranks
        if v.memory is not None and v.info.parallel_mode != "dataparallel"
    }
    if len(budgets) < 2:
        return []
    parts: dict[str, dict[int, float]] = {
        p: {r: float(getattr(b, p)) for r, b in budgets.items() if getattr(b, p) is not None}
        for p in BUDGET_PARTS
    }
    totals = {r: sum(parts[p].get(r, 0.0) for p in BUDGET_PARTS) for r in budgets}
    peer_totals = PeerMedians(totals)
    out: list[Finding] = []
    for r, b in sorted(budgets.items()):
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
        if excess < min_extra or excess < min_share * peer_total:
            continue
        main = max(extra, key=lambda p: extra[p])
        full = (
            b.device_total_bytes is not None and totals[r] >= near_full * b.device_total_bytes
        ) or (b.device_total_bytes is None and is_host_short(b, short))
        facts = HeavyBudget(
            rank=r,
            extra_by_part=extra,
            extra_bytes=excess,
            main_part=main,
        )
        out.append(
            Finding(
                kind="memory_imbalance",
                severity="warning" if full else "info",
                ranks=(r,),
                facts=facts,
                evidence={
                    "gpus": [],
                    "source": "measured budget (probe)",
                    "extra_bytes": excess,
                    "extra_by_part": extra,
                    "per_rank": {
                        str(q): {p: parts[p].get(q) for p in BUDGET_PARTS} for q in sorted(budgets)
                    },
                    "peer_median_total_bytes": round(peer_total),
                    "speedup_model": SPEEDUP_NOTE,
                },
                predicted_speedup=None,
            )
        )
    return out
