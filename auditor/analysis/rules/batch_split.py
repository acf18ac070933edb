"""batch_split: ranks of one DDP job that train on different per-rank batch sizes.

Metric: the median batch size per rank (samples per optimizer step) and the compute time per
sample. Decision: a split is uneven when the largest batch is at least ``min_ratio`` times the
smallest. Blamed: the ranks whose batch is larger than the one that equalises work; the others
only wait for them.

Why it matters beyond speed (DDP and FSDP): the gradient is averaged with equal weight per rank,
so a sample of a small-batch rank counts ``b_large / b_small`` times one of a large-batch rank;
and with a ``DistributedSampler`` every rank draws the same number of samples per epoch, so the
small-batch rank takes that many times more steps to finish its epoch: the ranks' epochs end at
different steps (a collective then waits for a rank that has stopped, or the ranks drift apart
in epochs). So an uneven split under DDP or FSDP is at least a ``warning``, whatever its speed
effect.

Fix: the equal split that keeps the global batch (48 + 16 -> 32 + 32), largest remainder where it
does not divide; the evidence also gives the split that would equalise compute time
(``b_r ~ 1 / (compute per sample of r)``). Where the ranks differ in speed enough for the two to
differ, the fix adds the alternative that keeps the uneven split correct: weight each rank's loss
by its share of the global batch. Blamed: the ranks whose batch is above the equal split (the
others wait for them when speeds are equal). Predicted speed-up: the equal split's, under the
barrier model.

DataParallel: one process drives every GPU and splits each batch with ``torch.chunk``:
``ceil(batch / GPUs)`` per GPU, the last GPU the remainder (30 over 4 is 8, 8, 8, 6; 3 over 4
leaves a GPU with nothing). The GPUs run their chunks in parallel, so the step's compute is paced
by the largest chunk and the short GPUs idle for the difference. Blamed: the DataParallel rank;
evidence names every GPU's chunk and the short GPUs. Fix: the nearest batch sizes that divide by
the GPU count (28 or 32), best first, or explicit per-GPU chunk sizes that keep the batch
(8, 8, 7, 7). Predicted speed-up, in samples per second: the compute part of the step scales with
the largest chunk, the rest of the step (data, scatter, gather) stays; a batch of 32 instead of
30 processes two more samples in the same step (1.07x).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from auditor.wording import ranks_text

from ..advisor import predicted_speedup
from ..findings import Finding, severity_for
from ..measures import dp_gpu_order, torch_chunks
from ..snapshot import Snapshot
from ..stats import RankStats


@dataclass(frozen=True)
class Facts:
    """An uneven split across ranks: each rank's median batch, the equal split that keeps the
    global batch, the ranks whose samples count more (small batch) and less (large batch) in the
    averaged gradient and by how much, what averages it (``DDP``, ``FSDP``, empty: nothing), and
    whether the ranks' speeds differ enough that an uneven split may be kept with loss weights."""

    batches: Mapping[int, float]
    equal: Mapping[int, int]
    global_batch: int
    small: tuple[int, ...]
    large: tuple[int, ...]
    sample_weight: float
    averaged_by: str
    speeds_differ: bool
    # Under gradient accumulation (empty without): each rank's micro-batches per step, its
    # micro-batch (the DataLoader's batch, the unit the user sets) and the equal split in it.
    accumulated: Mapping[int, int] = field(default_factory=dict)
    micro: Mapping[int, float] = field(default_factory=dict)
    micro_equal: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ShortGpu:
    """A GPU of a DataParallel rank that gets a smaller chunk than the largest (0: nothing)."""

    index: int
    chunk: int


