"""hardware_straggler: a rank slowed by its GPU (throttled, clocked low, narrow link) that the
others wait for.

Metric, per GPU (NVML, medians over the window): the share of samples with a throttle
(clock-event) reason other than ``gpu_idle``, the SM clock as a share of its maximum, and the
best PCIe link seen against the link's maximum. Per rank (probe): compute per sample and the
median wait at the gradient all-reduce.

Decision, both halves needed:

* the GPU stands out from its peers' GPUs (the other ranks' GPUs in the job): throttled in at
  least ``min_throttle_share`` of its samples while the peers' median share is below it; or its
  SM clock ratio at most ``max_clock_ratio`` of the peers' median; or its PCIe link never reached
  its maximum generation or width while the peers' links are better. A condition every GPU
  shares (a power cap on the whole node) is the platform, not a straggler.
* the others wait for its rank: the rank computes at least ``min_excess`` times its peers'
  median per sample, and, where the collective wait was measured, it waits least (within a
  quarter of the spread of waits) and at least ``min_gap_ratio`` of the step less than its peers'
  median. Where no rank's wait was measured, backward wall time hides the wait, so only the
  phases outside the all-reduce (h2d, forward, optimizer) are compared per sample. NVML reads a
  rank waiting in an all-reduce as fully busy, so GPU utilisation is never used to pick the
  rank. A rank that only waits is never blamed.

Only one-GPU ranks (DDP) are judged: a DataParallel process has no per-GPU timings.

Fix, by the reason: thermal -> cooling (fans, airflow, reseat), power -> the power limit
(``nvidia-smi -i <index> -pl <watts>`` to the peers' limit where it is lower), clocks held low
without a reason -> reset locked clocks (``nvidia-smi -i <index> -rgc``), link -> reseat the card
or check the riser and the slot's BIOS link setting. Always offered too: move the rank off that
GPU, or give it a smaller batch share ``b -> b * (peer compute per sample / its own)``.

Fixes, as data: the cause's change on the GPU (``device``, its cause as ``current``:
``thermal``, ``power_cap``, ``hw_slowdown``, ``locked_clocks``, ``pcie_link`` or ``slower``; or
``power_limit`` from the GPU's watts to its peers'), moving the rank off the GPU
(``gpu_assignment``), and the smaller batch (``batch_size``) where one fits its pace.

Predicted speed-up: the barrier model (:mod:`auditor.analysis.advisor`) with the blamed ranks' own
work (local time less data wait) at their peers' median, i.e. the GPU brought back to its peers'
speed while any data wait stays; not predicted (None; ``Facts.waits_measured`` says why) where the
waits were not measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..advisor import Barrier
from ..devices import DeviceStats
from ..findings import Finding, severity_for
from ..fixes import Fix
from ..measures import PeerMedians, measured_gpus, own_work, peer_median, with_peers_work
from ..rule import Explained, Rule
from ..snapshot import Snapshot
from ..stats import RankStats

KIND = "hardware_straggler"
_THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
_POWER = ("sw_power_cap", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class Thresholds:
    """Args:
    min_steps: steps a rank needs in the window before it is judged.
    min_samples: NVML samples a GPU needs in the window before it is judged.
    min_throttle_share: share of samples with a throttle reason (not gpu_idle) that counts.
    max_clock_ratio: SM clock ratio relative to the peers' median that counts as low.
    min_excess: the rank's compute per sample relative to its peers' median.
    min_gap_ratio: its wait must be this share of the step below its peers' median wait.
    """

    min_steps: int = 8
    min_samples: int = 5
    min_throttle_share: float = 0.5
    max_clock_ratio: float = 0.85
    min_excess: float = 1.10
    min_gap_ratio: float = 0.05


@dataclass(frozen=True)
class Inputs:
    """Per judged rank (a one-GPU, non-DataParallel rank ready to judge whose GPU has enough
    samples): its GPU's NVML figures (the snapshot's reduction, not a copy), its compute, micro-
    batch and micro-batches per step. Per ready rank: compute per sample (only the phases
    outside the all-reduce where fewer than two waits were measured), local time, own work
    (local less data wait) and the measured collective waits. The job's median step and its
    barrier model."""

    gpu: Mapping[int, DeviceStats]
    compute_s: Mapping[int, float]
    micro_batch: Mapping[int, float | None]
    accumulated: Mapping[int, int]
    per_sample_s: Mapping[int, float]
    local_s: Mapping[int, float]
    work_s: Mapping[int, float]
    wait_s: Mapping[int, float]
    step_s: float
    barrier: Barrier


@dataclass(frozen=True)
class Throttled:
    """The GPU throttled (NVML reasons other than ``gpu_idle``) in ``share`` of its samples."""

    share: float
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class LowClock:
    """The GPU's SM clock at ``ratio`` of its maximum (``mhz``), against ``peer_ratio`` on its
    peers."""

    ratio: float
    mhz: float | None
    peer_ratio: float


@dataclass(frozen=True)
class NarrowLink:
    """The GPU's PCIe link below its maximum where its peers' is better (``pcie``: current/max)."""

    pcie: str


# What makes a GPU slower than its peers'.
Slowdown = Throttled | LowClock | NarrowLink
# Each slowdown's code in the evidence (``per_rank.<rank>.reasons``).
SLOWDOWN_CODES: Mapping[type, str] = {
    Throttled: "throttled",
    LowClock: "low_clock",
    NarrowLink: "narrow_link",
}


@dataclass(frozen=True)
class PowerLimit:
    """A power limit under 95% of the peers' median limit."""

    watts: float
    peer_watts: float


