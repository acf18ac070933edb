"""Work done, not busy time: each rank's achieved FLOP/s and MFU, and where the job's gap goes.

**Per rank** (:func:`rank_flops`): the FLOPs of one step come from the probe's count on a
sampled step (``RankView.flops``, :class:`~auditor.samples.FlopCount`: forward and backward of
every micro-batch, by the dtype each matmul ran in), never from a parameter count. FLOP/s = FLOPs
per step / the rank's step time at its pace (:meth:`Snapshot.paced`, the figure every table
shows). On a GPU, MFU (model FLOPs utilisation) is that over the device's dense peak for the
dtypes the FLOPs ran in (:mod:`.peaks`, keyed by the NVML name of the GPU the rank owns; a GPU
``k`` ranks share gives each ``1/k`` of its peak): for a mix of dtypes, the *ideal time* is
``sum(flops_d / peak_d)``, the time the step's FLOPs would take at the peaks, and MFU = ideal
time / step time. A process that drives several GPUs (DataParallel) has their peaks added. On a
CPU, or a card the table does not know, FLOP/s only.

**The job** (:func:`job_mfu`): over the ranks' whole runs where the time account knows them
(:mod:`.accounting`; basis ``run``), else over one step at each rank's pace (basis ``step``:
``auditor serve``'s windows keep no account). Each rank's wall time ``W`` (seconds) holds its
ideal time ``I`` (steps x the ideal time of one) and the gap ``W - I``, which is split into the
account's parts, every second once:

* ``startup``, ``teardown``: before the first step and after the last;
* ``data_wait`` and ``h2d``: waiting for the next batch, and copying it to the device;
* ``collective_wait``: waiting for peers in collectives, except where the peer waited for was
  itself waiting for data, stalled or started later: such a wait is booked to the peer's part
  (:func:`rebook_waits`), so a job that waits for one starved rank books its loss to data wait;
* ``stalls``: named work between the steps (checkpoint, evaluation, logging) and the gaps
  between steps;
* ``host_overhead``: the steps' time in no phase (the loop's own Python, framework bookkeeping):
  time the device has nothing queued;
* the device's own inefficiency, the compute phases' time (forward, backward, optimizer) beyond
  the ideal: ``small_batch`` where a micro-batch is too small to fill the device (its ideal time
  under :data:`FILL_S` and the compute phases below :data:`FILL_EFFICIENCY` of the peak: the
  kernels are too small to occupy the chip and launches dominate), else ``device`` (memory-bound
  and element-wise kernels, attention, what the peak never counts).

The parts, as shares of the summed wall time, add up to ``1 - mfu`` (tested). A rank whose
measured FLOPs at peak would take longer than its compute phases (FLOPs run outside them, or a
peak the card does not reach) books no device part; its other parts are scaled to the gap.

**Precision**, apart from the gap: MFU is judged at the peak of the dtype the FLOPs ran in, so
fp32 matmuls at 70% of the fp32 peak are a 70% MFU, while the card's tensor cores would run the
same FLOPs 15x faster in bf16 (H100: 67 against 989 TFLOP/s). ``JobMfu.precision`` is the share
of the wall time that moving the fp32 and TF32 FLOPs to bf16 (fp16 where the card has no bf16)
would give back, at the efficiency the compute phases reach now (:data:`PRECISION_DTYPES`);
``JobMfu.tf32`` the same for fp32 FLOPs moved to TF32 only. Neither is claimed where the batch
is too small to fill the device (launches, not arithmetic, set the time there).

Pure: the snapshot in, figures out; no words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from auditor.samples import FlopCount

from .accounting import Account
from .peaks import PEAK_DTYPES, peak_flops
from .snapshot import Snapshot
from .stats import RankStats

# FLOPs in a dtype the card has no peak for (or "other") up to this share of a step's FLOPs are
# left out of the ideal time; more, and the rank's MFU is not given (it would be a guess).
UNPEAKED_SHARE = 0.01
# A micro-batch whose FLOPs would take under this many seconds at the device's peak is too small
# to fill it: its matmuls split into fewer tiles than the chip has SMs (an H100 has 132; a 4096 x
# 4096 x 4096 bf16 matmul is ~0.14 ms at peak) and the step's hundreds of kernel launches (a few
# microseconds each) cost about as much as the arithmetic.
FILL_S = 0.005
# ... and the compute phases reach under this share of the peak: a filled device runs large
# matmuls at 60-80% of its dense peak, whole models at 30-60% (see ``rules.low_mfu``).
FILL_EFFICIENCY = 0.25
# The dtypes whose FLOPs a tensor-core card runs faster in bf16 (the precision lever).
PRECISION_DTYPES = ("fp32", "tf32")
# The parts of the gap, in the order reports list them.
GAP_PARTS = (
    "startup",
    "data_wait",
    "h2d",
    "collective_wait",
    "stalls",
    "host_overhead",
    "small_batch",
    "device",
    "teardown",
)
# The parts of the pace-setting rank that its peers' waits at the collectives are booked to
# (:func:`rebook_waits`).
WAITED_FOR = ("startup", "data_wait", "h2d", "stalls", "host_overhead")
RUN = "run"
STEP = "step"


@dataclass(frozen=True)
class RankFlops:
    """One rank's counted work: FLOPs per step (its latest count), FLOP/s at its pace, and on a
    GPU the table knows, MFU against ``peak_flops_per_s`` (the effective peak of its dtype mix:
    the counted FLOPs over their ideal time). ``dtype``: the dtype holding most FLOPs.

    Besides the contract's figures: ``step_s`` (the pace the FLOP/s is at; None: no step
    timed), ``ideal_s`` (seconds per step the FLOPs would take at the peaks), ``half_ideal_s``
    (the same with the fp32/TF32 FLOPs at the card's bf16 peak, fp16 where it has none; None
    where it has neither or there are none), ``tf32_ideal_s`` (the fp32 FLOPs at TF32, where
    the card has it and some ran in fp32), ``device`` (where the FLOPs ran: "cuda" or "cpu"),
    ``gpus`` (the UUIDs of the GPUs it owns), ``micro_batches`` and ``samples`` of the counted
    step, ``by_dtype`` its FLOPs by dtype."""

    rank: int
    flops_per_step: float
    flops_per_s: float | None
    mfu: float | None
    peak_flops_per_s: float | None
    dtype: str
    device_name: str | None
    counted_step: int
    count_cost_s: float | None
    step_s: float | None = None
    ideal_s: float | None = None
    half_ideal_s: float | None = None
    tf32_ideal_s: float | None = None
    # The 16-bit dtype ``half_ideal_s`` is at: "bf16", or "fp16" on a card without bf16 (V100,
    # T4); None with ``half_ideal_s``.
    half_dtype: str | None = None
    device: str = "cpu"
    gpus: tuple[str, ...] = ()
    micro_batches: int = 1
    samples: int | None = None
    by_dtype: Mapping[str, float] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def flops_per_sample(self) -> float | None:
        return self.flops_per_step / self.samples if self.samples else None

    @property
    def ideal_per_micro_batch_s(self) -> float | None:
        if self.ideal_s is None:
            return None
        return self.ideal_s / max(1, self.micro_batches)


def rank_flops(snapshot: Snapshot) -> dict[int, RankFlops]:
    """Every rank that counted its FLOPs (``RankView.flops``), by rank (kept per snapshot:
    shared, do not change it)."""
    return snapshot.kept(("rank_flops",), lambda: _rank_flops(snapshot))


def _rank_flops(snapshot: Snapshot) -> dict[int, RankFlops]:
    out: dict[int, RankFlops] = {}
    paced = snapshot.paced
    gpu_stats = snapshot.gpu_stats
    for view in snapshot.ranks:
        count = view.flops
        if count is None or not count.flops > 0:
            continue
        rank = view.info.rank
        stats = paced.get(rank)
        step_s = (
            stats.step_s if stats is not None and stats.steps > 0 and stats.step_s > 0 else None
        )
        gpus = tuple(u for u in snapshot.gpus_of.get(rank, ()) if u in gpu_stats)
        names = [gpu_stats[u].model for u in gpus]
        # A GPU several ranks share gives each its share of the peak.
        shares = [1.0 / max(1, len(snapshot.owners.get(u, ()))) for u in gpus]
        device = count.device or view.info.device
        out[rank] = figures(count, step_s, names, device=device, gpus=gpus, shares=shares)
    return out


def figures(
    count: FlopCount,
    step_s: float | None,
    device_names: Sequence[str],
    *,
    device: str = "cuda",
    gpus: tuple[str, ...] = (),
    shares: Sequence[float] | None = None,
) -> RankFlops:
    """One rank's figures from its count, its step time and the NVML names of its GPUs (one
    per GPU its process drives; their peaks add up), each counted at ``shares`` of its peak (a
    GPU ``k`` ranks share: ``1/k`` each; all of it by default)."""
    by_dtype = {d: float(v) for d, v in count.by_dtype.items() if v > 0} or {"other": count.flops}
    dtype = max(by_dtype, key=lambda d: (by_dtype[d], d))
    on_gpu = device.startswith("cuda") and bool(device_names)
    name = device_names[0] if on_gpu else None
    flops_per_s = count.flops / step_s if step_s else None
    ideal = half = tf32 = None
    half_dtype: str | None = None
    peaks = _summed_peaks(device_names, shares) if on_gpu else {}
    if peaks:
        ideal = _ideal(by_dtype, peaks, count.flops)
        if ideal is not None:
            best16 = peaks.get("bf16") or peaks.get("fp16")
            moved = {d: v for d, v in by_dtype.items() if d in PRECISION_DTYPES and d in peaks}
            if best16 and moved:
                half = ideal - sum(v / peaks[d] for d, v in moved.items())
                half += sum(moved.values()) / best16
                half_dtype = "bf16" if "bf16" in peaks else "fp16"
            if by_dtype.get("fp32") and peaks.get("tf32") and "fp32" in peaks:
                tf32 = ideal - by_dtype["fp32"] / peaks["fp32"] + by_dtype["fp32"] / peaks["tf32"]
    # The effective peak of the mix: the FLOPs the ideal time counts, over it.
    peak = sum(v for d, v in by_dtype.items() if d in peaks) / ideal if ideal else None
    return RankFlops(
        rank=count.rank,
        flops_per_step=count.flops,
        flops_per_s=flops_per_s,
        mfu=ideal / step_s if ideal is not None and step_s else None,
        peak_flops_per_s=peak,
        dtype=dtype,
        device_name=name,
        counted_step=count.step,
        count_cost_s=count.cost_s,
        step_s=step_s,
        ideal_s=ideal,
        half_ideal_s=half,
        tf32_ideal_s=tf32,
        half_dtype=half_dtype,
        device="cuda" if device.startswith("cuda") else "cpu",
        gpus=tuple(gpus),
        micro_batches=max(1, count.micro_batches),
        samples=count.samples,
        by_dtype=by_dtype,
    )


def _summed_peaks(names: Sequence[str], shares: Sequence[float] | None) -> dict[str, float]:
    """Per dtype, the peaks of every GPU (times its share) added up; a dtype one of them lacks
    is left out."""
    weights = list(shares) if shares is not None else [1.0] * len(names)
    out: dict[str, float] = {}
    for dtype in PEAK_DTYPES:
        values = [peak_flops(n, dtype) for n in names]
        if values and all(v is not None for v in values):
            out[dtype] = sum(v * w for v, w in zip(values, weights, strict=True) if v is not None)
    return out


def _ideal(by_dtype: Mapping[str, float], peaks: Mapping[str, float], total: float) -> float | None:
    """Seconds the FLOPs take at the peaks; None where more than :data:`UNPEAKED_SHARE` of them
    ran in a dtype without one, or none has one (an unknown card)."""
    if not peaks:
        return None
    unpeaked = sum(v for d, v in by_dtype.items() if d not in peaks)
    if unpeaked > UNPEAKED_SHARE * total:
        return None
    ideal = sum(v / peaks[d] for d, v in by_dtype.items() if d in peaks)
    return ideal if ideal > 0 else None


@dataclass(frozen=True)
class JobMfu:
    """The job's achieved work: ``flops_per_s`` (every counted rank's FLOP/s added up, over the
    basis' time) and on GPUs the table knows ``mfu`` (the ranks' ideal time over their wall
    time, summed) and ``gap``: part (:data:`GAP_PARTS`) -> share of the wall time, adding up to
    ``1 - mfu`` (parts at zero left out).

    Besides the contract's figures: ``basis`` (:data:`RUN` or :data:`STEP`), ``ranks`` (the
    ranks counted; those with an MFU where it is given), ``precision`` and ``tf32`` (shares of
    the wall time that bf16, or TF32 alone, would give back: see the module's docstring),
    ``device_name`` and ``dtype`` (the most common among the ranks), ``gpu``: whether the
    counted ranks ran on GPUs, ``small_batch_ranks``: the ranks whose micro-batch is too small
    to fill their device."""

    flops_per_s: float | None
    mfu: float | None
    gap: dict[str, float]
    basis: str = STEP
    ranks: tuple[int, ...] = ()
    precision: float = 0.0
    tf32: float = 0.0
    device_name: str | None = None
    dtype: str | None = None
    gpu: bool = False
    small_batch_ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Time:
    """One rank's wall time over the basis and its parts (seconds)."""

    wall_s: float
    steps: float
    parts: dict[str, float]
    compute_s: float


def job_mfu(
    snapshot: Snapshot,
    *,
    flops: Mapping[int, RankFlops] | None = None,
    fill_s: float = FILL_S,
    fill_efficiency: float = FILL_EFFICIENCY,
) -> JobMfu | None:
    """The job's FLOP/s, MFU and the gap's split (see the module's docstring); None where no
    rank counted its FLOPs. ``flops``: :func:`rank_flops` of the snapshot where already made."""
    counted = rank_flops(snapshot) if flops is None else flops
    if not counted:
        return None
    paced = snapshot.paced
    accounts = snapshot.accounts
    basis = RUN if all(_usable(accounts.get(r)) for r in counted) else STEP
    times: dict[int, _Time] = {}
    for r in counted:
        t = _run_time(accounts[r]) if basis == RUN else _step_time(paced.get(r))
        if t is not None:
            times[r] = t
    per_s = [
        rf.flops_per_step * times[r].steps / times[r].wall_s
        for r, rf in counted.items()
        if r in times
    ]
    flops_per_s = sum(per_s) if per_s else None
    gpu = any(rf.on_gpu for rf in counted.values())
    names = [rf.device_name for rf in counted.values() if rf.device_name]
    dtypes = [rf.dtype for rf in counted.values()]
    # The most common (ties: the first in name order, whatever order the ranks came in).
    device_name = max(sorted(set(names)), key=names.count) if names else None
    dtype = max(sorted(set(dtypes)), key=dtypes.count) if dtypes else None
    judged = {r: rf for r, rf in counted.items() if rf.ideal_s is not None and r in times}
    if not gpu or not judged:
        return JobMfu(
            flops_per_s,
            None,
            {},
            basis,
            tuple(sorted(counted)),
            gpu=gpu,
            device_name=device_name,
            dtype=dtype,
        )
    wall = ideal = precision = tf32 = 0.0
    gap: dict[str, float] = dict.fromkeys(GAP_PARTS, 0.0)
    small: list[int] = []
    booked = rebook_waits({r: times[r] for r in judged})
    for r, rf in sorted(judged.items()):
        t = times[r]
        assert rf.ideal_s is not None
        i = rf.ideal_s * t.steps
        wall += t.wall_s
        ideal += i
        device = t.compute_s - i
        too_small = (
            (rf.ideal_per_micro_batch_s or 0.0) < fill_s
            and t.compute_s > 0
            and i < fill_efficiency * t.compute_s
        )
        if too_small:
            small.append(r)
        parts = dict(booked[r])
        if device >= 0:
            parts["small_batch" if too_small else "device"] = device
        else:
            # The FLOPs at peak take longer than the compute phases: no device part, and the
            # other parts scaled to what is left of the wall time.
            rest = sum(parts.values())
            scale = max(0.0, t.wall_s - i) / rest if rest > 0 else 0.0
            parts = {k: v * scale for k, v in parts.items()}
        for k, v in parts.items():
            gap[k] += v
        if not too_small and i > 0 and t.compute_s > 0:
            # At the compute phases' present efficiency: the FLOPs take compute/ideal times
            # their ideal time, in whatever dtype they run.
            slow = t.compute_s / i
            if rf.half_ideal_s is not None:
                precision += (rf.ideal_s - rf.half_ideal_s) * t.steps * slow
            if rf.tf32_ideal_s is not None:
                tf32 += (rf.ideal_s - rf.tf32_ideal_s) * t.steps * slow
    if wall <= 0:
        return None
    return JobMfu(
        flops_per_s=flops_per_s,
        mfu=ideal / wall,
        gap={k: v / wall for k, v in gap.items() if v > 0},
        basis=basis,
        ranks=tuple(sorted(judged)),
        precision=max(0.0, precision / wall),
        tf32=max(0.0, tf32 / wall),
        device_name=device_name,
        dtype=dtype,
        gpu=True,
        small_batch_ranks=tuple(small),
    )


def rebook_waits(times: Mapping[int, _Time]) -> dict[int, dict[str, float]]:
    """Each rank's parts with its wait at the collectives booked to what its peers did
    meanwhile: the rank that sets the pace (the least collective wait per step) spent longer
    per step than the waiting rank on some of :data:`WAITED_FOR` (waiting for data, a
    checkpoint, its own Python, a later start), and the waiting rank's wait is that excess
    (up to the whole wait, shared in proportion). A wait for a peer's longer compute stays a
    collective wait (a straggler: the rank rules name it), as does the collectives' own time."""
    out = {r: dict(t.parts) for r, t in times.items()}
    if len(times) < 2:
        return out
    per = {r: {k: v / t.steps for k, v in t.parts.items()} for r, t in times.items() if t.steps}
    if len(per) < 2:
        return out
    pace = min(per, key=lambda r: (per[r].get("collective_wait", 0.0), r))
    for r, parts in out.items():
        wait = parts.get("collective_wait", 0.0)
        if r == pace or r not in per or wait <= 0:
            continue
        excess = {
            k: max(0.0, per[pace].get(k, 0.0) - per[r].get(k, 0.0)) * times[r].steps
            for k in WAITED_FOR
        }
        total = sum(excess.values())
        if total <= 0:
            continue
        moved = min(wait, total)
        for k, v in excess.items():
            parts[k] = parts.get(k, 0.0) + moved * v / total
        parts["collective_wait"] = wait - moved
    return out


def _usable(a: Account | None) -> bool:
    return a is not None and a.steps > 0 and a.wall_s > 0


def _run_time(a: Account) -> _Time:
    """A rank's whole run as the account books it."""
    parts = {
        "startup": a.startup_s,
        "data_wait": a.data_wait_s,
        "h2d": a.h2d_s,
        "collective_wait": a.collective_wait_s,
        "stalls": sum(a.outside.values()) + a.gaps_s,
        "host_overhead": a.other_s,
        "teardown": a.teardown_s,
    }
    compute = a.forward_s + a.backward_s + a.optimizer_s
    # The account's parts add up to its booked time; the wall time is what MFU is over.
    return _Time(a.booked_s, float(a.steps), parts, compute)


def _step_time(s: RankStats | None) -> _Time | None:
    """One step at the rank's pace (no account: serve's windows)."""
    if s is None or s.steps <= 0 or s.step_s <= 0:
        return None
    wait = s.collective_wait_s or 0.0
    compute = s.forward_s + s.backward_s + s.optimizer_s
    other = max(0.0, s.step_s - s.data_wait_s - s.h2d_s - wait - compute)
    parts = {
        "data_wait": s.data_wait_s,
        "h2d": s.h2d_s,
        "collective_wait": wait,
        "host_overhead": other,
    }
    # Medians need not add up to the step: the wall time is the parts' sum.
    return _Time(sum(parts.values()) + compute, 1.0, parts, compute)
