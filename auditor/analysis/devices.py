"""Per-GPU figures and GPU ownership, computed once from a snapshot; device-aware rules decide.

Two questions every device-aware rule asks first:

* *Whose GPU is it?* :func:`gpu_owners` maps each GPU (by NVML UUID) to the ranks on it. The
  rank's own word comes first (``RankInfo.device_uuids``, which the probe reads from CUDA); where
  a rank did not say, NVML's process list decides: a GPU that lists the rank's PID on the rank's
  host belongs to it. A DataParallel process owns every GPU it appears on; a DDP rank (one GPU)
  that also appears on other GPUs owns only the one where it holds most memory (on a tie, the one
  whose NVML index is the rank's device index), and its other appearances are *stray contexts*
  (:func:`stray_ranks`), typically the classic "every rank also creates a context on GPU 0".
  PIDs are compared only on the same host: two nodes can reuse a PID. Inside a container NVML
  may report host PIDs the rank cannot see; those GPUs then stay unowned, never guessed.
* *How did it behave over the window?* :func:`device_stats` reduces the samples of each GPU to
  medians (one descheduled read must not move a verdict), a memory trend (least-squares slope of
  used bytes over time) and shares (how often a throttle reason was active).

Conventions as in :mod:`auditor.samples`: bytes, ratios 0..1, ``None`` for "not measured", never
zero. A GPU that fell off the bus (``lost``) keeps ``lost=True`` and its figures come only from
the samples read before it was lost: it must never read as an idle GPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from auditor.samples import DeviceSample, GpuProcess, RankInfo

GIB = 1024**3
# Throttle (clock-event) reasons that say nothing about the GPU's health: an idle GPU lowers its
# clocks by design.
IDLE_REASONS = frozenset({"gpu_idle"})


@dataclass(frozen=True)
class DeviceStats:
    """One GPU's robust figures over a window (medians unless named otherwise)."""

    uuid: str
    node: str
    index: int
    model: str
    # Samples read while the GPU was on the bus.
    samples: int
    # The GPU fell off the bus at some point in the window.
    lost: bool
    span_s: float
    gpu_util: float | None
    mem_used_bytes: float | None
    mem_used_max_bytes: int | None
    mem_total_bytes: int | None
    # Median used / total.
    mem_ratio: float | None
    # Least-squares slope of used bytes over time (bytes per second); None under 2 samples.
    mem_trend_bytes_per_s: float | None
    # The same over the later half of the window: still rising, or a plateau after warm-up?
    mem_recent_trend_bytes_per_s: float | None
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    # Median of sm_clock / sm_clock_max per sample.
    sm_clock_ratio: float | None
    # Share of samples (where reasons were readable) with any reason other than gpu_idle.
    throttle_share: float | None
    # Those reasons, most frequent first.
    throttle_reasons: tuple[str, ...]
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    # The best link seen in the window: an idle link trains down to save power and back up
    # under load, so only a link that never reached its maximum is degraded.
    pcie_gen: int | None
    pcie_gen_max: int | None
    pcie_width: int | None
    pcie_width_max: int | None
    # Most processes seen at once, and every process seen (largest memory figure per PID).
    process_count: int
    processes: tuple[GpuProcess, ...]

    @property
    def label(self) -> str:
        return gpu_label(self.node, self.index)

    @property
    def ref(self) -> dict[str, Any]:
        """How findings name this GPU in their evidence."""
        return {"uuid": self.uuid, "node": self.node, "index": self.index, "model": self.model}

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes)

    @property
    def mem_rise_bytes(self) -> float | None:
        """Fitted growth of used memory over the window."""
        if self.mem_trend_bytes_per_s is None:
            return None
        return self.mem_trend_bytes_per_s * self.span_s

    @property
    def mem_ratio_max(self) -> float | None:
        if self.mem_used_max_bytes is None or not self.mem_total_bytes:
            return None
        return self.mem_used_max_bytes / self.mem_total_bytes

    @property
    def pcie_degraded(self) -> bool | None:
        """True when the link never reached its maximum generation or width in the window."""
        known = False
        links = ((self.pcie_gen, self.pcie_gen_max), (self.pcie_width, self.pcie_width_max))
        for cur, top in links:
            if cur is None or top is None:
                continue
            known = True
            if cur < top:
                return True
        return False if known else None

    @property
    def pcie_text(self) -> str:
        def part(prefix: str, cur: int | None, top: int | None) -> str:
            return f"{prefix}{'?' if cur is None else cur}/{'?' if top is None else top}"

        return (
            f"{part('gen ', self.pcie_gen, self.pcie_gen_max)} "
            f"{part('x', self.pcie_width, self.pcie_width_max)}"
        )


