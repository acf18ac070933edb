"""What the exporter renders at scrape time: plain data, no Prometheus types.

Whoever owns the samples (the node agent, the analysis service) keeps an :class:`ExportState`
current and hands the exporter a function returning it; the collector never reads samples itself,
so a scrape costs only the rendering and tests build a state by hand.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from auditor.analysis.findings import Finding
from auditor.analysis.mfu import JobMfu, RankFlops
from auditor.samples import (
    PHASES,
    Batch,
    DeviceSample,
    MemoryBudget,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)

# StepSample field holding each phase's duration (collective_wait may be None: not measured).
PHASE_FIELDS: dict[str, str] = {phase: f"{phase}_s" for phase in PHASES}


@dataclass(frozen=True)
class RankTotals:
    """Running totals of one rank since it started, so counters survive the bounded step window.

    ``phase_seconds`` holds only phases measured at least once and ``samples`` stays None until
    a step reports its batch size: an unmeasured total is absent, not zero.

    Frozen: the owner replaces a rank's totals with :meth:`plus`'s new object, so a scrape
    reading them while a batch is folded in sees all of that batch or none of it. Mutated in
    place, a scrape could read the step seconds before a step and its phases after it: the
    waiting rank's collective wait then exceeds its step time in Prometheus.
    """

    steps: int = 0
    step_seconds: float = 0.0
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    samples: int | None = None
    # DataLoader batches the steps trained on (micro-batches under gradient accumulation).
    micro_batches: int = 0
    last: StepSample | None = None

    def plus(self, steps: Iterable[StepSample]) -> RankTotals:
        """These totals with ``steps`` added; ``last`` follows the newest step even if steps
        arrive out of order."""
        count, seconds, micro = self.steps, self.step_seconds, self.micro_batches
        phases = dict(self.phase_seconds)
        samples, last = self.samples, self.last
        for step in steps:
            count += 1
            micro += max(1, step.micro_batches)
            seconds += step.step_s
            for phase, attr in PHASE_FIELDS.items():
                value: float | None = getattr(step, attr)
                if value is not None:
                    phases[phase] = phases.get(phase, 0.0) + value
            if step.batch_size is not None:
                samples = (samples or 0) + step.batch_size
            if last is None or (step.step, step.time) >= (last.step, last.time):
                last = step
        return RankTotals(count, seconds, phases, samples, micro, last)


_NO_TOTALS = RankTotals()


@dataclass(frozen=True)
class GpuStatus:
    """One GPU as the node agent last saw it through its monitor.

    ``sample`` is the latest sample received (None until the monitor's first one arrives);
    ``up`` is whether the latest pull got an answer. While the monitor is down the last sample
    is kept for its identity and timestamp only: its values are not exported as current.
    """

    index: int
    uuid: str
    model: str = ""
    sample: DeviceSample | None = None
    up: bool = False


@dataclass(frozen=True)
class ExportState:
    """Everything one exporter publishes: the ranks it knows, their totals, CPU and findings.

    ``cpu`` holds the latest :class:`ProcessCpu` per rank; ``ended`` the ranks whose connection
    closed (exported as ``auditor_rank_up 0`` rather than dropped, so alerts can see the end);
    ``gpus`` the node's GPUs by UUID.
    Frozen so a published state is not swapped field by field; the owner may still update the
    containers in place (the collector copies each one before iterating it).
    """

    job: str
    node: str
    infos: dict[int, RankInfo] = field(default_factory=dict)
    totals: dict[int, RankTotals] = field(default_factory=dict)
    cpu: dict[int, ProcessCpu] = field(default_factory=dict)
    node_cpu: NodeCpu | None = None
    ended: set[int] = field(default_factory=set)
    findings: list[Finding] = field(default_factory=list)
    gpus: dict[str, GpuStatus] = field(default_factory=dict)
    # The latest measured memory budget per rank (``auditor.probe.memory``).
    memory: dict[int, MemoryBudget] = field(default_factory=dict)
    # The ranks' counted work as the latest verdict judged it (``auditor.analysis.mfu``), by
    # rank number: FLOPs per step, FLOP/s and MFU; and the job's MFU. Empty and None until a
    # rank counted its FLOPs; the MFUs stay None on a CPU or a device the peak table lacks.
    flops: dict[int, RankFlops] = field(default_factory=dict)
    job_mfu: float | None = None


def gpu_owner(gpu: GpuStatus, ranks: Mapping[int, RankInfo]) -> RankInfo | None:
    """The rank that owns ``gpu`` (``ranks``: the live ranks on this node): the lowest rank that
    names its UUID in ``device_uuids``; else the lowest rank that names no UUID at all and whose
    process holds memory on it. A rank that named its GPUs does not own another GPU it merely
    has a context on (the stray CUDA context on GPU 0 that many DDP scripts create)."""
    for rank in sorted(ranks):
        if gpu.uuid in ranks[rank].device_uuids:
            return ranks[rank]
    if gpu.sample is not None and gpu.sample.processes:
        pids = {p.pid for p in gpu.sample.processes}
        for rank in sorted(ranks):
            info = ranks[rank]
            if not info.device_uuids and info.pid and info.pid in pids:
                return info
    return None


def apply_batch(state: ExportState, batch: Batch) -> ExportState:
    """Fold ``batch`` into ``state`` the way the node agent does; returns the state to publish.

    A rank's info replaces its previous one and revives it if it had ended; each step is added to
    its rank's running totals; the newest :class:`ProcessCpu` per rank and the newest node CPU
    are kept; ranks in ``batch.ended`` are marked ended (after the infos, as the agent does);
    each GPU takes its newest sample and is up. Containers are updated in place; a new
    :class:`ExportState` is returned only when ``node_cpu`` changes (the state is frozen).

    The one update path of an export state: the node agent folds its intake and host samples
    in with it, ``auditor replay`` a recording's ticks.
    """
    for info in batch.infos:
        state.infos[info.slot] = info
        state.ended.discard(info.slot)
    by_rank: dict[int, list[StepSample]] = defaultdict(list)
    for s in batch.steps:
        by_rank[s.rank].append(s)
    for rank, steps in by_rank.items():
        state.totals[rank] = state.totals.get(rank, _NO_TOTALS).plus(steps)
    for c in sorted(batch.processes, key=lambda c: c.time):
        state.cpu[c.rank] = c
    state.ended.update(batch.ended)
    for m in sorted(batch.memory, key=lambda m: m.time):
        state.memory[m.rank] = m
    for d in sorted(batch.devices, key=lambda d: d.time):
        old = state.gpus.get(d.uuid)
        if old is not None and old.sample is not None and old.sample.time > d.time:
            continue  # an older read must not replace a newer one
        model = (old.model if old is not None else "") or d.model
        state.gpus[d.uuid] = GpuStatus(index=d.index, uuid=d.uuid, model=model, sample=d, up=True)
    if batch.nodes:
        newest = max(batch.nodes, key=lambda n: n.time)
        return dataclasses.replace(state, node_cpu=newest)
    return state


def with_work(
    state: ExportState, flops: Mapping[int, RankFlops], job: JobMfu | None
) -> ExportState:
    """``state`` with the counted work of a verdict: each rank's figures
    (:func:`auditor.analysis.mfu.rank_flops`) and the job's MFU (:func:`~auditor.analysis.mfu.
    job_mfu`). A new state, swapped in whole, so a scrape never sees one verdict's ranks beside
    another's job figure."""
    return dataclasses.replace(
        state, flops=dict(flops), job_mfu=job.mfu if job is not None else None
    )
