"""low_mfu: a GPU job that does far less work than its GPUs can, and where the gap goes.

Metric: the job's MFU (model FLOPs utilisation, :mod:`auditor.analysis.mfu`): the FLOPs the
ranks counted on a sampled step, at the device's dense peak for the dtype they ran in
(:mod:`auditor.analysis.peaks`), over the wall time they took: over the ranks' whole runs where
the time account knows them, else over a step at their pace. The gap, ``1 - MFU``, split into
the time account's parts (start-up, data wait, host-to-device copy, collective wait, stalls,
host overhead, teardown) and the device's own inefficiency (a micro-batch too small to fill the
device, or kernels below peak); apart from it, the time bf16 (or TF32) would give back where
matmuls ran in fp32.

What a model class reaches (the heuristic, by the FLOPs one training sample costs, forward and
backward, from the count):

* ``large`` (:attr:`Thresholds.large_flops` FLOPs a sample or more: language models of a billion
  parameters and up at 1-2k tokens): ``large_reach`` 40%. Well-tuned large training reports
  40-55% MFU: PaLM 540B 46.2% (Chowdhery et al. 2022, table 3), Megatron-LM's 1T-parameter GPT
  at 163 of 312 TFLOP/s a GPU, 52% (Narayanan et al. 2021), MegaScale 55.2% (Jiang et al. 2024).
* ``medium`` (``medium_flops`` a sample or more: ResNet-50 costs 3 x 4.1 GFLOPs an image, ViT-B/16
  about 53 GFLOPs): ``medium_reach`` 15%. ResNet-50 in MLPerf Training on A100s runs about 2,800
  images/s a GPU, ~11% of 312 TFLOP/s; vision transformers reach 30% and more.
* ``small`` (below): ``small_reach`` 5%. Small CNNs and MLPs rarely fill a data-centre GPU; no
  published figure, a few percent is what they reach with a batch that fills the device.
* ``unknown`` (the samples a step takes were not counted): the medium figure.

Decision: the job's MFU is under ``share_of_reach`` of its class's reach, or the fp32/TF32
matmuls alone would give back ``min_precision`` of the wall time in bf16 (a job at 70% of the
fp32 peak still does 5% of what an H100's tensor cores do: its MFU is high, its work is not).
Not judged: a CPU job (FLOP/s only), a device the peak table does not know (FLOP/s only, the
report says so), fewer than ``min_steps`` steps on every counted rank.

The finding lists the gap's parts and the precision lever, largest first, each as a share of
the wall time; the largest part with a lever leads:

* data wait and copy: the fixes a ``data_starvation`` (or ``cpu_oversubscription``) finding
  gives, named by kind (not copied: a fix is given once);
* collective wait: those of the straggler rules (``compute_straggler``, ``hardware_straggler``,
  ``batch_split``, ``slowdown``): the peers waited for; a wait no rank rule explains is every
  rank's (the collectives' own time), blamed on none;
* stalls: ``stall``'s fixes;
* precision: ``autocast_bf16`` (proposed ``fp16`` on a card without bf16: a V100, a T4; and
  ``tf32`` where fp32 matmuls ran with TF32 off and the card has it), every counted rank alike;
* a micro-batch too small to fill the device: ``batch_size``, raised to fill it (doubled until its
  FLOPs take :data:`~auditor.analysis.mfu.FILL_S` at the peak, at most ``max_batch_factor``
  times), capped by the batch ``memory_headroom`` says fits, and not on a rank whose memory
  climbs (``memory_growth``) or ``memory_pressure`` asks to shrink;
* start-up, teardown, host overhead and the device's other inefficiency: named, no lever.

Blame: a part explained by a rank rule's finding names that finding's ranks; otherwise the
finding blames no rank (every rank is alike: the job, not a rank, is slow). Predicted speed-up:
the leading lever's, ``1 / (1 - share)`` of the time it gives back (precision assumes the
kernels keep today's efficiency); not predicted for the batch (the step's time grows with it:
the gain is in samples per second, which the device's saturation decides). Severity: from that
speed-up (:func:`~auditor.analysis.findings.severity_for`), at most ``warning``, and ``info``
where the leading part's finding already says it or no part has a lever.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..findings import Finding, severity_for
from ..fixes import Fix
from ..mfu import (
    FILL_EFFICIENCY,
    FILL_S,
    PRECISION_DTYPES,
    JobMfu,
    RankFlops,
    job_mfu,
    rank_flops,
)
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "low_mfu"
LARGE = "large"
MEDIUM = "medium"
SMALL = "small"
UNKNOWN = "unknown"
# Parts of the gap (``JobMfu.gap``) and the lever apart from it.
PRECISION = "precision"
SMALL_BATCH = "small_batch"
# The rank rules whose fixes answer a part, by part (the first with a finding names it).
ANSWERED_BY: Mapping[str, tuple[str, ...]] = {
    "data_wait": ("data_starvation", "cpu_oversubscription"),
    "h2d": ("data_starvation",),
    "collective_wait": ("compute_straggler", "hardware_straggler", "batch_split", "slowdown"),
    "stalls": ("stall",),
}
# The finding kinds that hold back a larger batch on the ranks they name.
NO_LARGER_BATCH = ("memory_growth", "memory_pressure")
# The finding whose batch fits the rank's memory.
HEADROOM = "memory_headroom"
# The evidence's ``speedup_model`` codes (the report words them).
LEVER_SHARE = "lever_share"
NOT_PREDICTED = "not_predicted"
NO_LEVER = "no_lever"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a counted rank needs in the window before the job is judged.
    share_of_reach: the job is well below its class when its MFU is under this share of what
        the class reaches.
    large_flops: FLOPs one training sample costs (forward and backward) from which a model is
        ``large``.
    medium_flops: ... from which it is ``medium``.
    large_reach: the MFU well-tuned ``large`` models reach (see the module's docstring).
    medium_reach: the MFU ``medium`` models reach.
    small_reach: the MFU ``small`` models reach.
    min_precision: share of the wall time bf16 would give back from which the precision
        lever alone raises the finding.
    min_part: parts of the gap under this share of the wall time are not listed.
    fill_s: a micro-batch whose FLOPs take under this at the peak is too small to fill the
        device (:data:`~auditor.analysis.mfu.FILL_S`) ...
    fill_efficiency: ... when the compute phases run under this share of the peak.
    max_batch_factor: the most a batch is raised by at once.
    """

    min_steps: int = 8
    share_of_reach: float = 0.5
    large_flops: float = 1e12
    medium_flops: float = 1e10
    large_reach: float = 0.40
    medium_reach: float = 0.15
    small_reach: float = 0.05
    min_precision: float = 0.25
    min_part: float = 0.02
    fill_s: float = FILL_S
    fill_efficiency: float = FILL_EFFICIENCY
    max_batch_factor: int = 8


