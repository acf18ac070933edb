"""idle_device: a GPU whose memory is held while it computes nothing, while its owners train.

Metric, per GPU (NVML): the median utilisation, the processes NVML lists on it and the memory in
use, over the time its owners were training: the NVML samples between the owning ranks' first
step's start and last step's end (their whole run's steps, :attr:`Snapshot.history`, and the
window's). Start-up (CUDA init, rendezvous, the model loaded) and teardown are not idleness: a
short run's start-up can be half of it and reads 0% on NVML; the time account says what the GPU
held then (:func:`~auditor.analysis.accounting.with_gpu_memory`). A GPU no rank owns is judged
over the time the job's ranks trained; without any rank (an operator's node-only view), over the
whole window. Where the samples are not at hand (serve's Prometheus figures) the window's
figures stand.

Decision: the median utilisation is at most ``max_util`` while memory is held: a process is
listed, or the memory in use is at least ``min_mem_bytes`` (NVML may not list processes inside
containers). A GPU needs ``min_samples`` samples over that time; one whose utilisation could not
be read is not judged (unknown is not idle), and a GPU that fell off the bus is lost, not idle.
A GPU whose owners have not stepped yet is starting up, not judged.

While a job's ranks report steps, at least one of them needs ``min_steps`` steps in the window:
memory allocated before the first step (model loading, compilation) is not an idle GPU.

Evidence from the ranks outranks a median of NVML samples: a GPU whose owning rank computes on
it, a CUDA rank whose phases (timed with CUDA events on the device's timeline) take at least
``min_device_share`` of its step, is never idle, whatever NVML's samples say.

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

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from auditor.samples import DeviceSample

from ..devices import GIB, DeviceStats, reduce_devices
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
    min_device_share: an owning CUDA rank whose phases on the device take this share of its
        step or more computes on the GPU: not idle, whatever NVML's samples say.
    """

    min_steps: int = 8
    min_samples: int = 5
    max_util: float = 0.02
    min_mem_bytes: int = GIB
    waiting_share: float = 0.5
    min_device_share: float = 0.02


@dataclass(frozen=True)
class Inputs:
    """Per GPU with enough samples over its owners' training, on the bus, whose utilisation was
    read, in node and index order: its utilisation and its NVML figures over that time (memory
    in use, the processes listed, its name); the ranks that own each GPU and the ranks with a
    stray process on it. Per rank ready to judge that owns a GPU reading idle (the others are
    not asked): its waits (data wait plus collective wait), its step, and for a CUDA rank the
    share of its step its phases took on the device (``device_share``) and the GPU that
    timeline is on (``device_gpu``)."""

    util: Mapping[str, float]
    gpus: Mapping[str, DeviceStats]
    owners: Mapping[str, tuple[int, ...]]
    strays: Mapping[str, Mapping[int, int | None]]
    wait_s: Mapping[int, float]
    step_s: Mapping[int, float]
    device_share: Mapping[int, float]
    device_gpu: Mapping[int, str]
    # The GPUs judged over their owners' training (the others over the whole window).
    while_training: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Facts:
    """An idle GPU that holds memory: the processes NVML lists on it (none where it lists
    none), the memory they hold, and its median utilisation over the time judged
    (``window_s``: its owners' training, see the module)."""

    label: str
    node: str
    pids: tuple[int, ...]
    held_bytes: float | None
    busy: float
    window_s: float
    # Judged over the time the job's ranks trained (False: over the whole window, as a
    # node-only view or serve's figures are).
    while_training: bool = True


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    if snapshot.ranks and snapshot.most_steps < t.min_steps:
        return None
    # Without raw samples (serve: figures Prometheus reduced) the window's figures stand.
    spans = _training_spans(snapshot) if snapshot.devices else {}
    raw: dict[str, list[DeviceSample]] = {}
    for sample in snapshot.devices:
        raw.setdefault(sample.uuid, []).append(sample)
    owners = snapshot.owners
    ranked = bool(snapshot.ranks)
    job = (
        (min(lo for lo, _ in spans.values()), max(hi for _, hi in spans.values()))
        if spans
        else None
    )
    gpus: dict[str, DeviceStats] = {}
    training: set[str] = set()
    for u, window in snapshot.gpus_in_place:
        if window.lost:
            continue
        samples = raw.get(u)
        judged: DeviceStats | None = window
        if samples and ranked:
            # Over the time its owners trained; the whole window without ranks (a node-only
            # view) or where the samples are not at hand (serve).
            span = _span(owners.get(u, ()), spans, job) if job is not None else None
            judged = _while_training(u, window, samples, span, t.max_util)
            training.add(u)
        if judged is not None and judged.samples >= t.min_samples and judged.gpu_util is not None:
            gpus[u] = judged
    # The ranks' word is asked only of the owners of GPUs that read idle on NVML.
    ready = snapshot.ready(t.min_steps)
    asked = sorted(
        {r for u, d in gpus.items() if (d.gpu_util or 0.0) <= t.max_util for r in owners.get(u, ())}
        & set(ready)
    )
    infos = snapshot.view_of
    gpus_of = snapshot.gpus_of
    device_gpu: dict[int, str] = {}
    for r in asked:
        info = infos[r].info
        if not info.device.startswith("cuda"):
            continue
        # The device timeline is the rank's current device: its own word, else its one GPU.
        mine = gpus_of.get(r, ())
        timeline = info.device_uuids[:1] or (mine if len(mine) == 1 else ())
        if timeline:
            device_gpu[r] = timeline[0]
    return Inputs(
        util={u: d.gpu_util for u, d in gpus.items() if d.gpu_util is not None},
        gpus=gpus,
        owners=owners,
        strays=snapshot.strays,
        wait_s={r: ready[r].data_wait_s + (ready[r].collective_wait_s or 0.0) for r in asked},
        step_s={r: ready[r].step_s for r in asked},
        device_share={r: ready[r].busy_ratio for r in device_gpu},
        device_gpu=device_gpu,
        while_training=frozenset(training),
    )


