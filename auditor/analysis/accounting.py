"""Where every second of a rank's run went: the account of its whole wall time.

A rank's run, from its process start to its end, is booked once, in parts that never overlap:

* ``startup``: from the process start (``RankInfo.started_at``) to its first step (imports,
  set-up, model build, rendezvous);
* the steps, each split by the probe into its exclusive phases (data wait, h2d, forward,
  backward, optimizer, collective wait) and the rest of the step, ``other_s``, itself split into
  named work outside the phases (``StepSample.outside``: checkpoint, evaluation, ...) and what is
  left unnamed;
* ``gaps``: time between reported steps that no step covers (none on the probe's host clock,
  where each step starts where the last ended);
* ``teardown``: from the last step's end to the process end (``RankInfo.ended_at``).

A GPU's memory held outside the steps belongs here too: a rank that holds memory on its GPU
while it starts up (CUDA context, the model loaded, the rendezvous) or after its last step is
starting up or ending, not idle. :func:`with_gpu_memory` notes the most its process held
(``startup_gpu_bytes``, ``teardown_gpu_bytes``), which the report says beside those parts; the
GPU rules judge a GPU only over the time its owners trained.

The steps of the whole run are summed as they arrive (:class:`RunTotals`, O(1) per step in the
sample store), not only the window's: the window keeps the latest steps, the account every one.
The parts add up to the wall time (``end - start``) by construction, except where the steps'
own figures disagree with the wall clock (steps timed on a device timeline): ``booked_s`` then
differs from ``wall_s`` by that much, which the tests bound.

The losses (:func:`largest_loss`) are what a rank spent not training: waiting for data, waiting
for its peers, named work on one rank while the others wait, start-up and teardown. A rank's
wait for peers is explained by a peer's own work when that work is at least half the wait: the
cause, not the symptom, is the largest loss then. A loss every rank shares alike (start-up) is
the job's, not one rank's (``Loss.alike``).

Facts and codes only: the words are in ``auditor.report``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeGuard

from auditor.samples import DeviceSample, RankInfo, StepSample

# The named work the probe books outside the phases (``StepSample.outside``), in the order
# reports list it; any other name follows these.
OUTSIDE_NAMES = ("checkpoint", "evaluation", "logging", "loader_start")
# The phases of a step as the account names them (``StepSample`` fields without ``_s``).
STEP_PARTS = ("data_wait", "h2d", "forward", "backward", "optimizer", "collective_wait")
# Ranks whose loss of one kind is at least this share of the largest rank's lost it alike (every
# rank's start-up): the loss is then the job's, not one rank's.
ALIKE_SHARE = 0.9
# A peer's named work explains a rank's wait at the collectives when it is at least this share of
# the wait (the peers waited for that work).
EXPLAINS_SHARE = 0.5


@dataclass
class RunTotals:
    """One rank's steps summed over the whole run (mutable: the sample store adds each step)."""

    steps: int = 0
    step_s: float = 0.0
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    collective_wait_s: float = 0.0
    outside: dict[str, float] = field(default_factory=dict)
    # Wall clock: the first step's start and the last step's end.
    first_start: float | None = None
    last_end: float | None = None

    def add(self, s: StepSample) -> None:
        n = s.count
        self.steps += n
        self.step_s += s.step_s * n
        self.data_wait_s += s.data_wait_s * n
        self.h2d_s += s.h2d_s * n
        self.forward_s += s.forward_s * n
        self.backward_s += s.backward_s * n
        self.optimizer_s += s.optimizer_s * n
        self.collective_wait_s += (s.collective_wait_s or 0.0) * n
        if s.outside:
            for name, secs in s.outside.items():
                self.outside[name] = self.outside.get(name, 0.0) + secs * n
        start, end = s.time - s.step_s * n, s.time
        if self.first_start is None or start < self.first_start:
            self.first_start = start
        if self.last_end is None or end > self.last_end:
            self.last_end = end

    def copy(self) -> RunTotals:
        out = RunTotals(**{f.name: getattr(self, f.name) for f in fields(self)})
        out.outside = dict(self.outside)
        return out


