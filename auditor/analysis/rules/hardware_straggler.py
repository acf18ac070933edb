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

Predicted speed-up: the barrier model (:mod:`auditor.analysis.advisor`) with the blamed ranks at
their peers' median local time, i.e. the GPU brought back to its peers' speed; not predicted
(None, said in the evidence) where the waits were not measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from ..advisor import fmt_ms, predicted_speedup
from ..devices import DeviceStats
from ..findings import Finding, severity_for
from ..measures import PeerMedians, measured_gpus, peer_median, ranks_text, with_expectation
from ..snapshot import Snapshot
from ..stats import RankStats

_THERMAL = ("sw_thermal_slowdown", "hw_thermal_slowdown")
_POWER = ("sw_power_cap", "hw_power_brake_slowdown")


def detect(
    snapshot: Snapshot,
    *,
    min_steps: int = 8,
    min_samples: int = 5,
    min_throttle_share: float = 0.5,
    max_clock_ratio: float = 0.85,
    min_excess: float = 1.10,
    min_gap_ratio: float = 0.05,
) -> list[Finding]:
    """Find ranks whose GPU is slower than its peers' and holds the job back.

    Args:
        min_steps: steps a rank needs in the window before it is judged.
        min_samples: NVML samples a GPU needs in the window before it is judged.
        min_throttle_share: share of samples with a throttle reason (not gpu_idle) that counts.
        max_clock_ratio: SM clock ratio relative to the peers' median that counts as low.
        min_excess: the rank's compute per sample relative to its peers' median.
        min_gap_ratio: its wait must be this share of the step below its peers' median wait.
    """
    stats = snapshot.ready(min_steps)
    if len(stats) < 2:
        return []
    dstats = measured_gpus(snapshot, min_samples)
    gpus_of = snapshot.gpus_of
    modes = {v.info.rank: v.info.parallel_mode for v in snapshot.ranks}
    gpu: dict[int, DeviceStats] = {}
    for r in stats:
        mine = gpus_of.get(r, ())
        if modes.get(r) == "dataparallel" or len(mine) != 1 or mine[0] not in dstats:
            continue
        gpu[r] = dstats[mine[0]]
    if len(gpu) < 2:
        return []

    waits = {r: s.collective_wait_s for r, s in stats.items() if s.collective_wait_s is not None}
    per_sample = {r: _per_sample(s, outside_barrier=len(waits) < 2) for r, s in stats.items()}
    step = statistics.median(s.step_s for s in stats.values())

    blamed: dict[int, list[str]] = {}
    # Peer figures for every rank at once: a per-rank list of peers is quadratic in ranks.
    share_of_peers = PeerMedians({q: g.throttle_share for q, g in gpu.items()})
    clock_of_peers = PeerMedians({q: g.sm_clock_ratio for q, g in gpu.items()})
    best_links = sorted(((_link(g), q) for q, g in gpu.items()), reverse=True)[:2]
    for r, d in gpu.items():
        reasons = _hardware_reasons(
            d,
            peer_share=share_of_peers.get(r),
            peer_clock=clock_of_peers.get(r),
            peer_link=next((link for link, q in best_links if q != r), (0, 0)),
            min_share=min_throttle_share,
            max_clock_ratio=max_clock_ratio,
        )
        if not reasons:
            continue
        if not _waited_for(r, per_sample, waits, step, min_excess, min_gap_ratio):
            continue
        blamed[r] = reasons
    if not blamed:
        return []

    local = {r: s.local_s for r, s in stats.items()}
    clean = {q: v for q, v in local.items() if q not in blamed}
    new_local = {r: v for r in blamed if (v := peer_median(clean, r)) is not None}
    # Without measured waits every rank's local time includes the barrier: no model to apply.
    measured = len(waits) >= 2
    speedup = predicted_speedup(stats, new_local) if new_local and measured else None
    peer_limit = statistics.median(
        [g.power_limit_w for q, g in gpu.items() if q not in blamed and g.power_limit_w] or [0.0]
    )

    fixes: dict[int, str] = {}
    per_rank: dict[str, Any] = {}
    for r in sorted(blamed):
        d = gpu[r]
        s = stats[r]
        peer_cps = peer_median({q: v for q, v in per_sample.items() if q not in blamed}, r)
        fix = _fix(d, blamed[r], peer_limit)
        alt = f"or move rank {r} off {d.label} ({d.uuid})"
        if s.batch_size and peer_cps:
            share = max(1, int(s.batch_size * peer_cps / per_sample[r]))
            if share < s.batch_size:
                alt += (
                    ", or give it a smaller batch share: "
                    f"batch_size {round(s.batch_size)} -> {share}"
                )
        fixes[r] = with_expectation(f"{fix}; {alt}", speedup)
        per_rank[str(r)] = {
            "gpu": d.ref,
            "reasons": blamed[r],
            "compute_per_sample_ratio": None
            if not peer_cps
            else round(per_sample[r] / peer_cps, 2),
            "compute_ms": round(s.compute_s * 1e3, 1),
            "collective_wait_ms": None
            if s.collective_wait_s is None
            else round(s.collective_wait_s * 1e3, 1),
        }
    evidence = {
        "gpus": [gpu[r].ref for r in sorted(blamed)],
        "per_rank": per_rank,
        "per_gpu": {
            g.uuid: {**g.ref, "rank": q, **_gpu_numbers(g)} for q, g in sorted(gpu.items())
        },
        "collective_wait_ms": {str(r): round(w * 1e3, 1) for r, w in sorted(waits.items())},
        "local_ms": {str(r): round(v * 1e3, 1) for r, v in sorted(local.items())},
        "speedup_model": "barrier model: the blamed ranks at their peers' median local time"
        if measured
        else "not predicted: the collective wait was not measured, so local times are unknown",
    }
    first = min(blamed)
    summary = (
        f"{ranks_text(blamed)} {'runs' if len(blamed) == 1 else 'run'} on a slow GPU "
        f"({gpu[first].label}: {', '.join(blamed[first])}); the others wait for "
        f"{'it' if len(blamed) == 1 else 'them'} at the all-reduce "
        f"(compute {fmt_ms(stats[first].compute_s)})"
    )
    return [
        Finding(
            kind="hardware_straggler",
            severity=severity_for(speedup),
            ranks=tuple(sorted(blamed)),
            summary=summary,
            evidence=evidence,
            fixes=fixes,
            predicted_speedup=speedup,
        )
    ]


