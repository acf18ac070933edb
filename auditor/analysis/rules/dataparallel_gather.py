"""dataparallel_gather: GPU 0 of an ``nn.DataParallel`` job carrying the gathered outputs.

nn.DataParallel is one process driving several GPUs: every step it scatters the batch into
chunks, replicates the model, runs the replicas and gathers their outputs on ``device_ids[0]``
(the *primary* GPU), which then computes the loss and holds the outputs of every chunk. So the
primary GPU holds more memory and does more work than the others, and every other GPU has to
leave the same head-room unused.

Metric: per GPU of the DataParallel process, the median memory in use and the median
utilisation (NVML). The primary GPU is the first of the rank's ``device_uuids`` (the order of
``device_ids``), else its lowest-numbered GPU. Decision: the primary's memory is at least
``min_ratio`` times the median of the other GPUs' (and ``min_extra_bytes`` above it); where memory
was not measured, its utilisation is. Blamed: the DataParallel rank (its one process).

Fixes:

* move to DistributedDataParallel, one process per GPU, as PyTorch recommends even on one node:
  the exact ``torchrun --nproc_per_node=<GPUs> <script>`` command. The snapshot does not carry
  the job's command line: the script is the ``script`` threshold where given, else the
  placeholder ``train.py`` (the evidence says which).
* or keep DataParallel with a balanced scatter that gives the primary a smaller chunk. Model:
  memory grows with the chunk; the primary's excess over the others, in samples, is
  ``e = c_other * ratio - c_0``; equal memory needs ``c_0' + e = c'`` with
  ``c_0' + (n - 1) c' = batch``. Treating all memory as per-sample overstates the per-sample part
  (the model replica is fixed), so ``e`` and the shift are if anything too small: safe.
  Example: batch 32 over 4 (chunks 8) with the primary at 1.5x memory: ``e = 4``, chunks
  5, 9, 9, 9.

It also emits a ``memory_imbalance`` finding naming the primary GPU (``cause`` set to this kind)
so the memory view of the job is complete; ``memory_imbalance`` skips GPUs already named.

Speed-up: not predicted. One process drives every GPU, so per-GPU step times are not measured,
and DDP also removes the per-step replication and the GIL contention between the replicas'
threads, which nothing here measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..devices import DeviceStats
from ..findings import Finding
from ..measures import dp_gpu_order, imbalance_finding, measured_gpus, torch_chunks
from ..snapshot import Snapshot

PLACEHOLDER_SCRIPT = "train.py"
SPEEDUP_NOTE = (
    "not predicted: one process drives every GPU, so per-GPU step times are not measured; DDP "
    "also removes the per-step model replication and the GIL contention between replicas"
)


@dataclass(frozen=True)
class Facts:
    """The DataParallel rank and its primary GPU (its label): the primary's memory and busy
    share against the median of the other GPUs' (ratio None where not measured); the GPU count
    and the torchrun command that runs the job under DDP; the batch, its ``torch.chunk`` split
    and the balanced split that gives the primary a smaller chunk (None where unknown or no
    shift helps)."""

    rank: int
    gpu: str
    mem_ratio: float | None
    mem_bytes: float | None
    others_mem_bytes: float | None
    busy_ratio: float | None
    busy: float | None
    others_busy: float | None
    gpu_count: int
    command: str
    batch: int | None
    chunks: tuple[int, ...] | None
    balanced: tuple[int, ...] | None
    # Micro-batches per step: ``batch`` is then the micro-batch, the one scattered per forward.
    accumulated: int = 1


@dataclass(frozen=True)
class PrimaryMemory:
    """The ``memory_imbalance`` finding this rule emits on the primary GPU: the gather's facts,
    read as memory (its ``mem_ratio`` is measured)."""

    gather: Facts


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_samples: int = 5,
    min_ratio: float = 1.25,
    min_extra_bytes: int = 512 * 1024**2,
    near_full: float = 0.8,
    script: str | None = None,
) -> list[Finding]:
    """Find DataParallel jobs whose primary GPU carries the gather.

    Args:
        min_steps: steps the DataParallel rank needs in the window before it is judged.
        min_samples: NVML samples a GPU needs in the window before it is judged.
        min_ratio: primary GPU's memory (else utilisation) relative to the median of the others.
        min_extra_bytes: the primary's memory must also exceed that median by this much.
        near_full: share of the primary's total memory at which the memory finding is a warning.
        script: the training script for the torchrun command (None: placeholder ``train.py``).
    """
    stats = snapshot.ready(min_steps)
    dstats = measured_gpus(snapshot, min_samples)
    owners = snapshot.owners
    gpus_of = snapshot.gpus_of
    findings: list[Finding] = []
    for view in snapshot.ranks:
        info = view.info
        if info.parallel_mode != "dataparallel" or info.rank not in stats:
            continue
        order = dp_gpu_order(info, gpus_of.get(info.rank, ()), dstats)
        measured = [u for u in order if u in dstats]
        if len(measured) < 2 or measured[0] != order[0]:
            continue
        primary = dstats[order[0]]
        mem = {u: dstats[u].mem_used_bytes for u in measured}
        busy = {u: dstats[u].gpu_util for u in measured}
        mem_ratio = _ratio_to_others(mem, primary.uuid)
        busy_ratio = _ratio_to_others(busy, primary.uuid)
        others_mem = _others_median(mem, primary.uuid)
        if mem_ratio is not None and others_mem is not None:
            extra = (primary.mem_used_bytes or 0.0) - others_mem
            if mem_ratio < min_ratio or extra < min_extra_bytes:
                continue
        elif busy_ratio is None or busy_ratio < min_ratio:
            continue

        n = max(len(order), len(info.devices), len(info.device_uuids))
        s = stats[info.rank]
        # Scattered per forward: the micro-batch (the step's batch without accumulation).
        micro = s.micro_batch_size
        batch = round(micro) if micro else None
        current = torch_chunks(batch, n) if batch else None
        balanced = balanced_chunks(batch, n, mem_ratio) if batch and mem_ratio is not None else None
        name = script or PLACEHOLDER_SCRIPT
        command = f"torchrun --nproc_per_node={n} {name}"
        facts = Facts(
            rank=info.rank,
            gpu=primary.label,
            mem_ratio=mem_ratio,
            mem_bytes=primary.mem_used_bytes,
            others_mem_bytes=others_mem,
            busy_ratio=busy_ratio,
            busy=primary.gpu_util,
            others_busy=_others_median(busy, primary.uuid),
            gpu_count=n,
            command=command,
            batch=batch,
            chunks=None if current is None else tuple(current),
            balanced=None if balanced is None else tuple(balanced),
            accumulated=s.accumulated,
        )
        findings.append(
            Finding(
                kind="dataparallel_gather",
                severity="warning",
                ranks=(info.rank,),
                facts=facts,
                evidence={
                    "gpus": [primary.ref],
                    "per_gpu": _per_gpu(order, dstats, current, owners),
                    "mem_ratio": None if mem_ratio is None else round(mem_ratio, 2),
                    "busy_ratio": None if busy_ratio is None else round(busy_ratio, 2),
                    "batch_size": batch,
                    "chunk_sizes": current,
                    "balanced_chunk_sizes": balanced,
                    "ddp_command": command,
                    "script": name,
                    "script_note": (
                        "given"
                        if script
                        else "placeholder: the snapshot does not carry the "
                        "job's command; set the rule's `script` threshold to name it"
                    ),
                    "speedup_model": SPEEDUP_NOTE,
                },
                predicted_speedup=None,
            )
        )
        if mem_ratio is None:
            continue
        findings.append(
            imbalance_finding(
                primary,
                {u: dstats[u] for u in measured},
                mem,
                ranks=(info.rank,),
                facts=PrimaryMemory(facts),
                near_full=near_full,
                owners=owners,
                cause="dataparallel_gather",
            )
        )
    return findings


def balanced_chunks(batch: int, n: int, primary_ratio: float) -> list[int] | None:
    """Per-GPU chunks that equalise memory when the primary holds ``primary_ratio`` times the
    others' median at the current (``torch.chunk``) split; None when no shift is possible."""
    if n < 2 or batch < n:
        return None
    current = torch_chunks(batch, n)
    c0 = current[0]
    c_other = statistics.median(current[1:])
    if c_other <= 0:
        return None
    extra = c_other * primary_ratio - c0
    first = max(1, min(c0, round((batch - (n - 1) * extra) / n)))
    if first >= c0:
        return None
    rest = batch - first
    base, more = divmod(rest, n - 1)
    return [first] + [base + (1 if i < more else 0) for i in range(n - 1)]


def _ratio_to_others(values: Mapping[str, float | None], key: str) -> float | None:
    mine = values.get(key)
    others = _others_median(values, key)
    if mine is None or others is None or others <= 0:
        return None
    return float(mine) / others


def _others_median(values: Mapping[str, float | None], key: str) -> float | None:
    others = [float(v) for k, v in values.items() if k != key and v is not None]
    return float(statistics.median(others)) if others else None


def _per_gpu(
    order: Sequence[str],
    dstats: Mapping[str, DeviceStats],
    chunks: Sequence[int] | None,
    owners: Mapping[str, Sequence[int]],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, u in enumerate(order):
        d = dstats.get(u)
        out[u] = {
            **(d.ref if d else {"uuid": u}),
            "ranks": list(owners.get(u, ())),
            "chunk": chunks[i] if chunks and i < len(chunks) else None,
            "mem_used_bytes": None
            if d is None or d.mem_used_bytes is None
            else round(d.mem_used_bytes),
            "mem_total_bytes": None if d is None else d.mem_total_bytes,
            "gpu_util": None if d is None or d.gpu_util is None else round(d.gpu_util, 3),
        }
    return out
