"""idle_device: a GPU whose memory is held while it computes nothing.

Metric, per GPU (NVML): the median utilisation over the window, the processes NVML lists on it
and the memory in use. Decision: the median utilisation is at most ``max_util`` while memory is
held: a process is listed, or the memory in use is at least ``min_mem_bytes`` (NVML may not list
processes inside containers). A GPU needs ``min_samples`` samples in the window; one whose
utilisation could not be read is not judged (unknown is not idle), and a GPU that fell off the
bus is lost, not idle.

While a job's ranks report steps, at least one of them needs ``min_steps`` steps in the window:
memory allocated before the first step (model loading, compilation) is not an idle GPU. Without
any rank (an operator's node-only view) the GPUs are judged alone.

Blamed: the ranks that own the GPU (:func:`auditor.analysis.devices.gpu_owners`), else ranks of
the job with a stray process on it; otherwise no rank (``ranks=()``): the GPU and the PIDs are
named in the evidence and the summary; the report gives the fix under ``evidence["fix"]``.

A GPU whose owners all train and spend at least ``waiting_share`` of their step waiting (for
data, or for peers at a collective) is not idle: its low utilisation is the wait that
data_starvation and the straggler rules judge on the ranks (a starved job on a small model
reads below 2% on NVML), and those findings name the fix.

Speed-up: not predicted. Nothing in the job waits for an idle GPU; freeing it gives its memory,
and the GPU itself, to work that uses it. One finding per idle GPU, ``warning``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..devices import GIB, DeviceStats
from ..findings import Finding
from ..snapshot import Snapshot

SPEEDUP_NOTE = "not predicted: nothing in the job waits for an idle GPU"


@dataclass(frozen=True)
class Facts:
    """An idle GPU that holds memory: the processes NVML lists on it (none where it lists
    none), the memory they hold, and its median utilisation over the window."""

    label: str
    node: str
    pids: tuple[int, ...]
    held_bytes: float | None
    busy: float
    window_s: float


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_samples: int = 5,
    max_util: float = 0.02,
    min_mem_bytes: int = GIB,
    waiting_share: float = 0.5,
) -> list[Finding]:
    """Find GPUs that hold memory and compute nothing.

    Args:
        min_steps: while ranks report steps, one needs this many in the window first.
        min_samples: NVML samples a GPU needs in the window before it is judged.
        max_util: median utilisation (0..1) at or below which a GPU counts as idle.
        min_mem_bytes: memory in use that counts as held where NVML lists no process.
        waiting_share: owners that wait this share of their step or more explain the GPU's
            idleness (their waits are the rank rules' to judge).
    """
    if snapshot.ranks and snapshot.most_steps < min_steps:
        return []
    owners = snapshot.owners
    strays = snapshot.strays
    waiting = _waiting(snapshot, min_steps, waiting_share)
    findings: list[Finding] = []
    for uuid, d in snapshot.gpus_in_place:
        if d.lost or d.samples < min_samples or d.gpu_util is None or d.gpu_util > max_util:
            continue
        mine = owners.get(uuid, ())
        if mine and all(r in waiting for r in mine):
            continue
        used = d.mem_used_bytes
        if not d.processes and (used is None or used < min_mem_bytes):
            continue
        known = [p.used_bytes for p in d.processes if p.used_bytes is not None]
        held = float(sum(known)) if known else used
        ranks = tuple(owners.get(uuid, ())) or tuple(sorted(strays.get(uuid, {})))
        findings.append(_finding(d, ranks, held))
    return findings


def _waiting(snapshot: Snapshot, min_steps: int, share: float) -> frozenset[int]:
    """Ranks that train and wait (data wait plus collective wait) ``share`` of their step."""
    return frozenset(
        r
        for r, s in snapshot.ready(min_steps).items()
        if s.data_wait_s + (s.collective_wait_s or 0.0) >= share * s.step_s
    )


def _finding(d: DeviceStats, ranks: tuple[int, ...], held: float | None) -> Finding:
    facts = Facts(d.label, d.node, d.pids, held, d.gpu_util or 0.0, d.span_s)
    return Finding(
        kind="idle_device",
        severity="warning",
        ranks=ranks,
        facts=facts,
        evidence={
            "gpus": [d.ref],
            "gpu_util": None if d.gpu_util is None else round(d.gpu_util, 3),
            "held_bytes": None if held is None else round(held),
            "mem_used_bytes": None if d.mem_used_bytes is None else round(d.mem_used_bytes),
            "mem_total_bytes": d.mem_total_bytes,
            "pids": list(d.pids),
            "processes": {str(p.pid): p.used_bytes for p in d.processes},
            "window_s": round(d.span_s, 1),
            "samples": d.samples,
            "speedup_model": SPEEDUP_NOTE,
        },
        predicted_speedup=None,
    )
