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
Fixes, as data: an owning rank's GPU placement (``gpu_assignment``), a rank's stray process
(``stray_process``), or, on a GPU no rank of the job holds, each process to stop
(``stray_process`` with its PID as ``current``, no rank, the GPU named).

A GPU whose owners all train and spend at least ``waiting_share`` of their step waiting (for
data, or for peers at a collective) is not idle: its low utilisation is the wait that
data_starvation and the straggler rules judge on the ranks (a starved job on a small model
reads below 2% on NVML), and those findings name the fix.

Speed-up: not predicted (the report says why). Nothing in the job waits for an idle GPU; freeing
it gives its memory, and the GPU itself, to work that uses it. One finding per idle GPU,
``warning``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..devices import GIB, DeviceStats
from ..findings import Finding
from ..fixes import Fix
from ..rule import Explained, Rule
from ..snapshot import Snapshot

KIND = "idle_device"


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: while ranks report steps, one needs this many in the window first.
    min_samples: NVML samples a GPU needs in the window before it is judged.
    max_util: median utilisation (0..1) at or below which a GPU counts as idle.
    min_mem_bytes: memory in use that counts as held where NVML lists no process.
    waiting_share: owners that wait this share of their step or more explain the GPU's
        idleness (their waits are the rank rules' to judge).
    """

    min_steps: int = 8
    min_samples: int = 5
    max_util: float = 0.02
    min_mem_bytes: int = GIB
    waiting_share: float = 0.5


@dataclass(frozen=True)
class Inputs:
    """Per GPU with enough samples, on the bus, whose utilisation was read, in node and index
    order: its utilisation and its NVML figures (the snapshot's reduction: memory in use, the
    processes listed, its name); the ranks that own each GPU and the ranks with a stray process
    on it. Per rank ready to judge: its waits (data wait plus collective wait) and its step."""

    util: Mapping[str, float]
    gpus: Mapping[str, DeviceStats]
    owners: Mapping[str, tuple[int, ...]]
    strays: Mapping[str, Mapping[int, int | None]]
    wait_s: Mapping[int, float]
    step_s: Mapping[int, float]


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


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    if snapshot.ranks and snapshot.most_steps < t.min_steps:
        return None
    gpus = {
        u: d
        for u, d in snapshot.gpus_in_place
        if not d.lost and d.samples >= t.min_samples and d.gpu_util is not None
    }
    ready = snapshot.ready(t.min_steps)
    return Inputs(
        util={u: d.gpu_util for u, d in gpus.items() if d.gpu_util is not None},
        gpus=gpus,
        owners=snapshot.owners,
        strays=snapshot.strays,
        wait_s={r: s.data_wait_s + (s.collective_wait_s or 0.0) for r, s in ready.items()},
        step_s={r: s.step_s for r, s in ready.items()},
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find GPUs that hold memory and compute nothing."""
    # Ranks that train and wait (data wait plus collective wait) ``waiting_share`` of their step.
    waiting = frozenset(r for r, w in i.wait_s.items() if w >= t.waiting_share * i.step_s[r])
    findings: list[Finding] = []
    for uuid, util in i.util.items():
        if util > t.max_util:
            continue
        mine = i.owners.get(uuid, ())
        if mine and all(r in waiting for r in mine):
            continue
        d = i.gpus[uuid]
        used = d.mem_used_bytes
        if not d.processes and (used is None or used < t.min_mem_bytes):
            continue
        known = [p.used_bytes for p in d.processes if p.used_bytes is not None]
        held = float(sum(known)) if known else used
        ranks = tuple(mine) or tuple(sorted(i.strays.get(uuid, {})))
        findings.append(_finding(d, ranks, held, owned=bool(mine)))
    return findings


def _finding(d: DeviceStats, ranks: tuple[int, ...], held: float | None, *, owned: bool) -> Finding:
    facts = Facts(d.label, d.node, d.pids, held, d.gpu_util or 0.0, d.span_s)
    return Finding(
        kind=KIND,
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
        },
        predicted_speedup=None,
        fixes=_fixes(d, ranks, owned=owned),
        gpus=(d.uuid,),
    )


def _fixes(d: DeviceStats, ranks: tuple[int, ...], *, owned: bool) -> tuple[Fix, ...]:
    """Free the GPU: an owning rank's placement, a rank's stray process, or each process outside
    the job (by PID; one fix without a PID where NVML listed none)."""
    answers = (KIND,)
    if ranks:
        lever = "gpu_assignment" if owned else "stray_process"
        return tuple(Fix(lever, r, d.uuid, None, None, answers, d.uuid) for r in ranks)
    return tuple(
        Fix("stray_process", None, pid, None, None, answers, d.uuid) for pid in d.pids or (None,)
    )


RULE = Rule(
    kind=KIND,
    place=100,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
)
