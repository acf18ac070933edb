"""Replay a recording as a live node endpoint, in real time, timestamps shifted to now.

``auditor replay RECORDING`` serves the recording's GPU, rank and host metrics on
``http://127.0.0.1:9400/metrics`` exactly as a node agent would, so the dashboards and the alert
rules can be tried on a machine without GPUs, and end-to-end tests can have a real Prometheus
scrape real-shaped GPU metrics, job and rank ownership labels included::

    auditor replay tests/data/idle_allocated_gpu/recording.jsonl --loop
    auditor replay run.jsonl --speed 10 --job demo --metrics-port 9401

How the recording is played:

* Its samples are grouped into ticks of one second of recording time (the agent's sample
  interval): a tick holds the samples since the previous one and is published when the
  recording's clock reaches it, never earlier. Every timestamp is moved so that the recording's
  first sample is "now" when the replay starts.
* ``--speed X`` plays X times faster: the recording's timeline is compressed by X, so each
  timestamp is still the wall time its sample is published at, while durations (step and phase
  seconds) stay as recorded -- counters of seconds then grow X times faster than the wall clock.
* ``--loop`` starts again from the beginning one tick after the end, times shifted again. Counters
  keep growing across loops and step numbers keep counting up: Prometheus never sees a reset.
  Without ``--loop`` the last state stays published until the command is stopped.
* The ``auditor_job`` label is the recording's job unless ``--job NAME`` is given (ranks' own job
  names are overridden too, so GPU ownership labels agree).
* One endpoint exports one node, as a node agent does: a multi-node recording needs ``--node``
  (run one replay per node, on different ports, to export them all).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from auditor.samples import (
    Batch,
    DeviceSample,
    FlopCount,
    MemoryBudget,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)
from auditor.telemetry.recorded import Recording

from .state import ExportState, apply_batch

DEFAULT_TICK_S = 1.0  # the node agent's default sample interval
DEFAULT_NODE = "replay"  # node label when the recording names no host at all
_EPS = 1e-9  # float slack when a sample falls exactly on a tick boundary


class ReplayError(ValueError):
    """A recording that cannot be replayed (no samples, or an unknown or ambiguous node)."""


# --- the recording, cut into ticks -------------------------------------------------------------
def recording_nodes(batch: Batch) -> list[str]:
    """The node names a recording's samples carry (rank hosts, node CPU hosts, GPU nodes)."""
    names = {i.host for i in batch.infos} | {n.host for n in batch.nodes}
    names |= {d.node for d in batch.devices}
    return sorted(names - {""})


def select_node(batch: Batch, node: str | None = None) -> tuple[str, Batch]:
    """The node to export and the part of ``batch`` that is that node's.

    Samples that name no host (a rank with ``host=""``) are kept: they can only be this node's.
    With ``node=None`` the recording must name at most one node.
    """
    names = recording_nodes(batch)
    if node is None:
        if len(names) > 1:
            raise ReplayError(
                f"the recording has {len(names)} nodes ({', '.join(names)}): pick one with "
                "--node (one replay per node)"
            )
        node = names[0] if names else DEFAULT_NODE
    elif names and node not in names:
        raise ReplayError(f"node {node!r} is not in the recording (nodes: {', '.join(names)})")
    ranks = {i.rank for i in batch.infos if i.host in ("", node)}
    # Steps and CPU of ranks that never introduced themselves stay unexported, as live.
    return node, Batch(
        infos=tuple(i for i in batch.infos if i.rank in ranks),
        steps=tuple(s for s in batch.steps if s.rank in ranks),
        processes=tuple(c for c in batch.processes if c.rank in ranks),
        nodes=tuple(n for n in batch.nodes if n.host in ("", node)),
        devices=tuple(d for d in batch.devices if d.node in ("", node)),
        ended=tuple(r for r in batch.ended if r in ranks),
        memory=tuple(m for m in batch.memory if m.rank in ranks),
        flops=tuple(f for f in batch.flops if f.rank in ranks),
    )