def _training_spans(snapshot: Snapshot) -> dict[int, tuple[float, float]]:
    """Each rank's time training: from its first step's start to its last step's end, over its
    whole run (:attr:`Snapshot.history`, every step, warm-up included: it computes); from the
    window's steps for a rank without a history (a snapshot built by hand)."""
    out: dict[int, tuple[float, float]] = {}
    for r, h in snapshot.history.items():
        buckets = h.buckets
        if buckets:
            out[r] = (buckets[0].start, buckets[-1].end)
    for v in snapshot.ranks:
        if v.steps and v.info.rank not in out:
            lo = min(s.time - s.step_s * s.count for s in v.steps)
            out[v.info.rank] = (lo, max(s.time for s in v.steps))
    return out


def _while_training(
    uuid: str,
    d: DeviceStats,
    samples: Sequence[DeviceSample],
    span: tuple[float, float] | None,
    max_util: float,
) -> DeviceStats | None:
    """The GPU's figures over ``span``, the time its owners trained (``d``, the window's, where
    every sample lies inside it); None where no sample does. Reduced again only where it may
    be idle then (a live window inside the training is its own figures; 4,096 GPUs reduced
    twice cost a second)."""
    if span is None:
        return None
    lo, hi = span
    during = [s for s in samples if lo <= s.time <= hi]
    if len(during) == len(samples):
        return d
    if not during:
        return None
    utils = [s.gpu_util for s in during if s.gpu_util is not None]
    if utils and statistics.median(utils) > max_util:
        # Busy while its owners trained: not idle; the figures only need to say so.
        return replace(d, samples=len(during), gpu_util=float(statistics.median(utils)))
    return reduce_devices(during)[uuid]


def _span(
    owners: Sequence[int], spans: Mapping[int, tuple[float, float]], job: tuple[float, float]
) -> tuple[float, float] | None:
    """The time a GPU's owners trained (the job's for a GPU no rank owns); None where its
    owners have not stepped: they are starting up."""
    if not owners:
        return job
    bounds = [spans[r] for r in owners if r in spans]
    if not bounds:
        return None
    if len(bounds) == 1:
        return bounds[0]
    return min(b[0] for b in bounds), max(b[1] for b in bounds)


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Find GPUs that hold memory and compute nothing."""
    # Ranks that train and wait (data wait plus collective wait) ``waiting_share`` of their step.
    waiting = frozenset(r for r, w in i.wait_s.items() if w >= t.waiting_share * i.step_s[r])
    # GPUs an owning rank computes on (its phases on the device's timeline): never idle.
    computing = frozenset(
        u for r, u in i.device_gpu.items() if i.device_share.get(r, 0.0) >= t.min_device_share
    )
    findings: list[Finding] = []
    for uuid, util in i.util.items():
        if util > t.max_util or uuid in computing:
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
        findings.append(
            _finding(d, ranks, held, owned=bool(mine), training=uuid in i.while_training)
        )
    return findings


def _finding(
    d: DeviceStats, ranks: tuple[int, ...], held: float | None, *, owned: bool, training: bool
) -> Finding:
    facts = Facts(d.label, d.node, d.pids, held, d.gpu_util or 0.0, d.span_s, training)
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
            "while_training": training,
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