@dataclass(frozen=True)
class DataParallelFacts:
    """A DataParallel rank's batch, ``torch.chunk``'s split of it over its GPUs (in
    ``device_ids`` order) and the GPUs it leaves short, the nearest batches that divide by the
    GPU count (best first), and the even per-GPU chunks that keep the batch."""

    rank: int
    batch: int
    gpu_count: int
    chunks: tuple[int, ...]
    short: tuple[ShortGpu, ...]
    nearest: tuple[int, ...]
    even: tuple[int, ...]
    # Micro-batches per step: ``batch`` is then the micro-batch, the one scattered per forward.
    accumulated: int = 1


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_ratio: float = 1.15,
) -> list[Finding]:
    """Find an uneven per-rank batch split.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_ratio: largest / smallest per-rank batch that counts as uneven.
    """
    stats = snapshot.ready(min_steps)
    if snapshot.parallel_mode == "dataparallel":
        return _dataparallel(snapshot, stats)
    sized = {r: s for r, s in stats.items() if s.batch_size}
    if len(sized) < 2:
        return []
    batches = {r: float(s.batch_size or 0) for r, s in sized.items()}
    lo, hi = min(batches.values()), max(batches.values())
    if lo <= 0 or hi / lo < min_ratio:
        return []
    per_sample = {r: max(1e-9, s.compute_s / batches[r]) for r, s in sized.items()}
    total = round(sum(batches.values()))
    equal = equalising_split(total, {r: 1.0 for r in sized})
    by_speed = equalising_split(total, per_sample)
    blamed = sorted(r for r in sized if batches[r] > equal[r])
    if not blamed:
        return []
    new_local = {
        r: max(0.0, s.local_s - s.compute_s + per_sample[r] * equal[r]) for r, s in sized.items()
    }
    speedup = predicted_speedup(stats, new_local)
    averaged = _averages_gradients(snapshot, set(sized))
    small = sorted(r for r in sized if batches[r] == lo)
    large = sorted(r for r in sized if batches[r] == hi)
    weight = hi / lo
    # The split by speed differs from the equal one: the ranks differ in speed, and keeping an
    # uneven split can be deliberate; it then needs loss weighting to stay correct.
    speeds_differ = any(abs(by_speed[r] - equal[r]) > max(1, 0.1 * equal[r]) for r in sized)
    accumulated, micro, micro_equal = _micro_split(sized, equal)
    facts = Facts(
        batches={r: batches[r] for r in sorted(batches)},
        equal={r: equal[r] for r in sorted(equal)},
        global_batch=total,
        small=tuple(small),
        large=tuple(large),
        sample_weight=weight,
        averaged_by=averaged,
        speeds_differ=speeds_differ,
        accumulated=accumulated,
        micro=micro,
        micro_equal=micro_equal,
    )
    evidence: dict[str, object] = {
        "batch_size": {str(r): round(b) for r, b in sorted(batches.items())},
        "compute_ms": {str(r): round(s.compute_s * 1e3, 1) for r, s in sorted(sized.items())},
        "collective_wait_ms": {
            str(r): None if s.collective_wait_s is None else round(s.collective_wait_s * 1e3, 1)
            for r, s in sorted(sized.items())
        },
        "equal_batch_size": {str(r): b for r, b in sorted(equal.items())},
        "equalising_batch_size": {str(r): b for r, b in sorted(by_speed.items())},
        "global_batch": total,
    }
    if accumulated:
        evidence["micro_batches"] = {str(r): n for r, n in sorted(accumulated.items())}
        evidence["micro_batch_size"] = {str(r): round(b, 1) for r, b in sorted(micro.items())}
        evidence["equal_micro_batch_size"] = {str(r): b for r, b in sorted(micro_equal.items())}
    severity = severity_for(speedup)
    if averaged:
        evidence["gradient_weighting"] = (
            f"{averaged} averages gradients with equal weight per rank, so each sample of "
            f"{ranks_text(small)} (batch {round(lo)}) counts {weight:.1f}x one of "
            f"{ranks_text(large)} (batch {round(hi)})"
        )
        evidence["epoch_length"] = _epoch_text(snapshot, small, large, lo, hi)
        evidence["sample_weight_ratio"] = round(weight, 3)
        if severity == "info":
            severity = "warning"  # a correctness concern whatever the speed effect
    return [
        Finding(
            kind="batch_split",
            severity=severity,
            ranks=tuple(blamed),
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
        )
    ]


def _micro_split(
    sized: Mapping[int, RankStats], equal: Mapping[int, int]
) -> tuple[dict[int, int], dict[int, float], dict[int, int]]:
    """Under gradient accumulation, each rank's micro-batches per step, its micro-batch size and
    the equal split in micro-batch samples (the DataLoader's ``batch_size``, what the user
    sets); empty where no rank accumulates. Where every rank accumulates alike, the micro-batches
    are split equally; otherwise each rank's equal share per step over its own count."""
    accumulated = {r: s.accumulated for r, s in sorted(sized.items())}
    if all(n == 1 for n in accumulated.values()):
        return {}, {}, {}
    micro = {r: float(s.micro_batch_size or 0.0) for r, s in sorted(sized.items())}
    if len(set(accumulated.values())) == 1:
        split = equalising_split(round(sum(micro.values())), {r: 1.0 for r in micro})
    else:
        split = {r: max(1, round(equal[r] / accumulated[r])) for r in micro}
    return accumulated, micro, {r: split[r] for r in sorted(split)}


def _averages_gradients(snapshot: Snapshot, ranks: set[int]) -> str:
    """``"DDP"`` or ``"FSDP"`` where these ranks average their gradients with equal weight per
    rank; empty otherwise."""
    modes = {v.info.parallel_mode for v in snapshot.ranks if v.info.rank in ranks}
    return "DDP" if "ddp" in modes else "FSDP" if "fsdp" in modes else ""


