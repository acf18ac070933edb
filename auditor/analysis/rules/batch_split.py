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
does not divide (a ``batch_size`` :class:`~auditor.analysis.fixes.Fix` for every rank whose batch
changes, in the unit the user sets); the evidence also gives the split that would equalise compute
time (``b_r ~ 1 / (compute per sample of r)``). Where the ranks differ in speed enough for the two
to differ, the fix adds the alternative that keeps the uneven split correct: weight each rank's
loss by its share of the global batch (``loss_weight``). The evidence names the gradient
weighting and the epoch lengths by code (:data:`EQUAL_PER_RANK`, :data:`DISTRIBUTED_SAMPLER` or
:data:`SAME_SAMPLES_ASSUMED`); the report words them. Blamed: the ranks whose batch is above the
equal split (the others wait for them when speeds are equal). Predicted speed-up: the equal
split's, under the barrier model.

DataParallel: one process drives every GPU and splits each batch with ``torch.chunk``:
``ceil(batch / GPUs)`` per GPU, the last GPU the remainder (30 over 4 is 8, 8, 8, 6; 3 over 4
leaves a GPU with nothing). The GPUs run their chunks in parallel, so the step's compute is paced
by the largest chunk and the short GPUs idle for the difference. Blamed: the DataParallel rank;
evidence names every GPU's chunk and the short GPUs. Fix: the nearest batch sizes that divide by
the GPU count (28 or 32), best first, or explicit per-GPU chunk sizes that keep the batch
(8, 8, 7, 7): ``batch_size`` fixes, best first, and ``scatter_chunks``. Predicted speed-up, in
samples per second (the evidence's ``speedup_model``, :data:`SAMPLES_PER_SECOND`): the compute
part of the step scales with the largest chunk, the rest of the step (data, scatter, gather)
stays; a batch of 32 instead of 30 processes two more samples in the same step (1.07x).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..advisor import Barrier
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..measures import dp_gpu_order, torch_chunks
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "batch_split"
# Evidence codes (the report words them): DDP or FSDP averages gradients with equal weight per
# rank; every rank draws the same samples per epoch (a DistributedSampler), or is assumed to;
# the DataParallel speed-up is in samples per second.
EQUAL_PER_RANK = "equal_per_rank"
DISTRIBUTED_SAMPLER = "distributed_sampler"
SAME_SAMPLES_ASSUMED = "same_samples_assumed"
SAMPLES_PER_SECOND = "samples_per_second"
# The parallel modes that average gradients with equal weight per rank, and the name the
# report gives them (the first a job's ranks run wins).
_AVERAGED_BY = (("ddp", "DDP"), ("fsdp", "FSDP"), ("deepspeed", "DeepSpeed"))


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_ratio: largest / smallest per-rank batch that counts as uneven.
    """

    min_steps: int = 8
    min_ratio: float = 1.15


@dataclass(frozen=True)
class Inputs:
    """Where the split is uneven (``min_ratio``, the test ``decide`` applies) or the job is
    DataParallel, per rank ready to judge (at its pace): its batch per step (None: unknown),
    compute, local time, step, collective wait (None: unmeasured), micro-batches per step and
    micro-batch, and its parallel mode; whether any rank's loader uses a
    ``DistributedSampler``; the job's parallel mode and barrier model. For a DataParallel job,
    each DataParallel rank's GPUs in ``device_ids`` order as findings name them (in the
    snapshot's order of ranks)."""

    batch: Mapping[int, float | None]
    compute_s: Mapping[int, float]
    local_s: Mapping[int, float]
    step_s: Mapping[int, float]
    wait_s: Mapping[int, float | None]
    accumulated: Mapping[int, int]
    micro_batch: Mapping[int, float | None]
    mode: Mapping[int, str]
    distributed_sampler: bool
    parallel_mode: str
    barrier: Barrier
    dp_gpus: Mapping[int, tuple[dict[str, Any], ...]] = field(default_factory=dict)


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
    # Whether a rank's loader uses a DistributedSampler (every rank draws the same samples per
    # epoch); otherwise that is assumed.
    distributed_sampler: bool = False


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


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    if not stats:
        return None
    mode = snapshot.parallel_mode
    batch = {r: s.batch_size for r, s in stats.items()}
    if mode != "dataparallel":
        # Only an uneven split is judged (the test ``decide`` applies): an even one is not
        # measured further.
        sized = [b for b in batch.values() if b]
        if len(sized) < 2 or min(sized) <= 0 or max(sized) / min(sized) < t.min_ratio:
            return None
    view_of = snapshot.view_of
    return Inputs(
        batch=batch,
        compute_s={r: s.compute_s for r, s in stats.items()},
        local_s={r: s.local_s for r, s in stats.items()},
        step_s={r: s.step_s for r, s in stats.items()},
        wait_s={r: s.collective_wait_s for r, s in stats.items()},
        accumulated={r: s.accumulated for r, s in stats.items()},
        micro_batch={r: s.micro_batch_size for r, s in stats.items()},
        mode={r: view_of[r].info.parallel_mode for r in stats if r in view_of},
        distributed_sampler="DistributedSampler"
        in {v.info.loader.sampler for v in snapshot.ranks if v.info.loader is not None},
        parallel_mode=mode,
        barrier=Barrier.of(stats),
        dp_gpus=_dp_gpus(snapshot, stats) if mode == "dataparallel" else {},
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find an uneven per-rank batch split (DataParallel: an uneven scatter over the GPUs)."""
    if i.parallel_mode == "dataparallel":
        return _dataparallel(i)
    batches = {r: float(b) for r, b in i.batch.items() if b}
    if len(batches) < 2:
        return []
    lo, hi = min(batches.values()), max(batches.values())
    if lo <= 0 or hi / lo < t.min_ratio:
        return []
    per_sample = {r: max(1e-9, i.compute_s[r] / batches[r]) for r in batches}
    total = round(sum(batches.values()))
    equal = equalising_split(total, {r: 1.0 for r in batches})
    by_speed = equalising_split(total, per_sample)
    blamed = sorted(r for r in batches if batches[r] > equal[r])
    if not blamed:
        return []
    new_local = {
        r: max(0.0, i.local_s[r] - i.compute_s[r] + per_sample[r] * equal[r]) for r in batches
    }
    speedup = i.barrier.speedup(new_local)
    modes = {i.mode[r] for r in batches if r in i.mode}
    # DDP, FSDP or DeepSpeed average the gradients with equal weight per rank; empty: nothing
    # does.
    averaged = next((name for mode, name in _AVERAGED_BY if mode in modes), "")
    small = sorted(r for r in batches if batches[r] == lo)
    large = sorted(r for r in batches if batches[r] == hi)
    weight = hi / lo
    # The split by speed differs from the equal one: the ranks differ in speed, and keeping an
    # uneven split can be deliberate; it then needs loss weighting to stay correct.
    speeds_differ = any(abs(by_speed[r] - equal[r]) > max(1, 0.1 * equal[r]) for r in batches)
    accumulated, micro, micro_equal = _micro_split(i, batches, equal)
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
        distributed_sampler=i.distributed_sampler,
    )
    evidence: dict[str, object] = {
        "batch_size": {str(r): round(b) for r, b in sorted(batches.items())},
        "compute_ms": {str(r): round(i.compute_s[r] * 1e3, 1) for r in sorted(batches)},
        "collective_wait_ms": {
            str(r): None if i.wait_s[r] is None else round((i.wait_s[r] or 0.0) * 1e3, 1)
            for r in sorted(batches)
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
        evidence["gradient_weighting"] = EQUAL_PER_RANK
        evidence["epoch_length"] = (
            DISTRIBUTED_SAMPLER if i.distributed_sampler else SAME_SAMPLES_ASSUMED
        )
        evidence["sample_weight_ratio"] = round(weight, 3)
        if severity == "info":
            severity = "warning"  # a correctness concern whatever the speed effect
    return [
        Finding(
            kind=KIND,
            severity=severity,
            ranks=tuple(blamed),
            facts=facts,
            evidence=evidence,
            predicted_speedup=speedup,
            fixes=_split_fixes(facts, blamed, speedup),
        )
    ]


def _split_fixes(facts: Facts, blamed: list[int], speedup: float) -> tuple[Fix, ...]:
    """The equal split, rank by rank, in the unit the user sets (the micro-batch under gradient
    accumulation), for every rank whose batch changes; and, where the ranks' speeds differ under
    gradient averaging, the alternative of keeping a blamed rank's batch with its loss scaled by
    its share of the global batch (``batch x ranks / global batch``)."""
    fixes: list[Fix] = []
    n = len(facts.batches)
    for r in sorted(facts.batches):
        if facts.accumulated:
            batch, equal = round(facts.micro[r]), facts.micro_equal[r]
        else:
            batch, equal = round(facts.batches[r]), facts.equal[r]
        if batch == equal:
            continue
        fixes.append(Fix("batch_size", r, batch, equal, speedup, (KIND,)))
        if r in blamed and facts.averaged_by and facts.speeds_differ:
            scale = round(facts.batches[r]) * n / facts.global_batch
            fixes.append(Fix("loss_weight", r, 1.0, round(scale, 4), speedup, (KIND,)))
    return tuple(fixes)


def _micro_split(
    i: Inputs, batches: Mapping[int, float], equal: Mapping[int, int]
) -> tuple[dict[int, int], dict[int, float], dict[int, int]]:
    """Under gradient accumulation, each rank's micro-batches per step, its micro-batch size and
    the equal split in micro-batch samples (the DataLoader's ``batch_size``, what the user
    sets); empty where no rank accumulates. Where every rank accumulates alike, the micro-batches
    are split equally; otherwise each rank's equal share per step over its own count."""
    accumulated = {r: i.accumulated[r] for r in sorted(batches)}
    if all(n == 1 for n in accumulated.values()):
        return {}, {}, {}
    micro = {r: float(i.micro_batch[r] or 0.0) for r in sorted(batches)}
    if len(set(accumulated.values())) == 1:
        split = equalising_split(round(sum(micro.values())), {r: 1.0 for r in micro})
    else:
        split = {r: max(1, round(equal[r] / accumulated[r])) for r in micro}
    return accumulated, micro, {r: split[r] for r in sorted(split)}


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


def _dp_gpus(snapshot: Snapshot, stats: Mapping[int, Any]) -> dict[int, tuple[dict[str, Any], ...]]:
    """Each DataParallel rank's GPUs (with a batch to scatter) in ``device_ids`` order, as
    findings name them: NVML's reference where the GPU was sampled, else the rank's own word."""
    dstats = snapshot.gpu_stats
    gpus_of = snapshot.gpus_of
    out: dict[int, tuple[dict[str, Any], ...]] = {}
    for view in snapshot.ranks:
        info = view.info
        s = stats.get(info.rank)
        if info.parallel_mode != "dataparallel" or s is None or not s.batch_size:
            continue
        order = dp_gpu_order(info, gpus_of.get(info.rank, ()), dstats)
        n = max(len(order), len(info.devices), len(info.device_uuids))
        refs: list[dict[str, Any]] = []
        for k in range(n):
            uuid = order[k] if k < len(order) else None
            d = dstats.get(uuid) if uuid else None
            if d is not None:
                refs.append(d.ref)
            else:
                index = info.devices[k] if k < len(info.devices) else k
                refs.append({"uuid": uuid, "node": info.host, "index": index, "model": ""})
        out[info.rank] = tuple(refs)
    return out


def _dataparallel(i: Inputs) -> list[Finding]:
    """Uneven ``torch.chunk`` scatters of DataParallel ranks (see the module docstring)."""
    findings: list[Finding] = []
    for rank, refs in i.dp_gpus.items():
        n = len(refs)
        if n < 2:
            continue
        # Scattered per forward: the micro-batch (the step's batch without accumulation).
        batch = round(i.micro_batch[rank] or 0)
        if batch <= 0:
            continue
        chunks = torch_chunks(batch, n)
        if len(set(chunks)) == 1:
            continue
        top = max(chunks)
        lower = batch - batch % n
        options = [b for b in (lower, lower + n) if b >= n]
        gains = {b: _dp_gain(i.step_s[rank], i.compute_s[rank], batch, b, n) for b in options}
        ranked = sorted(options, key=lambda b: (-gains[b], abs(b - batch), -b))
        speedup = max(gains.values()) if gains else None
        even = [batch // n + (1 if k < batch % n else 0) for k in range(n)]
        short = [k for k, c in enumerate(chunks) if c < top]
        facts = DataParallelFacts(
            rank=rank,
            batch=batch,
            gpu_count=n,
            chunks=tuple(chunks),
            short=tuple(ShortGpu(refs[k]["index"], chunks[k]) for k in short),
            nearest=tuple(ranked),
            even=tuple(even),
            accumulated=i.accumulated[rank],
        )
        fixes = [Fix("batch_size", rank, batch, b, speedup, (KIND,)) for b in ranked]
        fixes.append(
            Fix("scatter_chunks", rank, _join(chunks), _join(even), speedup, (KIND,)),
        )
        findings.append(
            Finding(
                kind=KIND,
                severity=severity_for(speedup),
                ranks=(rank,),
                facts=facts,
                evidence={
                    "gpus": [refs[k] for k in short],
                    "per_gpu": {
                        str(r["uuid"] or f"{r['node']}:{r['index']}"): {**r, "chunk": chunks[k]}
                        for k, r in enumerate(refs)
                    },
                    "batch_size": batch,
                    "gpu_count": n,
                    "chunk_sizes": chunks,
                    "nearest_batches": ranked,
                    "even_chunk_sizes": even,
                    "speedup_model": SAMPLES_PER_SECOND,
                },
                predicted_speedup=speedup,
                fixes=tuple(fixes),
                gpus=tuple(str(refs[k]["uuid"]) for k in short if refs[k]["uuid"]),
            )
        )
    return findings


def _join(values: list[int]) -> str:
    """Chunk sizes as a fix's value: ``8,8,7,7``."""
    return ",".join(str(v) for v in values)


def _dp_gain(step_s: float, compute_s: float, batch: int, new_batch: int, n: int) -> float:
    """Samples-per-second gain of ``new_batch`` over ``batch`` on ``n`` GPUs (largest chunk)."""
    before = max(torch_chunks(batch, n))
    after = max(torch_chunks(new_batch, n))
    if before <= 0 or step_s <= 0:
        return 1.0
    step = max(1e-9, step_s - compute_s + compute_s * after / before)
    return max(1.0, (new_batch / step) / (batch / step_s))


RULE = Rule(
    kind=KIND,
    place=30,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
)