def gpu_label(node: str, index: int) -> str:
    return f"{node or 'node'} GPU {index}"


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float] | None:
    """Least squares ``y = a + b x``: ``(a, b, r2)``, or None without two distinct ``x``.

    Centred sums keep the arithmetic exact enough for epoch-second times and byte counts.
    ``r2`` is 1.0 where ``y`` does not vary at all (the line explains everything there is).
    """
    n = len(xs)
    if n < 2 or n != len(ys):
        return None
    mx = statistics.fmean(xs)
    my = statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    b = sxy / sxx
    a = my - b * mx
    syy = sum((y - my) ** 2 for y in ys)
    r2 = 1.0 if syy <= 0 else max(0.0, min(1.0, (sxy * sxy) / (sxx * syy)))
    return a, b, r2


class Reduced(Protocol):
    """What the snapshot-taking helpers below read: a snapshot's figures, reduced once
    (:class:`auditor.analysis.snapshot.Snapshot`; a protocol so this module imports no snapshot)."""

    @property
    def gpu_stats(self) -> Mapping[str, DeviceStats]: ...

    @property
    def owners(self) -> Mapping[str, tuple[int, ...]]: ...

    @property
    def strays(self) -> Mapping[str, Mapping[int, int | None]]: ...


def device_stats(snapshot: Reduced) -> Mapping[str, DeviceStats]:
    """Per-GPU figures over the snapshot's window, keyed by UUID (the snapshot's, computed once)."""
    return snapshot.gpu_stats


def reduce_devices(
    samples: Iterable[DeviceSample], given: Iterable[DeviceStats] = ()
) -> dict[str, DeviceStats]:
    """Per-GPU figures keyed by UUID: ``given`` (already reduced, e.g. by Prometheus) and the
    reduction of ``samples`` (a GPU with samples takes their figures)."""
    by_uuid: dict[str, list[DeviceSample]] = {}
    for d in samples:
        by_uuid.setdefault(d.uuid, []).append(d)
    out = {g.uuid: g for g in given}
    out.update(
        {uuid: _one_device(sorted(ds, key=lambda d: d.time)) for uuid, ds in by_uuid.items()}
    )
    return out