def _per_sample(s: RankStats, *, outside_barrier: bool) -> float:
    """Compute per sample; only the phases outside the all-reduce where waits are unknown."""
    work = s.h2d_s + s.forward_s + s.optimizer_s if outside_barrier else s.compute_s
    return work / s.batch_size if s.batch_size else work


def _hardware_reasons(
    d: DeviceStats,
    *,
    peer_share: float | None,
    peer_clock: float | None,
    peer_link: tuple[int, int],
    min_share: float,
    max_clock_ratio: float,
) -> list[str]:
    """What makes GPU ``d`` slower than its peers (their median throttle share and clock ratio,
    their best PCIe link), in words; empty when nothing does."""
    out: list[str] = []
    if (
        d.throttle_share is not None
        and d.throttle_share >= min_share
        and (peer_share is None or peer_share < min_share)
    ):
        out.append(
            f"throttled ({', '.join(d.throttle_reasons)}) in {d.throttle_share:.0%} of samples"
        )
    if (
        d.sm_clock_ratio is not None
        and peer_clock
        and d.sm_clock_ratio <= max_clock_ratio * peer_clock
    ):
        mhz = "" if d.sm_clock_mhz is None else f" ({d.sm_clock_mhz:.0f} MHz)"
        out.append(
            f"SM clock at {d.sm_clock_ratio:.0%} of its maximum{mhz} against "
            f"{peer_clock:.0%} on its peers"
        )
    if d.pcie_degraded and _link(d) < peer_link:
        out.append(f"PCIe link at {d.pcie_text} (current/max)")
    return out


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


def _fix(d: DeviceStats, reasons: list[str], peer_limit: float) -> str:
    thermal = any(r in d.throttle_reasons for r in _THERMAL)
    power = any(r in d.throttle_reasons for r in _POWER)
    parts: list[str] = []
    if thermal:
        temp = "" if d.temperature_c is None else f" at {d.temperature_c:.0f} C"
        parts.append(
            f"{d.label} slows down for heat{temp}: check its cooling (fans, airflow, blanking "
            "panels) and reseat it"
        )
    if power:
        if d.power_limit_w and peer_limit and d.power_limit_w < 0.95 * peer_limit:
            parts.append(
                f"{d.label}'s power limit is {d.power_limit_w:.0f} W against {peer_limit:.0f} W "
                f"on its peers: `nvidia-smi -i {d.index} -pl {peer_limit:.0f}` on {d.node}"
            )
        else:
            parts.append(f"{d.label} hits its power cap: check its power supply and cabling")
    if "hw_slowdown" in d.throttle_reasons and not (thermal or power):
        parts.append(
            f"{d.label} reports HW slowdown (power brake or overheating): check its power "
            "cabling and cooling, and reseat it"
        )
    if not parts and any(r.startswith("SM clock") for r in reasons):
        parts.append(
            f"{d.label} runs low clocks without a throttle reason: reset locked clocks with "
            f"`nvidia-smi -i {d.index} -rgc` on {d.node} and check application clocks"
        )
    if d.pcie_degraded:
        parts.append(
            f"{d.label}'s PCIe link is {d.pcie_text}: reseat the card, check the riser and the "
            "slot's link setting in the BIOS"
        )
    if not parts:
        parts.append(f"{d.label} is slower than its peers ({'; '.join(reasons)})")
    return "; ".join(parts)


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