def rename_node(batch: Batch, name: str) -> Batch:
    """``batch`` (one node's, from :func:`select_node`) as if recorded on node ``name``: two
    replays of recordings made on one host can then stand side by side in one Prometheus."""
    rep = dataclasses.replace
    return rep(
        batch,
        infos=tuple(rep(i, host=name) for i in batch.infos),
        nodes=tuple(rep(n, host=name) for n in batch.nodes),
        devices=tuple(rep(d, node=name) for d in batch.devices),
    )


@dataclass(frozen=True)
class Tick:
    """The samples published together at recording time ``at`` (seconds since the epoch)."""

    at: float
    batch: Batch


def make_ticks(batch: Batch, tick_s: float = DEFAULT_TICK_S) -> list[Tick]:
    """``batch`` cut into ticks ``tick_s`` apart, starting at its first sample time ``t0``.

    Tick ``k`` is published at ``t0 + k * tick_s`` and holds the samples after the previous tick
    and up to it, so no sample is published before its own time; empty ticks are left out.
    Rank infos carry no time: they go into the first tick, as a rank introduces itself before
    it steps. Ended ranks have no time either: they end with the last tick.
    """
    if tick_s <= 0:
        raise ValueError(f"tick_s must be positive, got {tick_s}")
    times = [s.time for s in batch.steps] + [c.time for c in batch.processes]
    times += [n.time for n in batch.nodes] + [d.time for d in batch.devices]
    if not times and not batch.infos:
        raise ReplayError("the recording holds no samples to replay")
    t0 = min(times, default=0.0)

    def index(t: float) -> int:
        return max(0, math.ceil((t - t0) / tick_s - _EPS))

    ticks: dict[int, _TickBuilder] = {}

    def at(k: int) -> _TickBuilder:
        return ticks.setdefault(k, _TickBuilder())

    at(0).infos.extend(batch.infos)
    for s in sorted(batch.steps, key=lambda s: (s.time, s.rank)):
        at(index(s.time)).steps.append(s)
    for c in sorted(batch.processes, key=lambda c: (c.time, c.rank)):
        at(index(c.time)).processes.append(c)
    for n in sorted(batch.nodes, key=lambda n: n.time):
        at(index(n.time)).nodes.append(n)
    for d in sorted(batch.devices, key=lambda d: (d.time, d.index)):
        at(index(d.time)).devices.append(d)
    for m in sorted(batch.memory, key=lambda m: (m.time, m.rank)):
        at(index(m.time)).memory.append(m)
    for f in sorted(batch.flops, key=lambda f: (f.time, f.rank)):
        at(index(f.time)).flops.append(f)
    at(max(ticks)).ended.extend(batch.ended)
    return [Tick(at=t0 + k * tick_s, batch=ticks[k].build()) for k in sorted(ticks)]


@dataclass
class _TickBuilder:
    infos: list[RankInfo] = field(default_factory=list)
    steps: list[StepSample] = field(default_factory=list)
    processes: list[ProcessCpu] = field(default_factory=list)
    nodes: list[NodeCpu] = field(default_factory=list)
    devices: list[DeviceSample] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)
    memory: list[MemoryBudget] = field(default_factory=list)
    flops: list[FlopCount] = field(default_factory=list)

    def build(self) -> Batch:
        return Batch(
            infos=tuple(self.infos),
            steps=tuple(self.steps),
            processes=tuple(self.processes),
            nodes=tuple(self.nodes),
            devices=tuple(self.devices),
            ended=tuple(self.ended),
            memory=tuple(self.memory),
            flops=tuple(self.flops),
        )


