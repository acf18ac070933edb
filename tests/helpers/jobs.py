"""Constructed DDP jobs for the analysis tests: per-rank phase timings in, a Snapshot out.

Timing model (the DDP barrier): in every step each rank does its own work (data wait, h2d,
forward, its own backward compute, optimizer), then all ranks meet at the gradient all-reduce.
The last rank to arrive sets the pace; every rank then pays the communication cost ``comm``.
So, per step:

* ``local_r = data_wait + h2d + forward + backward + optimizer`` (jittered),
* ``collective_wait_r = comm + max_q(local_q) - local_r`` (the slowest rank waits ``comm`` only),
* ``backward_s = backward``: the probe's phases are exclusive, the wait is carved out of
  backward; where the wait is not measured (a builtin comm hook) it stays inside backward,
  ``backward_s = backward + collective_wait_r``,
* ``step_s = max_q(local_q) + comm``, the same on every rank.

Each phase gets multiplicative jitter ``uniform(-jitter, +jitter)`` from a seeded RNG, so the
rules' medians are exercised but results are reproducible. Samples go through the real
:class:`SampleStore` as :class:`Batch` deliveries (one per step), as the node actors send them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.samples import Batch, LoaderConfig, NodeCpu, ProcessCpu, RankInfo, StepSample

PHASE_FIELDS = ("data_wait", "h2d", "forward", "backward", "optimizer")


@dataclass(frozen=True)
class RankSpec:
    """Nominal per-step timings (seconds) and configuration of one rank."""

    data_wait: float = 0.001
    h2d: float = 0.005
    forward: float = 0.030
    # The rank's own backward compute; the wait at the all-reduce is added by the builder.
    backward: float = 0.060
    optimizer: float = 0.005
    # Samples per step; with ``micro_batches`` > 1 (gradient accumulation) the DataLoader's
    # batch is ``batch_size // micro_batches``.
    batch_size: int | None = 32
    micro_batches: int = 1
    num_workers: int = 2
    pin_memory: bool = True
    persistent_workers: bool = True
    main_cpu: float | None = 0.9
    # CPU (cores) of each DataLoader worker; None: worker CPU not measured.
    worker_cpu: float | None = 0.5
    # Seconds a second the main thread, and each worker, waited for a core (run-queue delay);
    # None: not measured.
    main_wait: float | None = None
    worker_wait: float | None = None
    host: str = "node0"
    # None: "cuda:<local_rank>".
    device: str | None = None
    # False: the probe could not measure the collective wait (collective_wait_s = None).
    measure_wait: bool = True

    @property
    def local(self) -> float:
        return self.data_wait + self.h2d + self.forward + self.backward + self.optimizer

    @property
    def compute(self) -> float:
        return self.h2d + self.forward + self.backward + self.optimizer

    def scaled(self, factor: float, *, batch_size: int | None = None) -> RankSpec:
        """Compute phases scaled by ``factor`` (data wait unchanged), e.g. for a larger batch."""
        return replace(
            self,
            h2d=self.h2d * factor,
            forward=self.forward * factor,
            backward=self.backward * factor,
            optimizer=self.optimizer * factor,
            batch_size=self.batch_size if batch_size is None else batch_size,
        )


@dataclass(frozen=True)
class NodeSpec:
    cores: float = 64.0
    # None: the sum of the measured CPU of the host's ranks and workers (capped at ``cores``).
    busy_cores: float | None = None


class JobBuilder:
    """Feeds a SampleStore with the steps of a constructed DDP job."""

    def __init__(
        self,
        specs: Sequence[RankSpec],
        *,
        comm: float = 0.004,
        jitter: float = 0.02,
        seed: int = 0,
        start: float = 1_000.0,
        nodes: Mapping[str, NodeSpec] | None = None,
        parallel_mode: str = "ddp",
        store: SampleStore | None = None,
    ) -> None:
        self.specs = list(specs)
        self.comm = comm
        self.jitter = jitter
        self.rng = random.Random(seed)
        self.now = start
        self.nodes = dict(nodes or {})
        self.parallel_mode = parallel_mode
        self.store = store if store is not None else SampleStore(job="test")
        self.step = 0
        self._sent_infos = False

    def _jit(self, value: float) -> float:
        if self.jitter <= 0 or value == 0:
            return value
        return value * (1.0 + self.rng.uniform(-self.jitter, self.jitter))

    def infos(self) -> tuple[RankInfo, ...]:
        world = len(self.specs)
        local_ranks: dict[str, int] = {}
        out = []
        for rank, spec in enumerate(self.specs):
            local = local_ranks.get(spec.host, 0)
            local_ranks[spec.host] = local + 1
            loader = LoaderConfig(
                num_workers=spec.num_workers,
                pin_memory=spec.pin_memory,
                prefetch_factor=2 if spec.num_workers > 0 else None,
                persistent_workers=spec.persistent_workers,
                batch_size=None
                if spec.batch_size is None
                else spec.batch_size // spec.micro_batches,
                drop_last=False,
                sampler="DistributedSampler",
            )
            out.append(
                RankInfo(
                    rank=rank,
                    world_size=world,
                    local_rank=local,
                    host=spec.host,
                    pid=10_000 + rank,
                    device=spec.device if spec.device is not None else f"cuda:{local}",
                    parallel_mode=self.parallel_mode,
                    devices=(local,),
                    loader=loader,
                    unmeasured=() if spec.measure_wait else ("collective_wait",),
                    job="test",
                )
            )
        return tuple(out)

    def run(self, steps: int, specs: Sequence[RankSpec] | None = None) -> JobBuilder:
        """Append ``steps`` steps (optionally with new per-rank specs) to the store."""
        if specs is not None:
            self.specs = list(specs)
            self._sent_infos = False
        for _ in range(steps):
            self.store.add(self._one_step())
        return self

    def _one_step(self) -> Batch:
        phases = [{name: self._jit(getattr(s, name)) for name in PHASE_FIELDS} for s in self.specs]
        local = [sum(p.values()) for p in phases]
        barrier = max(local)
        comm = self._jit(self.comm)
        step_s = barrier + comm
        self.now += step_s
        t = self.now
        steps: list[StepSample] = []
        procs: list[ProcessCpu] = []
        host_busy: dict[str, float] = {}
        for rank, (spec, p) in enumerate(zip(self.specs, phases, strict=True)):
            wait = comm + barrier - local[rank]
            steps.append(
                StepSample(
                    rank=rank,
                    step=self.step,
                    time=t,
                    step_s=step_s,
                    data_wait_s=p["data_wait"],
                    h2d_s=p["h2d"],
                    forward_s=p["forward"],
                    # Exclusive phases; an unmeasured DDP wait stays inside backward.
                    backward_s=p["backward"] + (0.0 if spec.measure_wait else wait),
                    optimizer_s=p["optimizer"],
                    collective_wait_s=wait if spec.measure_wait else None,
                    batch_size=spec.batch_size,
                    micro_batches=spec.micro_batches,
                )
            )
            workers = (spec.worker_cpu,) * spec.num_workers if spec.worker_cpu is not None else ()
            procs.append(
                ProcessCpu(
                    rank=rank,
                    time=t,
                    pid=10_000 + rank,
                    main_cpu=spec.main_cpu,
                    worker_cpu=workers,
                    main_wait=spec.main_wait,
                    worker_wait=None
                    if spec.worker_wait is None or not workers
                    else spec.worker_wait * len(workers),
                )
            )
            host_busy[spec.host] = (
                host_busy.get(spec.host, 0.0) + (spec.main_cpu or 0.0) + sum(workers)
            )
        node_samples = []
        for host, busy in sorted(host_busy.items()):
            node = self.nodes.get(host, NodeSpec())
            measured = node.busy_cores if node.busy_cores is not None else min(node.cores, busy)
            node_samples.append(
                NodeCpu(host=host, time=t, cores=node.cores, busy_cores=measured, load1=busy)
            )
        infos = () if self._sent_infos else self.infos()
        self._sent_infos = True
        self.step += 1
        return Batch(
            infos=infos, steps=tuple(steps), processes=tuple(procs), nodes=tuple(node_samples)
        )

    def snapshot(self, window_s: float | None = None) -> Snapshot:
        return self.store.snapshot(now=self.now, window_s=window_s)


def ddp_snapshot(specs: Sequence[RankSpec], steps: int = 24, **kwargs: object) -> Snapshot:
    """A snapshot of ``steps`` steps of a DDP job with these per-rank specs."""
    return JobBuilder(specs, **kwargs).run(steps).snapshot()  # type: ignore[arg-type]


def balanced(world: int, **overrides: object) -> list[RankSpec]:
    return [replace(RankSpec(), **overrides) for _ in range(world)]  # type: ignore[arg-type]


def with_rank(specs: Sequence[RankSpec], rank: int, **changes: object) -> list[RankSpec]:
    out = list(specs)
    out[rank] = replace(out[rank], **changes)  # type: ignore[arg-type]
    return out


# Scenarios shared by several test modules. Each returns the per-rank specs and, where the host
# matters, the node specs; nominal values are chosen away from rounding boundaries so the jitter
# never flips a verdict.


def starved_rank3(**rank3: object) -> list[RankSpec]:
    """8 ranks; rank 3 waits 156 ms for data in a 260 ms step (60%) with num_workers=2.

    Own work 100 ms on every rank (h2d 5 + forward 30 + backward 60 + optimizer 5), comm 4 ms:
    step = 156 + 100 + 4 = 260 ms on every rank.
    """
    return with_rank(balanced(8), 3, data_wait=0.156, **rank3)


def uneven_batch() -> list[RankSpec]:
    """4 ranks; rank 1 trains on batch 64 against 32 elsewhere, same compute per sample."""
    specs = balanced(4)
    specs[1] = specs[1].scaled(2.0, batch_size=64)
    return specs


def forward_straggler() -> list[RankSpec]:
    """4 ranks; rank 2's forward takes 70 ms against 30 ms elsewhere."""
    return with_rank(balanced(4), 2, forward=0.070)