def _epoch_text(
    snapshot: Snapshot, small: list[int], large: list[int], lo: float, hi: float
) -> str:
    """Steps per epoch of the small-batch ranks against the large-batch ones, in words."""
    samplers = {v.info.loader.sampler for v in snapshot.ranks if v.info.loader is not None}
    ratio = hi / lo
    steps = (
        f"{ranks_text(small)} (batch {round(lo)}) take{'s' if len(small) == 1 else ''} "
        f"{ratio:.1f}x the steps of "
        f"{ranks_text(large)} (batch {round(hi)}) to go through it, so the ranks' epochs end "
        "at different steps"
    )
    if "DistributedSampler" in samplers:
        return f"DistributedSampler gives every rank the same samples per epoch: {steps}"
    return f"if every rank draws the same samples per epoch (as with DistributedSampler), {steps}"


def equalising_split(total: int, per_sample: dict[int, float]) -> dict[int, int]:
    """Integer batches summing to ``total`` with ``b_r * per_sample_r`` as equal as possible.

    Largest-remainder rounding of the ideal real-valued split; every rank keeps at least 1.
    """
    inv = {r: 1.0 / c for r, c in per_sample.items()}
    norm = sum(inv.values())
    ideal = {r: total * v / norm for r, v in inv.items()}
    out = {r: max(1, int(x)) for r, x in ideal.items()}
    left = total - sum(out.values())
    for r in sorted(ideal, key=lambda q: ideal[q] - int(ideal[q]), reverse=True):
        if left <= 0:
            break
        out[r] += 1
        left -= 1
    # The floor of 1 can overshoot: take the excess back from the largest shares.
    while left < 0:
        over = [q for q in out if out[q] > 1]
        if not over:
            break
        worst = max(over, key=lambda q: out[q] - ideal[q])
        out[worst] -= 1
        left += 1
    return out


def _dataparallel(snapshot: Snapshot, stats: dict[int, RankStats]) -> list[Finding]:
    """Uneven ``torch.chunk`` scatters of DataParallel ranks (see the module docstring)."""
    dstats = snapshot.gpu_stats
    gpus_of = snapshot.gpus_of
    findings: list[Finding] = []
    for view in snapshot.ranks:
        info = view.info
        s = stats.get(info.rank)
        if info.parallel_mode != "dataparallel" or s is None or not s.batch_size:
            continue
        order = dp_gpu_order(info, gpus_of.get(info.rank, ()), dstats)
        n = max(len(order), len(info.devices), len(info.device_uuids))
        if n < 2:
            continue
        # Scattered per forward: the micro-batch (the step's batch without accumulation).
        batch = round(s.micro_batch_size or 0)
        if batch <= 0:
            continue
        chunks = torch_chunks(batch, n)
        if len(set(chunks)) == 1:
            continue
        refs: list[dict[str, Any]] = []
        for i in range(n):
            uuid = order[i] if i < len(order) else None
            d = dstats.get(uuid) if uuid else None
            if d is not None:
                refs.append(d.ref)
            else:
                index = info.devices[i] if i < len(info.devices) else i
                refs.append({"uuid": uuid, "node": info.host, "index": index, "model": ""})
        top = max(chunks)
        lower = batch - batch % n
        options = [b for b in (lower, lower + n) if b >= n]
        gains = {b: _dp_gain(s, batch, b, n) for b in options}
        ranked = sorted(options, key=lambda b: (-gains[b], abs(b - batch), -b))
        speedup = max(gains.values()) if gains else None
        even = [batch // n + (1 if i < batch % n else 0) for i in range(n)]
        short = [i for i, c in enumerate(chunks) if c < top]
        facts = DataParallelFacts(
            rank=info.rank,
            batch=batch,
            gpu_count=n,
            chunks=tuple(chunks),
            short=tuple(ShortGpu(refs[i]["index"], chunks[i]) for i in short),
            nearest=tuple(ranked),
            even=tuple(even),
            accumulated=s.accumulated,
        )
        findings.append(
            Finding(
                kind="batch_split",
                severity=severity_for(speedup),
                ranks=(info.rank,),
                facts=facts,
                evidence={
                    "gpus": [refs[i] for i in short],
                    "per_gpu": {
                        str(r["uuid"] or f"{r['node']}:{r['index']}"): {**r, "chunk": chunks[i]}
                        for i, r in enumerate(refs)
                    },
                    "batch_size": batch,
                    "gpu_count": n,
                    "chunk_sizes": chunks,
                    "nearest_batches": ranked,
                    "even_chunk_sizes": even,
                    "speedup_model": (
                        "samples per second: compute paced by the largest chunk, the rest of "
                        "the step unchanged"
                    ),
                },
                predicted_speedup=speedup,
            )
        )
    return findings


def _dp_gain(s: RankStats, batch: int, new_batch: int, n: int) -> float:
    """Samples-per-second gain of ``new_batch`` over ``batch`` on ``n`` GPUs (largest chunk)."""
    before = max(torch_chunks(batch, n))
    after = max(torch_chunks(new_batch, n))
    if before <= 0 or s.step_s <= 0:
        return 1.0
    step = max(1e-9, s.step_s - s.compute_s + s.compute_s * after / before)
    return max(1.0, (new_batch / step) / (batch / s.step_s))
