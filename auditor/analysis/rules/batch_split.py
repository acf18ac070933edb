"""batch_split: ranks of one DDP job that train on different per-rank batch sizes.

Metric: the median batch size per rank (samples per optimizer step) and the compute time per
sample. Decision: a split is uneven when the largest batch is at least ``min_ratio`` times the
smallest. Blamed: the ranks whose batch is larger than the one that equalises work; the others
only wait for them.

Fix: the per-rank batch sizes that equalise compute time while keeping the global batch:
``b_r ~ 1 / (compute per sample of r)``, rounded so they still add up to the global batch.
Equal-speed ranks get equal batches, which also restores DDP's equal weighting of every sample
in the averaged gradient.

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

from collections.abc import Sequence
from typing import Any

from ..advisor import predicted_speedup
from ..devices import device_stats, gpu_owners, rank_gpus
from ..findings import Finding, severity_for
from ..snapshot import Snapshot
from ..stats import RankStats
from .common import ranks_text, ready, with_expectation
from .dataparallel_gather import dp_gpu_order, torch_chunks


def detect(
    snapshot: Snapshot,
    *,
    prior: Sequence[Finding] = (),
    min_steps: int = 8,
    min_ratio: float = 1.15,
) -> list[Finding]:
    """Find an uneven per-rank batch split.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_ratio: largest / smallest per-rank batch that counts as uneven.
    """
    stats = ready(snapshot.stats, min_steps)
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
    target = equalising_split(total, per_sample)
    blamed = sorted(r for r in sized if batches[r] > target[r])
    if not blamed:
        return []
    new_local = {
        r: max(0.0, s.local_s - s.compute_s + per_sample[r] * target[r]) for r, s in sized.items()
    }
    speedup = predicted_speedup(stats, new_local)
    fixes: dict[int, str] = {}
    for r in sorted(sized):
        if round(batches[r]) == target[r]:
            continue
        note = "" if r in blamed else f" (keeps the global batch of {total})"
        fixes[r] = with_expectation(f"batch_size {round(batches[r])} -> {target[r]}{note}", speedup)
    summary = (
        f"uneven per-rank batches ({_listing(batches)}): "
        f"{ranks_text(blamed)} hold{'s' if len(blamed) == 1 else ''} the others back"
    )
    evidence = {
        "batch_size": {str(r): round(b) for r, b in sorted(batches.items())},
        "compute_ms": {str(r): round(s.compute_s * 1e3, 1) for r, s in sorted(sized.items())},
        "collective_wait_ms": {
            str(r): None if s.collective_wait_s is None else round(s.collective_wait_s * 1e3, 1)
            for r, s in sorted(sized.items())
        },
        "equalising_batch_size": {str(r): b for r, b in sorted(target.items())},
        "global_batch": total,
    }
    return [
        Finding(
            kind="batch_split",
            severity=severity_for(speedup),
            ranks=tuple(blamed),
            summary=summary,
            evidence=evidence,
            fixes=fixes,
            predicted_speedup=speedup,
        )
    ]


def _listing(batches: dict[int, float]) -> str:
    return ", ".join(f"rank {r}: {round(b)}" for r, b in sorted(batches.items()))


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
    dstats = device_stats(snapshot)
    owners = gpu_owners(snapshot)
    gpus_of = rank_gpus(owners)
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
        batch = round(s.batch_size)
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
        short_text = ", ".join(
            f"GPU {refs[i]['index']} gets {chunks[i] or 'nothing'}" for i in short
        )
        choices = " or ".join(f"{b} ({b // n} per GPU)" for b in ranked)
        fix = (
            f"batch_size {batch} -> {choices}: torch.chunk splits {batch} over {n} GPUs as "
            f"{_join(chunks)} ({short_text}); or keep {batch} with per-GPU chunk sizes "
            f"{_join(even)} (a scatter with explicit chunk sizes)"
        )
        findings.append(
            Finding(
                kind="batch_split",
                severity=severity_for(speedup),
                ranks=(info.rank,),
                summary=(
                    f"DataParallel rank {info.rank} splits batch {batch} over {n} GPUs as "
                    f"{_join(chunks)}: {short_text} and idles while the others finish"
                ),
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
                fixes={info.rank: with_expectation(fix, speedup)},
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


def _join(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)
