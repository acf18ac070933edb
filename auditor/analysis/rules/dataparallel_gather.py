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
so the memory view of the job is complete; ``memory_imbalance`` skips GPUs already named
(``Finding.gpus``). Fixes (:class:`~auditor.analysis.fixes.Fix`): ``parallel_mode``
dataparallel -> ddp, ``batch_size`` per process, ``scatter_chunks`` current -> balanced (chunks
as ``"5,9,9,9"``); the evidence says ``script_note`` ``given`` or ``placeholder`` and
``speedup_model`` ``not_predicted`` (codes: the report words them).

Speed-up: not predicted. One process drives every GPU, so per-GPU step times are not measured,
and DDP also removes the per-step replication and the GIL contention between the replicas'
threads, which nothing here measures.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..findings import Finding
from ..fixes import Fix
from ..measures import (
    NOT_PREDICTED,
    GpuMemory,
    dp_gpu_order,
    imbalance_finding,
    measured_gpus,
    torch_chunks,
)
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "dataparallel_gather"
PLACEHOLDER_SCRIPT = "train.py"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps the DataParallel rank needs in the window before it is judged.
    min_samples: NVML samples a GPU needs in the window before it is judged.
    min_ratio: primary GPU's memory (else utilisation) relative to the median of the others.
    min_extra_bytes: the primary's memory must also exceed that median by this much.
    near_full: share of the primary's total memory at which the memory finding is a warning.
    script: the training script for the torchrun command (None: placeholder ``train.py``).
    """

    min_steps: int = 8
    min_samples: int = 5
    min_ratio: float = 1.25
    min_extra_bytes: int = 512 * 1024**2
    near_full: float = 0.8
    script: str | None = None


@dataclass(frozen=True)
class Inputs:
    """Per DataParallel rank ready to judge: its GPUs in ``device_ids`` order (the primary
    first), its GPU count (the most of those, its devices and its device UUIDs), its
    micro-batch and micro-batches per step. Per GPU of those ranks: the ranks that own it; per
    measured GPU (``min_samples`` or more): its median memory in use and busy share, its total,
    and what a memory finding names it by (:class:`~auditor.analysis.measures.GpuMemory`)."""

    order: Mapping[int, tuple[str, ...]]
    gpu_count: Mapping[int, int]
    micro_batch: Mapping[int, float | None]
    accumulated: Mapping[int, int]
    owners: Mapping[str, tuple[int, ...]]
    mem: Mapping[str, float | None]
    busy: Mapping[str, float | None]
    gpus: GpuMemory


@dataclass(frozen=True)
class Facts:
    """The DataParallel rank and its primary GPU (its label): the primary's memory and busy
    share against the median of the other GPUs' (ratio None where not measured); the GPU count
    and the torchrun command that runs the job under DDP (its script a placeholder unless the
    ``script`` threshold named it); the batch, its ``torch.chunk`` split and the balanced split
    that gives the primary a smaller chunk (None where unknown or no shift helps)."""

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
    # The batch per process under DDP (the batch over the GPUs; None where the batch is unknown).
    per_process: int | None = None
    placeholder: bool = False


@dataclass(frozen=True)
class PrimaryMemory:
    """The ``memory_imbalance`` finding this rule emits on the primary GPU: the gather's facts,
    read as memory (its ``mem_ratio`` is measured)."""

    gather: Facts


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    dp = [
        v.info
        for v in snapshot.ranks
        if v.info.parallel_mode == "dataparallel" and v.info.rank in stats
    ]
    if not dp:
        return None
    dstats = measured_gpus(snapshot, t.min_samples)
    owners = snapshot.owners
    gpus_of = snapshot.gpus_of
    order = {i.rank: tuple(dp_gpu_order(i, gpus_of.get(i.rank, ()), dstats)) for i in dp}
    uuids = list(dict.fromkeys(u for o in order.values() for u in o))
    measured = [dstats[u] for u in uuids if u in dstats]
    return Inputs(
        order=order,
        gpu_count={
            i.rank: max(len(order[i.rank]), len(i.devices), len(i.device_uuids)) for i in dp
        },
        micro_batch={i.rank: stats[i.rank].micro_batch_size for i in dp},
        accumulated={i.rank: stats[i.rank].accumulated for i in dp},
        owners={u: tuple(owners.get(u, ())) for u in uuids},
        mem={d.uuid: d.mem_used_bytes for d in measured},
        busy={d.uuid: d.gpu_util for d in measured},
        gpus=GpuMemory.of(measured, owners),
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find DataParallel ranks whose primary GPU carries the gather."""
    findings: list[Finding] = []
    for rank, order in i.order.items():
        measured = [u for u in order if u in i.gpus.ref]
        if len(measured) < 2 or measured[0] != order[0]:
            continue
        primary = order[0]
        mem = {u: i.mem[u] for u in measured}
        busy = {u: i.busy[u] for u in measured}
        mem_ratio = _ratio_to_others(mem, primary)
        busy_ratio = _ratio_to_others(busy, primary)
        others_mem = _others_median(mem, primary)
        if mem_ratio is not None and others_mem is not None:
            extra = (i.mem[primary] or 0.0) - others_mem
            if mem_ratio < t.min_ratio or extra < t.min_extra_bytes:
                continue
        elif busy_ratio is None or busy_ratio < t.min_ratio:
            continue

        n = i.gpu_count[rank]
        # Scattered per forward: the micro-batch (the step's batch without accumulation).
        micro = i.micro_batch[rank]
        batch = round(micro) if micro else None
        current = torch_chunks(batch, n) if batch else None
        balanced = balanced_chunks(batch, n, mem_ratio) if batch and mem_ratio is not None else None
        name = t.script or PLACEHOLDER_SCRIPT
        command = f"torchrun --nproc_per_node={n} {name}"
        facts = Facts(
            rank=rank,
            gpu=i.gpus.label[primary],
            mem_ratio=mem_ratio,
            mem_bytes=i.mem[primary],
            others_mem_bytes=others_mem,
            busy_ratio=busy_ratio,
            busy=i.busy[primary],
            others_busy=_others_median(busy, primary),
            gpu_count=n,
            command=command,
            batch=batch,
            chunks=None if current is None else tuple(current),
            balanced=None if balanced is None else tuple(balanced),
            accumulated=i.accumulated[rank],
            per_process=max(1, round(batch / n)) if batch else None,
            placeholder=not t.script,
        )
        findings.append(
            Finding(
                kind=KIND,
                severity="warning",
                ranks=(rank,),
                facts=facts,
                evidence={
                    "gpus": [i.gpus.ref[primary]],
                    "per_gpu": _per_gpu(i, order, current),
                    "mem_ratio": None if mem_ratio is None else round(mem_ratio, 2),
                    "busy_ratio": None if busy_ratio is None else round(busy_ratio, 2),
                    "batch_size": batch,
                    "chunk_sizes": current,
                    "balanced_chunk_sizes": balanced,
                    "ddp_command": command,
                    "script": name,
                    "script_note": "given" if t.script else "placeholder",
                    "speedup_model": NOT_PREDICTED,
                },
                predicted_speedup=None,
                fixes=tuple(_gather_fixes(facts)),
                gpus=(primary,),
            )
        )
        if mem_ratio is None:
            continue
        findings.append(
            imbalance_finding(
                primary,
                i.gpus,
                measured,
                mem,
                ranks=(rank,),
                facts=PrimaryMemory(facts),
                near_full=t.near_full,
                fixes=_memory_fixes(facts),
                cause=KIND,
            )
        )
    return findings