@dataclass(frozen=True)
class Inputs:
    """The job's MFU and its split (:class:`~auditor.analysis.mfu.JobMfu`), each counted rank's
    figures (:class:`~auditor.analysis.mfu.RankFlops`; ranks with ``min_steps`` steps) and its
    micro-batch (samples per DataLoader batch; None: not measured)."""

    job: JobMfu
    ranks: Mapping[int, RankFlops]
    micro_batch: Mapping[int, float | None]


@dataclass(frozen=True)
class Part:
    """One part of the gap, or the precision lever: its share of the wall time, the lever that
    gives it back (None: none), the finding kind whose fixes do (None: this finding's own, or
    none), and the ranks that finding blames."""

    name: str
    share: float
    lever: str | None = None
    by: str | None = None
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class Facts:
    """The job's MFU against what its class reaches, the parts largest first (``lead``: the
    index of the one with a lever that leads, None where none has one), the precision figures
    (shares of the wall time bf16, or TF32 alone, gives back), the batch proposed per rank
    (``(current, proposed)`` micro-batch), and what the figures are over."""

    mfu: float
    reach: float
    model_class: str
    flops_per_s: float | None
    flops_per_sample: float | None
    device_name: str | None
    dtype: str | None
    basis: str
    parts: tuple[Part, ...]
    lead: int | None
    precision: float
    tf32: float
    batch: Mapping[int, tuple[float, int]]
    ranks: tuple[int, ...]


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    flops = {
        r: f
        for r, f in rank_flops(snapshot).items()
        if r in snapshot.stats and snapshot.stats[r].steps >= t.min_steps
    }
    if not flops or not any(f.on_gpu and f.mfu is not None for f in flops.values()):
        return None
    job = job_mfu(snapshot, flops=flops, fill_s=t.fill_s, fill_efficiency=t.fill_efficiency)
    if job is None or job.mfu is None:
        return None
    paced = snapshot.paced
    return Inputs(job, flops, {r: paced[r].micro_batch_size for r in flops if r in paced})