# --- the replay ------------------------------------------------------------------------------
class Replay:
    """Plays a recording into an :class:`ExportState` on the wall clock.

    ``clock`` (seconds since the epoch) and ``wait`` (sleep up to the given seconds; True means
    "stop now") are injected so tests play a recording without sleeping. By default ``wait``
    sleeps on an event that :meth:`stop` sets.
    """

    def __init__(
        self,
        recording: Recording,
        *,
        job: str | None = None,
        node: str | None = None,
        as_node: str | None = None,
        speed: float = 1.0,
        loop: bool = False,
        tick_s: float = DEFAULT_TICK_S,
        clock: Callable[[], float] = time.time,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self.node, batch = select_node(recording.batch, node)
        if as_node:
            self.node, batch = as_node, rename_node(batch, as_node)
        self.job = job or recording.job or next((i.job for i in batch.infos if i.job), "")
        if job:
            # Ranks' own job names label their GPUs; an override that left them would split a job.
            batch = dataclasses.replace(
                batch, infos=tuple(dataclasses.replace(i, job=job) for i in batch.infos)
            )
        self.ticks = make_ticks(batch, tick_s)
        self.speed = speed
        self.loop = loop
        self._t0 = self.ticks[0].at
        # Loop period: the span rounded up to whole ticks, plus one tick, so the last tick of one
        # pass and the first of the next are a tick apart (as RecordedDeviceSource does).
        self.period = self.ticks[-1].at - self._t0 + tick_s
        # Step numbers of pass n are moved up by n * step_span so "last step" keeps advancing.
        self._step_span = max((s.step for s in batch.steps), default=-1) + 1
        self._clock = clock
        self._stopped = threading.Event()
        self._wait = wait if wait is not None else self._stopped.wait
        self._state = ExportState(job=self.job, node=self.node)
        self.applied = 0  # ticks applied so far

    @property
    def state(self) -> ExportState:
        """The state to export now (the exporter's ``state_fn``)."""
        return self._state

    @property
    def duration_s(self) -> float:
        """Wall seconds one pass takes at this speed (up to the next pass's first tick)."""
        return self.period / self.speed

    def schedule(self, start: float) -> Iterator[tuple[float, Batch]]:
        """``(wall time, batch)`` of every tick played from wall time ``start``, with times (and,
        from the second pass on, step numbers) moved; endless with ``loop``."""
        lost: set[str] = set()  # a GPU that fell off the bus stays lost across passes, as live
        for n in itertools.count():
            base = start + n * self.period / self.speed
            for tick in self.ticks:
                yield self._wall(base, tick.at), self._retime(tick.batch, base, n, lost)
            if not self.loop:
                return

    def _wall(self, base: float, t: float) -> float:
        return base + (t - self._t0) / self.speed

    def _retime(self, batch: Batch, base: float, n: int, lost: set[str]) -> Batch:
        step_shift = n * self._step_span

        def step(s: StepSample) -> StepSample:
            return dataclasses.replace(s, time=self._wall(base, s.time), step=s.step + step_shift)

        def device(d: DeviceSample) -> DeviceSample:
            moved = dataclasses.replace(d, time=self._wall(base, d.time))
            if d.lost:
                lost.add(d.uuid)
            elif d.uuid in lost:
                moved = DeviceSample(
                    node=d.node,
                    index=d.index,
                    uuid=d.uuid,
                    time=moved.time,
                    model=d.model,
                    lost=True,
                )
            return moved

        return dataclasses.replace(
            batch,
            steps=tuple(step(s) for s in batch.steps),
            processes=tuple(
                dataclasses.replace(c, time=self._wall(base, c.time)) for c in batch.processes
            ),
            nodes=tuple(dataclasses.replace(x, time=self._wall(base, x.time)) for x in batch.nodes),
            devices=tuple(device(d) for d in batch.devices),
        )

    def run(self) -> None:
        """Play from now until the recording ends (never, with ``loop``) or :meth:`stop`."""
        for at, batch in self.schedule(self._clock()):
            delay = at - self._clock()
            if (delay > 0 and self._wait(delay)) or self._stopped.is_set():
                return
            # Behind schedule (a slow machine, a high speed): apply at once, times as scheduled.
            self._state = apply_batch(self._state, batch)
            self.applied += 1

    def stop(self) -> None:
        """Ask :meth:`run` to return (at once when it is waiting with the default ``wait``)."""
        self._stopped.set()