@dataclass(frozen=True)
class SlowGpu:
    """A blamed rank's GPU: what makes it slower than its peers', what it reports of the cause
    (heat, power, HW slowdown, its link), and the batch that fits the rank's pace (None where a
    smaller batch buys nothing or the batch is unknown)."""

    label: str
    uuid: str
    index: int
    node: str
    slowdowns: tuple[Slowdown, ...]
    thermal: bool
    temperature_c: float | None
    power: bool
    power_limit: PowerLimit | None
    hw_slowdown: bool
    pcie_degraded: bool
    pcie: str
    compute_s: float
    batch_size: int | None = None
    batch_share: int | None = None
    # Micro-batches per step: the batch figures are per micro-batch (the DataLoader's batch).
    accumulated: int = 1


@dataclass(frozen=True)
class Facts:
    """The blamed ranks and their GPUs; whether the collective waits were measured (without
    them the speed-up is not predicted)."""

    ranks: Mapping[int, SlowGpu]
    waits_measured: bool = True


def measure(snapshot: Snapshot, t: Thresholds) -> Inputs | None:
    stats = snapshot.ready(t.min_steps)
    if len(stats) < 2:
        return None
    dstats = measured_gpus(snapshot, t.min_samples)
    gpus_of = snapshot.gpus_of
    modes = {v.info.rank: v.info.parallel_mode for v in snapshot.ranks}
    gpu: dict[int, DeviceStats] = {}
    for r in stats:
        mine = gpus_of.get(r, ())
        if modes.get(r) == "dataparallel" or len(mine) != 1 or mine[0] not in dstats:
            continue
        gpu[r] = dstats[mine[0]]
    if len(gpu) < 2:
        return None
    waits = {r: s.collective_wait_s for r, s in stats.items() if s.collective_wait_s is not None}
    outside = len(waits) < 2
    return Inputs(
        gpu=gpu,
        compute_s={r: stats[r].compute_s for r in gpu},
        micro_batch={r: stats[r].micro_batch_size for r in gpu},
        accumulated={r: stats[r].accumulated for r in gpu},
        per_sample_s={r: _per_sample(s, outside_barrier=outside) for r, s in stats.items()},
        local_s={r: s.local_s for r, s in stats.items()},
        work_s={r: own_work(s) for r, s in stats.items()},
        wait_s=waits,
        step_s=statistics.median(s.step_s for s in stats.values()),
        barrier=Barrier.of(stats),
    )