def _gather_fixes(facts: Facts) -> list[Fix]:
    """DDP (one process per GPU) with the batch per process, or a balanced scatter."""
    answers = (KIND,)
    fixes = [Fix("parallel_mode", facts.rank, "dataparallel", "ddp", None, answers)]
    if facts.batch:
        fixes.append(Fix("batch_size", facts.rank, facts.batch, facts.per_process, None, answers))
    if facts.balanced:
        fixes.append(_scatter(facts, answers))
    return fixes


def _memory_fixes(facts: Facts) -> list[Fix]:
    """The primary's memory: a smaller chunk for it where one helps, or DDP."""
    answers = (KIND, "memory_imbalance")
    ddp = Fix("parallel_mode", facts.rank, "dataparallel", "ddp", None, answers)
    return [_scatter(facts, answers), ddp] if facts.balanced else [ddp]


def _scatter(facts: Facts, answers: tuple[str, ...]) -> Fix:
    return Fix(
        "scatter_chunks",
        facts.rank,
        _chunks_code(facts.chunks),
        _chunks_code(facts.balanced),
        None,
        answers,
    )


def _chunks_code(chunks: Sequence[int] | None) -> str | None:
    """Chunks as a fix's value: ``"5,9,9,9"``."""
    return None if not chunks else ",".join(str(c) for c in chunks)


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
    i: Inputs, order: Sequence[str], chunks: Sequence[int] | None
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for k, u in enumerate(order):
        measured = u in i.gpus.ref
        mem = i.mem.get(u)
        busy = i.busy.get(u)
        out[u] = {
            **(i.gpus.ref[u] if measured else {"uuid": u}),
            "ranks": list(i.owners.get(u, ())),
            "chunk": chunks[k] if chunks and k < len(chunks) else None,
            "mem_used_bytes": None if mem is None else round(mem),
            "mem_total_bytes": i.gpus.total[u] if measured else None,
            "gpu_util": None if busy is None else round(busy, 3),
        }
    return out


RULE = Rule(
    kind=KIND,
    place=60,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
    explained_by=(),
)