@dataclass(frozen=True)
class Account:
    """One rank's whole run, booked once: seconds per part (see the module's docstring).

    ``outside``: named work in the steps by name; ``other_s``: the steps' time in no phase and no
    named work. ``started``/``ended``: whether the process start and end were reported (else the
    first step's start or the last step's end stands in: no start-up or teardown booked).
    ``startup_gpu_bytes``/``teardown_gpu_bytes``: the most GPU memory the rank held during its
    start-up and its teardown (:func:`with_gpu_memory`); None where not measured (no GPU, no
    GPU sample then, or nothing held).
    """

    rank: int
    wall_s: float
    startup_s: float = 0.0
    steps: int = 0
    data_wait_s: float = 0.0
    h2d_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    collective_wait_s: float = 0.0
    outside: Mapping[str, float] = field(default_factory=dict)
    other_s: float = 0.0
    gaps_s: float = 0.0
    teardown_s: float = 0.0
    started: bool = True
    ended: bool = True
    startup_gpu_bytes: float | None = None
    teardown_gpu_bytes: float | None = None

    def parts(self) -> dict[str, float]:
        """Every part in run order: startup, the step parts, named work by name, other, gaps,
        teardown. They add up to :attr:`booked_s`."""
        out = {"startup": self.startup_s}
        for name in STEP_PARTS:
            out[name] = getattr(self, f"{name}_s")
        for name in outside_order(self.outside):
            out[name] = self.outside[name]
        out["other"] = self.other_s
        out["gaps"] = self.gaps_s
        out["teardown"] = self.teardown_s
        return out

    @property
    def booked_s(self) -> float:
        return sum(self.parts().values())

    @property
    def steps_s(self) -> float:
        """The steps' own time: their phases, named work and other."""
        parts = self.parts()
        return sum(v for k, v in parts.items() if k not in ("startup", "gaps", "teardown"))

    def rounded(self, digits: int = 3) -> Account:
        """This account with every figure rounded as the report writes it."""
        values: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float):
                v = round(v, digits)
            values[f.name] = v
        values["outside"] = {k: round(v, digits) for k, v in self.outside.items()}
        return Account(**values)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "rank"}
        out["outside"] = {k: self.outside[k] for k in outside_order(self.outside)}
        for name in _GPU_HELD:  # only where measured: reports without a GPU stay as they were
            if out[name] is None:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, rank: int, d: Mapping[str, Any]) -> Account:
        values: dict[str, Any] = {}
        for f in fields(cls):
            v = d.get(f.name)
            if f.name in ("started", "ended"):
                values[f.name] = bool(v) if v is not None else True
            elif f.name == "steps":
                values[f.name] = int(v) if _number(v) else 0
            elif f.name in _GPU_HELD:
                values[f.name] = float(v) if _number(v) else None
            elif f.name not in ("rank", "outside") and _number(v):
                values[f.name] = float(v)
        outside = d.get("outside")
        values["outside"] = (
            {str(k): float(v) for k, v in outside.items() if _number(v)}
            if isinstance(outside, Mapping)
            else {}
        )
        values["rank"] = rank
        values.setdefault("wall_s", 0.0)
        return cls(**values)


# The account's figures of GPU memory held outside the steps (bytes; None: not measured).
_GPU_HELD = ("startup_gpu_bytes", "teardown_gpu_bytes")


def _number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def outside_order(outside: Mapping[str, float]) -> list[str]:
    """Names of named work: the known ones in their order, then the others sorted."""
    known = [n for n in OUTSIDE_NAMES if n in outside]
    return known + sorted(n for n in outside if n not in OUTSIDE_NAMES)


def account(
    rank: int,
    totals: RunTotals | None,
    *,
    started_at: float | None = None,
    ended_at: float | None = None,
) -> Account | None:
    """The account of one rank's run; None where neither a step nor both ends are known."""
    if totals is None or totals.steps == 0 or totals.first_start is None:
        if started_at is None or ended_at is None:
            return None
        wall = max(0.0, ended_at - started_at)  # never stepped: all of it was start-up
        return Account(rank=rank, wall_s=wall, startup_s=wall)
    first, last = totals.first_start, totals.last_end
    assert last is not None
    start = started_at if started_at is not None else first
    end = ended_at if ended_at is not None else last
    start = min(start, first)  # a start reported late (the probe's fallback) still covers step 1
    end = max(end, last)
    outside = {k: max(0.0, v) for k, v in totals.outside.items() if v > 0}
    phases = (
        totals.data_wait_s
        + totals.h2d_s
        + totals.forward_s
        + totals.backward_s
        + totals.optimizer_s
        + totals.collective_wait_s
    )
    unphased = max(0.0, totals.step_s - phases)
    named = sum(outside.values())
    if named > unphased:  # named work is part of the steps' other time: never counted twice
        scale = unphased / named if named else 0.0
        outside = {k: v * scale for k, v in outside.items()}
        named = unphased
    return Account(
        rank=rank,
        wall_s=end - start,
        startup_s=first - start,
        steps=totals.steps,
        data_wait_s=totals.data_wait_s,
        h2d_s=totals.h2d_s,
        forward_s=totals.forward_s,
        backward_s=totals.backward_s,
        optimizer_s=totals.optimizer_s,
        collective_wait_s=totals.collective_wait_s,
        outside=outside,
        other_s=unphased - named,
        gaps_s=max(0.0, (last - first) - totals.step_s),
        teardown_s=end - last,
        started=started_at is not None,
        ended=ended_at is not None,
    )