def decide(i: Inputs, t: Thresholds, explained: Explained) -> list[Finding]:
    """Blame ranks whose GPU is slower than its peers' and that the others wait for."""
    gpu = i.gpu
    waits = i.wait_s
    blamed: dict[int, tuple[Slowdown, ...]] = {}
    # Peer figures for every rank at once: a per-rank list of peers is quadratic in ranks.
    share_of_peers = PeerMedians({q: g.throttle_share for q, g in gpu.items()})
    clock_of_peers = PeerMedians({q: g.sm_clock_ratio for q, g in gpu.items()})
    best_links = sorted(((_link(g), q) for q, g in gpu.items()), reverse=True)[:2]
    for r, d in gpu.items():
        slowdowns = _slowdowns(
            d,
            peer_share=share_of_peers.get(r),
            peer_clock=clock_of_peers.get(r),
            peer_link=next((link for link, q in best_links if q != r), (0, 0)),
            min_share=t.min_throttle_share,
            max_clock_ratio=t.max_clock_ratio,
        )
        if not slowdowns:
            continue
        if not _waited_for(r, i.per_sample_s, waits, i.step_s, t.min_excess, t.min_gap_ratio):
            continue
        blamed[r] = slowdowns
    if not blamed:
        return []

    # The fix brings a blamed rank's own work to its peers' median; its data wait stays.
    new_local = with_peers_work(i.local_s, i.work_s, blamed)
    # Without measured waits every rank's local time includes the barrier: no model to apply.
    measured = len(waits) >= 2
    speedup = i.barrier.speedup(new_local) if new_local and measured else None
    peer_limit = statistics.median(
        [g.power_limit_w for q, g in gpu.items() if q not in blamed and g.power_limit_w] or [0.0]
    )

    slow: dict[int, SlowGpu] = {}
    per_rank: dict[str, Any] = {}
    fixes: list[Fix] = []
    for r in sorted(blamed):
        d = gpu[r]
        peer_cps = peer_median({q: v for q, v in i.per_sample_s.items() if q not in blamed}, r)
        batch = share = None
        # In the unit the user sets: the micro-batch (the step's batch without accumulation).
        micro = i.micro_batch[r]
        if micro and peer_cps:
            fits = max(1, int(micro * peer_cps / i.per_sample_s[r]))
            if fits < micro:
                batch, share = round(micro), fits
        slow[r] = _slow_gpu(
            d, blamed[r], peer_limit, i.compute_s[r], batch, share, i.accumulated[r]
        )
        fixes.extend(_fixes(r, slow[r], speedup))
        wait = waits.get(r)
        per_rank[str(r)] = {
            "gpu": d.ref,
            "reasons": [SLOWDOWN_CODES[type(x)] for x in blamed[r]],
            "compute_per_sample_ratio": None
            if not peer_cps
            else round(i.per_sample_s[r] / peer_cps, 2),
            "compute_ms": round(i.compute_s[r] * 1e3, 1),
            "collective_wait_ms": None if wait is None else round(wait * 1e3, 1),
        }
    evidence = {
        "gpus": [gpu[r].ref for r in sorted(blamed)],
        "per_rank": per_rank,
        "per_gpu": {
            g.uuid: {**g.ref, "rank": q, **_gpu_numbers(g)} for q, g in sorted(gpu.items())
        },
        "collective_wait_ms": {str(r): round(w * 1e3, 1) for r, w in sorted(waits.items())},
        "local_ms": {str(r): round(v * 1e3, 1) for r, v in sorted(i.local_s.items())},
    }
    return [
        Finding(
            kind=KIND,
            severity=severity_for(speedup),
            ranks=tuple(sorted(blamed)),
            facts=Facts(slow, measured),
            evidence=evidence,
            predicted_speedup=speedup,
            fixes=tuple(fixes),
            gpus=tuple(gpu[r].uuid for r in sorted(blamed)),
        )
    ]


def _per_sample(s: RankStats, *, outside_barrier: bool) -> float:
    """Compute per sample; only the phases outside the all-reduce where waits are unknown."""
    work = s.h2d_s + s.forward_s + s.optimizer_s if outside_barrier else s.compute_s
    return work / s.batch_size if s.batch_size else work


def _slowdowns(
    d: DeviceStats,
    *,
    peer_share: float | None,
    peer_clock: float | None,
    peer_link: tuple[int, int],
    min_share: float,
    max_clock_ratio: float,
) -> tuple[Slowdown, ...]:
    """What makes GPU ``d`` slower than its peers (their median throttle share and clock ratio,
    their best PCIe link); empty when nothing does."""
    out: list[Slowdown] = []
    if (
        d.throttle_share is not None
        and d.throttle_share >= min_share
        and (peer_share is None or peer_share < min_share)
    ):
        out.append(Throttled(d.throttle_share, tuple(d.throttle_reasons)))
    if (
        d.sm_clock_ratio is not None
        and peer_clock
        and d.sm_clock_ratio <= max_clock_ratio * peer_clock
    ):
        out.append(LowClock(d.sm_clock_ratio, d.sm_clock_mhz, peer_clock))
    if d.pcie_degraded and _link(d) < peer_link:
        out.append(NarrowLink(d.pcie_text))
    return tuple(out)