def model_class(flops_per_sample: float | None, t: Thresholds) -> tuple[str, float]:
    """The model's class by the FLOPs a sample costs, and the MFU it reaches."""
    if flops_per_sample is None:
        return UNKNOWN, t.medium_reach
    if flops_per_sample >= t.large_flops:
        return LARGE, t.large_reach
    if flops_per_sample >= t.medium_flops:
        return MEDIUM, t.medium_reach
    return SMALL, t.small_reach


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Judge the job's MFU against its class's, and order what closes the gap."""
    job = i.job
    if job.mfu is None:
        return []
    per_sample = [f.flops_per_sample for f in i.ranks.values() if f.flops_per_sample]
    fps = sorted(per_sample)[len(per_sample) // 2] if per_sample else None
    cls, reach = model_class(fps, t)
    low = job.mfu < t.share_of_reach * reach
    if not low and job.precision < t.min_precision:
        return []
    judged = tuple(sorted(r for r in job.ranks if r in i.ranks))
    by_kind: dict[str, list[Finding]] = {}
    for f in explained.findings:
        by_kind.setdefault(f.kind, []).append(f)
    batch = _batches(i, t, judged, by_kind)
    parts = []
    for name, share in job.gap.items():
        if share < t.min_part:
            continue
        lever: str | None = None
        by: str | None = None
        ranks: tuple[int, ...] = ()
        answer = next((k for k in ANSWERED_BY.get(name, ()) if k in by_kind), None)
        if answer is not None:
            by = answer
            ranks = tuple(sorted({r for f in by_kind[answer] for r in f.ranks}))
            lever = next((x.lever for f in by_kind[answer] for x in f.fixes), None)
        elif name == SMALL_BATCH and batch:
            lever = "batch_size"
        parts.append(Part(name, share, lever, by, ranks))
    if job.precision >= t.min_part:
        parts.append(Part(PRECISION, job.precision, "autocast_bf16"))
    parts.sort(key=lambda p: (-p.share, p.name))
    lead = next((n for n, p in enumerate(parts) if p.lever is not None), None)
    top = parts[lead] if lead is not None else None
    speedup = None
    if top is not None and top.name != SMALL_BATCH and top.share < 1:
        speedup = 1.0 / (1.0 - top.share)
    severity = severity_for(speedup)
    if severity == "critical":
        severity = "warning"  # the job's efficiency, never a rank's failure
    if top is None or top.by is not None:
        severity = "info"  # the rank rule's finding says it, with its severity
    fixes: list[Fix] = []
    precise = next((p for p in parts if p.name == PRECISION), None)
    if precise is not None:
        gain = 1.0 / (1.0 - precise.share) if precise.share < 1 else None
        tf32_gain = 1.0 / (1.0 - job.tf32) if 0 < job.tf32 < 1 else None
        for r in judged:
            rf = i.ranks[r]
            if rf.half_ideal_s is None:
                continue
            slow = max(
                (d for d in PRECISION_DTYPES if d in rf.by_dtype), key=rf.by_dtype.__getitem__
            )
            half = rf.half_dtype or "bf16"
            fixes.append(Fix("autocast_bf16", r, slow, half, gain, (KIND,)))
            if rf.tf32_ideal_s is not None and tf32_gain is not None:
                fixes.append(Fix("tf32", r, False, True, tf32_gain, (KIND,)))
    if any(p.name == SMALL_BATCH and p.lever for p in parts):
        fixes += [Fix("batch_size", r, cur, new, None, (KIND,)) for r, (cur, new) in batch.items()]
    blamed = top.ranks if top is not None else ()
    facts = Facts(
        mfu=job.mfu,
        reach=reach,
        model_class=cls,
        flops_per_s=job.flops_per_s,
        flops_per_sample=fps,
        device_name=job.device_name,
        dtype=job.dtype,
        basis=job.basis,
        parts=tuple(parts),
        lead=lead,
        precision=job.precision,
        tf32=job.tf32,
        batch=batch,
        ranks=judged,
    )
    evidence = {
        "mfu": round(job.mfu, 4),
        "reach": reach,
        "model_class": cls,
        "flops_per_s": None if job.flops_per_s is None else float(f"{job.flops_per_s:.4g}"),
        "flops_per_sample": None if fps is None else float(f"{fps:.4g}"),
        "device": job.device_name,
        "dtype": job.dtype,
        "basis": job.basis,
        "gap": {k: round(v, 4) for k, v in job.gap.items()},
        "precision": round(job.precision, 4),
        "tf32": round(job.tf32, 4),
        "parts": [
            {"part": p.name, "share": round(p.share, 4), "lever": p.lever, "by": p.by}
            for p in parts
        ],
        "ranks": list(judged),
        "speedup_model": (
            LEVER_SHARE if speedup is not None else NO_LEVER if top is None else NOT_PREDICTED
        ),
    }
    return [
        Finding(
            kind=KIND,
            severity=severity,
            ranks=blamed,
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
            fixes=tuple(fixes),
        )
    ]


def _batches(
    i: Inputs, t: Thresholds, judged: tuple[int, ...], by_kind: Mapping[str, list[Finding]]
) -> dict[int, tuple[float, int]]:
    """The micro-batch proposed on each rank whose micro-batch is too small to fill its device:
    doubled until its FLOPs take ``fill_s`` at the peak (at most ``max_batch_factor`` times),
    within the batch memory_headroom says fits; none on a rank whose memory must not grow."""
    held = {r for k in NO_LARGER_BATCH for f in by_kind.get(k, ()) for r in f.ranks}
    fits = {
        x.rank: x.proposed
        for f in by_kind.get(HEADROOM, ())
        for x in f.fixes
        if x.lever == "batch_size" and isinstance(x.proposed, int) and x.rank is not None
    }
    out: dict[int, tuple[float, int]] = {}
    for r in i.job.small_batch_ranks:
        current = i.micro_batch.get(r)
        ideal = i.ranks[r].ideal_per_micro_batch_s if r in i.ranks else None
        if r not in judged or r in held or not current or not ideal:
            continue
        factor = min(t.max_batch_factor, 2 ** math.ceil(math.log2(max(1.0, t.fill_s / ideal))))
        proposed = round(current * factor)
        if r in fits:
            proposed = min(proposed, int(fits[r]))
        if proposed > current:
            out[r] = (current, proposed)
    return out


RULE = Rule(
    kind=KIND,
    place=120,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=(
        "cpu_oversubscription",
        "data_starvation",
        "batch_split",
        "hardware_straggler",
        "stall",
        "slowdown",
        "compute_straggler",
        "memory_growth",
        "memory_pressure",
        "memory_headroom",
    ),
)