def backward_straggler() -> list[RankSpec]:
    """2 ranks; rank 1's own backward compute takes 120 ms against 60 ms on rank 0.

    Backward *wall* time is then about 124 ms on both: rank 0 spends 64 ms of it waiting at
    the all-reduce, rank 1 only the 4 ms of communication.
    """
    return with_rank(balanced(2), 1, backward=0.120)


def oversubscribed_2core() -> tuple[list[RankSpec], dict[str, NodeSpec]]:
    """A 2-core host: rank 0 with 1 DataLoader worker, rank 1 with 8 busy ones (0.4 cores each)."""
    specs = [
        RankSpec(num_workers=1, main_cpu=0.15, worker_cpu=0.2),
        RankSpec(num_workers=8, main_cpu=0.15, worker_cpu=0.4),
    ]
    return specs, {"node0": NodeSpec(cores=2.0, busy_cores=2.0)}


def accumulating(specs: list[RankSpec], n: int = 4) -> list[RankSpec]:
    """The same per-step batches, each step made of ``n`` micro-batches."""
    return [replace(s, micro_batches=n) for s in specs]


# A CPU job's rank: no device copy, 95 ms of own work a step, the main process loading
# (num_workers=0); and its two-core host, saturated or with one core idle.
CPU_RANK = RankSpec(
    h2d=0.0,
    forward=0.030,
    backward=0.060,
    optimizer=0.005,
    num_workers=0,
    main_cpu=0.95,
    worker_cpu=None,
    device="cpu",
    pin_memory=False,
    persistent_workers=False,
)
TWO_CORES_BUSY = {"node0": NodeSpec(cores=2.0, busy_cores=2.0)}
TWO_CORES_ONE_IDLE = {"node0": NodeSpec(cores=2.0, busy_cores=1.0)}