def _link(d: DeviceStats) -> tuple[int, int]:
    return (d.pcie_gen or 0, d.pcie_width or 0)


def _waited_for(
    r: int,
    per_sample: Mapping[int, float],
    waits: Mapping[int, float],
    step: float,
    min_excess: float,
    min_gap_ratio: float,
) -> bool:
    """The others wait for rank ``r``: it computes slower and, where measured, waits least."""
    peer_cps = peer_median(per_sample, r)
    if not peer_cps or per_sample[r] < min_excess * peer_cps:
        return False
    if len(waits) < 2:
        return True
    if r not in waits:
        return False  # its own wait is unknown while its peers' are known
    lo, hi = min(waits.values()), max(waits.values())
    peer_wait = peer_median(waits, r)
    if peer_wait is None:
        return False
    return waits[r] <= lo + 0.25 * (hi - lo) and peer_wait - waits[r] >= min_gap_ratio * step


def _slow_gpu(
    d: DeviceStats,
    slowdowns: tuple[Slowdown, ...],
    peer_limit: float,
    compute_s: float,
    batch_size: int | None,
    batch_share: int | None,
    accumulated: int = 1,
) -> SlowGpu:
    """GPU ``d`` as its fix needs it: its slowdowns, and which cause it reports (a power limit
    only where it is below its peers' median ``peer_limit``)."""
    limit = None
    if d.power_limit_w and peer_limit and d.power_limit_w < 0.95 * peer_limit:
        limit = PowerLimit(d.power_limit_w, peer_limit)
    return SlowGpu(
        label=d.label,
        uuid=d.uuid,
        index=d.index,
        node=d.node,
        slowdowns=slowdowns,
        thermal=any(r in d.throttle_reasons for r in _THERMAL),
        temperature_c=d.temperature_c,
        power=any(r in d.throttle_reasons for r in _POWER),
        power_limit=limit,
        hw_slowdown="hw_slowdown" in d.throttle_reasons,
        pcie_degraded=bool(d.pcie_degraded),
        pcie=d.pcie_text,
        compute_s=compute_s,
        batch_size=batch_size,
        batch_share=batch_share,
        accumulated=accumulated,
    )


def _fixes(r: int, gpu: SlowGpu, speedup: float | None) -> list[Fix]:
    """Rank ``r``'s fixes: the change its GPU's cause calls for (``device`` with the cause as
    ``current``, or ``power_limit`` to the peers' watts), moving the rank off the GPU, and the
    batch that fits its pace."""
    answers = (KIND,)

    def device(cause: str) -> Fix:
        return Fix("device", r, cause, None, speedup, answers, gpu.uuid)

    out: list[Fix] = []
    if gpu.thermal:
        out.append(device("thermal"))
    if gpu.power:
        limit = gpu.power_limit
        if limit is not None:
            out.append(
                Fix("power_limit", r, limit.watts, limit.peer_watts, speedup, answers, gpu.uuid)
            )
        else:
            out.append(device("power_cap"))
    if gpu.hw_slowdown and not (gpu.thermal or gpu.power):
        out.append(device("hw_slowdown"))
    if not out and any(isinstance(x, LowClock) for x in gpu.slowdowns):
        out.append(device("locked_clocks"))
    if gpu.pcie_degraded:
        out.append(device("pcie_link"))
    if not out:
        out.append(device("slower"))
    out.append(Fix("gpu_assignment", r, gpu.uuid, None, speedup, answers, gpu.uuid))
    if gpu.batch_share is not None:
        out.append(Fix("batch_size", r, gpu.batch_size, gpu.batch_share, speedup, answers))
    return out


def _gpu_numbers(d: DeviceStats) -> dict[str, Any]:
    return {
        "throttle_share": None if d.throttle_share is None else round(d.throttle_share, 3),
        "throttle_reasons": list(d.throttle_reasons),
        "sm_clock_mhz": d.sm_clock_mhz,
        "sm_clock_max_mhz": d.sm_clock_max_mhz,
        "sm_clock_ratio": None if d.sm_clock_ratio is None else round(d.sm_clock_ratio, 3),
        "temperature_c": d.temperature_c,
        "power_w": d.power_w,
        "power_limit_w": d.power_limit_w,
        "pcie": d.pcie_text,
        "gpu_util": None if d.gpu_util is None else round(d.gpu_util, 3),
    }


RULE = Rule(
    kind=KIND,
    place=40,
    thresholds=Thresholds,
    measure=measure,
    decide=decide,
)