def _median(values: Iterable[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def _max_int(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    fit = linear_fit([t for t, _ in points], [m for _, m in points])
    return None if fit is None else fit[1]


def _one_device(samples: list[DeviceSample]) -> DeviceStats:
    last = samples[-1]
    live = [s for s in samples if not s.lost]
    lost = len(live) < len(samples)
    span = live[-1].time - live[0].time if live else 0.0

    mem_points = [(s.time, float(s.mem_used_bytes)) for s in live if s.mem_used_bytes is not None]
    trend = _slope(mem_points)
    middle = (live[0].time + live[-1].time) / 2 if live else 0.0
    recent = _slope([p for p in mem_points if p[0] >= middle])
    ratios = [
        s.mem_used_bytes / s.mem_total_bytes
        for s in live
        if s.mem_used_bytes is not None and s.mem_total_bytes
    ]
    clock_ratios = [
        s.sm_clock_mhz / s.sm_clock_max_mhz
        for s in live
        if s.sm_clock_mhz is not None and s.sm_clock_max_mhz
    ]

    readable = [s.throttle_reasons for s in live if s.throttle_reasons is not None]
    counts: dict[str, int] = {}
    active = 0
    for reasons in readable:
        real = [r for r in reasons if r not in IDLE_REASONS]
        if real:
            active += 1
        for r in real:
            counts[r] = counts.get(r, 0) + 1
    ordered = tuple(sorted(counts, key=lambda r: (-counts[r], r)))

    procs: dict[int, int | None] = {}
    for s in live:
        for p in s.processes:
            prev = procs.get(p.pid)
            if p.pid not in procs or (
                p.used_bytes is not None and (prev is None or p.used_bytes > prev)
            ):
                procs[p.pid] = p.used_bytes

    return DeviceStats(
        uuid=last.uuid,
        node=last.node,
        index=last.index,
        model=next((s.model for s in reversed(samples) if s.model), ""),
        samples=len(live),
        lost=lost,
        span_s=span,
        gpu_util=_median(s.gpu_util for s in live),
        mem_used_bytes=_median(m for _, m in mem_points),
        mem_used_max_bytes=_max_int(s.mem_used_bytes for s in live),
        mem_total_bytes=_max_int(s.mem_total_bytes for s in live),
        mem_ratio=_median(ratios),
        mem_trend_bytes_per_s=trend,
        mem_recent_trend_bytes_per_s=recent,
        sm_clock_mhz=_median(s.sm_clock_mhz for s in live),
        sm_clock_max_mhz=_median(s.sm_clock_max_mhz for s in live),
        sm_clock_ratio=_median(clock_ratios),
        throttle_share=active / len(readable) if readable else None,
        throttle_reasons=ordered,
        temperature_c=_median(s.temperature_c for s in live),
        power_w=_median(s.power_w for s in live),
        power_limit_w=_median(s.power_limit_w for s in live),
        pcie_gen=_max_int(s.pcie_gen for s in live),
        pcie_gen_max=_max_int(s.pcie_gen_max for s in live),
        pcie_width=_max_int(s.pcie_width for s in live),
        pcie_width_max=_max_int(s.pcie_width_max for s in live),
        process_count=max((len(s.processes) for s in live), default=0),
        processes=tuple(GpuProcess(pid=pid, used_bytes=b) for pid, b in sorted(procs.items())),
    )


def gpu_owners(snapshot: Reduced) -> Mapping[str, tuple[int, ...]]:
    """Every GPU (by UUID) mapped to the ranks on it (the snapshot's, computed once)."""
    return snapshot.owners


def owners_of(
    infos: Sequence[RankInfo], samples: Sequence[DeviceSample], gpus: Iterable[DeviceStats] = ()
) -> dict[str, tuple[int, ...]]:
    """Every GPU (by UUID) mapped to the ranks on it; ``()`` for a GPU no rank owns.

    GPUs come from the device samples, the reduced ``gpus`` and the ranks' own ``device_uuids``
    (a rank may name a GPU that was never sampled).
    """
    gpus = tuple(gpus)
    owners: dict[str, set[int]] = {g.uuid: set() for g in gpus}
    owners.update({d.uuid: set() for d in samples})
    for info in infos:
        for uuid in info.device_uuids:
            owners.setdefault(uuid, set()).add(info.rank)
    unsaid = [i for i in infos if not i.device_uuids]
    if unsaid and samples:
        index = {g.uuid: g.index for g in gpus}
        index.update({d.uuid: d.index for d in samples})
        by_rank = {i.rank: i for i in unsaid}
        for rank, sightings in _pid_sightings(samples, unsaid).items():
            for uuid in _owned_by_pid(by_rank[rank], sightings, index):
                owners[uuid].add(rank)
    # (Most GPUs have one owner: no sort to make.)
    return {uuid: tuple(rs) if len(rs) < 2 else tuple(sorted(rs)) for uuid, rs in owners.items()}


def rank_gpus(owners: Mapping[str, Sequence[int]]) -> dict[int, tuple[str, ...]]:
    """The inverse of :func:`gpu_owners`: each rank's GPUs (UUIDs, in the order found)."""
    out: dict[int, list[str]] = {}
    for uuid, ranks in owners.items():
        for r in ranks:
            out.setdefault(r, []).append(uuid)
    return {r: tuple(us) for r, us in out.items()}


def stray_ranks(snapshot: Reduced) -> Mapping[str, Mapping[int, int | None]]:
    """Ranks with a process on a GPU they do not own (the snapshot's, computed once)."""
    return snapshot.strays


def strays_of(
    infos: Sequence[RankInfo],
    samples: Sequence[DeviceSample],
    owners: Mapping[str, Sequence[int]],
) -> dict[str, dict[int, int | None]]:
    """Ranks with a process on a GPU they do not own: ``{uuid: {rank: bytes held or None}}``.

    Typically a rank that touched ``cuda:0`` before ``torch.cuda.set_device`` (a context, or
    ``torch.load`` without ``map_location``), so the rank-0 GPU carries every rank's leftovers.
    """
    out: dict[str, dict[int, int | None]] = {}
    if not samples:
        return out
    for rank, sightings in _pid_sightings(samples, [i for i in infos if i.pid]).items():
        for uuid, used in sightings.items():
            if rank not in owners.get(uuid, ()):
                out.setdefault(uuid, {})[rank] = used
    return out


def _pid_sightings(
    samples: Sequence[DeviceSample], infos: Sequence[RankInfo]
) -> dict[int, dict[str, int | None]]:
    """For each rank, the GPUs listing its PID on its host, with the most memory it held there."""
    nodes = {d.node for d in samples}
    by_key: dict[tuple[str, int], RankInfo] = {}
    for info in infos:
        if not info.pid:
            continue
        # A rank that did not report its host can still be matched when only one node was sampled.
        host = info.host if info.host or len(nodes) != 1 else next(iter(nodes))
        by_key[(host, info.pid)] = info
    out: dict[int, dict[str, int | None]] = {}
    for d in samples:
        for p in d.processes:
            found = by_key.get((d.node, p.pid))
            if found is None:
                continue
            per_gpu = out.setdefault(found.rank, {})
            prev = per_gpu.get(d.uuid)
            if d.uuid not in per_gpu or (
                p.used_bytes is not None and (prev is None or p.used_bytes > prev)
            ):
                per_gpu[d.uuid] = p.used_bytes
    return out


def _owned_by_pid(
    info: RankInfo, sightings: Mapping[str, int | None], index: Mapping[str, int]
) -> tuple[str, ...]:
    """The GPUs a rank owns among those listing its PID."""
    if info.parallel_mode == "dataparallel" or len(sightings) <= 1:
        return tuple(sightings)
    # A one-GPU rank seen on several GPUs: its own is the one it holds most memory on; the
    # others are stray contexts. Unknown amounts (None) rank below any known amount.
    own_index = info.devices[0] if info.devices else info.local_rank

    def key(uuid: str) -> tuple[int, bool, str]:
        used = sightings[uuid]
        return (-1 if used is None else used, index.get(uuid) == own_index, uuid)

    return (max(sightings, key=key),)
