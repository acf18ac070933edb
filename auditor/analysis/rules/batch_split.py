"""batch_split: ranks of one DDP job that train on different per-rank batch sizes.

Metric: the median batch size per rank (samples per optimizer step) and the compute time per
sample. Decision: a split is uneven when the largest batch is at least ``min_ratio`` times the
smallest. Blamed: the ranks whose batch is larger than the one that equalises work; the others
only wait for them.

Fix: the per-rank batch sizes that equalise compute time while keeping the global batch:
``b_r ~ 1 / (compute per sample of r)``, rounded so they still add up to the global batch.
Equal-speed ranks get equal batches, which also restores DDP's equal weighting of every sample
in the averaged gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..advisor import predicted_speedup
from ..findings import Finding, severity_for
from ..snapshot import Snapshot
from .common import ranks_text, ready, with_expectation


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
    if snapshot.parallel_mode == "dataparallel":
        return []  # one process drives every GPU: its split is the scatter, judged elsewhere
    stats = ready(snapshot.stats, min_steps)
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