def with_gpu_memory(
    accounts: Mapping[int, Account],
    runs: Mapping[int, RunTotals],
    infos: Mapping[int, RankInfo],
    gpus_of: Mapping[int, Sequence[str]],
    samples: Sequence[DeviceSample],
) -> dict[int, Account]:
    """``accounts`` with the GPU memory each rank held while it started up and while it ended
    (``startup_gpu_bytes``, ``teardown_gpu_bytes``): the most its process held on its GPUs
    (``gpus_of``) in the NVML samples of that part, where NVML lists its PID on its host. A part
    not booked (its end of the process not reported) or without such a sample stays None: a
    rank that held nothing then (before CUDA starts, the memory in use on a GPU is the driver's,
    not the rank's), or whose PID NVML cannot see (a container)."""
    by_gpu: dict[str, list[DeviceSample]] = {}
    for d in samples:
        if not d.lost:
            by_gpu.setdefault(d.uuid, []).append(d)
    out = dict(accounts)
    for rank, a in accounts.items():
        run, info = runs.get(rank), infos.get(rank)
        mine = [d for u in gpus_of.get(rank, ()) for d in by_gpu.get(u, ())]
        if run is None or info is None or run.first_start is None or run.last_end is None:
            continue
        if not mine:
            continue
        startup = teardown = None
        if a.started and a.startup_s > 0:
            lo = run.first_start - a.startup_s
            startup = _held(info, [d for d in mine if lo <= d.time < run.first_start])
        if a.ended and a.teardown_s > 0:
            hi = run.last_end + a.teardown_s
            teardown = _held(info, [d for d in mine if run.last_end < d.time <= hi])
        if startup is not None or teardown is not None:
            out[rank] = replace(a, startup_gpu_bytes=startup, teardown_gpu_bytes=teardown)
    return out


def _held(info: RankInfo, samples: Sequence[DeviceSample]) -> float | None:
    """The most GPU memory the rank's process held in ``samples`` (see :func:`with_gpu_memory`);
    None where it held none or nothing was read."""
    own = [
        p.used_bytes
        for d in samples
        if d.node == info.host or not info.host
        for p in d.processes
        if p.pid == info.pid and p.used_bytes is not None
    ]
    return float(max(own)) if own else None


@dataclass(frozen=True)
class Loss:
    """The time one rank lost to ``kind`` over the run: a wait (``collective_wait``,
    ``data_wait``), named work (``checkpoint``, ``evaluation``, ...), ``startup`` or
    ``teardown``; its share of
    the rank's wall time, and the peers that waited for it meanwhile (anything but a wait for
    peers: the ranks whose waits at the collectives it explains)."""

    kind: str
    rank: int
    seconds: float
    share: float
    waiting: tuple[int, ...] = ()
    # The other ranks that lost about as much to the same kind (at least ``ALIKE_SHARE`` of it):
    # a loss every rank shares (start-up, teardown) is no one rank's.
    alike: tuple[int, ...] = ()


def losses(accounts: Mapping[int, Account]) -> list[Loss]:
    """Every loss of every rank, largest first (ties: lower rank first)."""
    out: list[Loss] = []
    for rank, a in accounts.items():
        if a.wall_s <= 0:
            continue
        kinds = {"startup": a.startup_s, "teardown": a.teardown_s, "data_wait": a.data_wait_s}
        kinds["collective_wait"] = a.collective_wait_s
        kinds.update(a.outside)
        for kind, secs in kinds.items():
            if secs <= 0:
                continue
            waiting: tuple[int, ...] = ()
            if kind != "collective_wait":
                waiting = tuple(
                    sorted(
                        r
                        for r, b in accounts.items()
                        if r != rank
                        and b.collective_wait_s > 0
                        and secs >= EXPLAINS_SHARE * b.collective_wait_s
                        and b.collective_wait_s >= EXPLAINS_SHARE * secs
                    )
                )
            out.append(Loss(kind, rank, secs, secs / a.wall_s, waiting))
    out.sort(key=lambda x: (-x.seconds, x.rank, x.kind))
    return out


def largest_loss(accounts: Mapping[int, Account]) -> Loss | None:
    """The loss the verdict leads with: the largest, except that a wait for peers that a peer's
    own loss explains (the peer's work or data wait, at least half of it) gives way to that
    cause."""
    ranked = losses(accounts)
    if not ranked:
        return None
    top = ranked[0]
    if top.kind == "collective_wait":
        for cause in ranked[1:]:
            if cause.kind != "collective_wait" and top.rank in cause.waiting:
                top = cause
                break
    alike = tuple(
        sorted(
            x.rank
            for x in ranked
            if x.kind == top.kind and x.rank != top.rank and x.seconds >= ALIKE_SHARE * top.seconds
        )
    )
    if not alike:
        return top
    # A loss every rank shares: nobody waited for it.
    return Loss(top.kind, top.rank, top.seconds, top.share, (), alike)
