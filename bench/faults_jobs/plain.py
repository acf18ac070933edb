"""An ordinary DDP loop (``examples/common.py``'s model, data and loader) with one fault turned
on at ``--fault-after`` seconds: the plain-loop cases of ``bench/faults.py``.

    torchrun --nproc_per_node=2 bench/faults_jobs/plain.py --case io_starvation \
        --fix 1.num_workers=4

Cases (rank ``--fault-rank``, 1 unless said, from the onset on):

* ``none``: balanced (a control); ``even_eval``: every rank evaluates its share every 20 steps
  (a busy but even control).
* ``io_starvation``: reads 4 ms per sample from slow storage, one worker.
* ``cpu_starvation``: decodes every sample with CPU-heavy work in the main process (no worker).
* ``too_many_workers``: 8 workers, each decoding with CPU-heavy work.
* ``forward_straggler`` / ``backward_straggler``: 30 ms more in forward / in backward.
* ``uneven_batch``: twice the others' batch.
* ``periodic_stall``: 0.5 s of its own work every 20 steps, between steps.
* ``eval_rank0``: rank 0 alone evaluates (40 batches) every 20 steps.
* ``checkpoint_rank0``: rank 0 alone saves a checkpoint (model, optimizer, 256 MiB of state)
  every 20 steps.
* ``memory_imbalance``: keeps an extra 256 MiB module (an EMA copy of a larger model), from
  the start (its onset).
* ``slow_collective``: all-gathers 2 MB of metrics per step as Python objects (the others send
  a few bytes), in one collective they all wait in.
* ``slow_transfer``: every rank all-gathers a 16 MiB tensor per step from the onset (an
  embedding's shards, a metric's whole state): the transfer itself is slow, no rank is slower.
* ``accum_starvation``: ``io_starvation`` under gradient accumulation (4 micro-batches of 8 per
  optimizer step, ``no_sync`` on all but the last).
* ``memory_growth``: keeps every step's loss with its graph (``backward(retain_graph=True)``,
  the loss appended to a list): about 6 MiB of saved activations a step stay held, and the
  rank's memory climbs for as long as it trains. It traces its own resident set
  (``FAULT_MEMORY``, :class:`knobs.MemoryTrace`).
* ``slowdown``: turns slow at the onset: 30 ms more in every forward from there on (a rank
  that ran even with its peers until then); it says at which of its steps (``FAULT_STEP``).
* ``long_startup``: balanced, after a long start-up (``--startup`` seconds before the first
  step, 10 by default): rank 0 prepares the data (reads, and builds 128 MiB in memory) while
  the others wait at a barrier, then every rank loads its copy (a control).

Knobs (``--fix``, from the report's typed fixes): ``num_workers``, ``batch_size``,
``pin_memory``/``persistent_workers`` (accepted: no effect on CPU), ``rank_work`` (the rank's
extra work removed), ``evaluation_on_all_ranks`` (every rank evaluates its share),
``checkpoint_async`` (saved off the training thread), ``checkpoint_interval``,
``logging_off_step`` (the metrics gather dropped), ``loading_cost`` (cheap loading),
``memory_release`` (the extra module dropped), ``retained_tensors`` (no loss kept: the graph
freed by backward, as usual).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples"))
sys.path.insert(0, HERE)

from common import SmallConvNet, SyntheticImages, finish, make_loader, setup  # noqa: E402
from knobs import Fixes, MemoryTrace, Onset, Stopper, parser  # noqa: E402

CASES = (
    "none",
    "even_eval",
    "io_starvation",
    "cpu_starvation",
    "too_many_workers",
    "forward_straggler",
    "backward_straggler",
    "uneven_batch",
    "periodic_stall",
    "eval_rank0",
    "checkpoint_rank0",
    "memory_imbalance",
    "slow_collective",
    "slow_transfer",
    "accum_starvation",
    "memory_growth",
    "slowdown",
    "long_startup",
)
KNOWN = (
    "evaluation_on_all_ranks",
    "checkpoint_async",
    "checkpoint_interval",
    "logging_off_step",
    "num_workers",
    "batch_size",
    "pin_memory",
    "persistent_workers",
    "rank_work",
    "loading_cost",
    "memory_release",
    "retained_tensors",
)
DELAY_S = 0.03  # a straggler's extra forward or backward time
EVERY = 20  # steps between periodic work
STARTUP_S = 10.0  # long_startup: seconds from the process group to the first step
PREPARED_BYTES = 128 * 2**20  # long_startup: the data rank 0 prepares and every rank loads


class Images(SyntheticImages):
    """The examples' images, their CPU-heavy decoding too only from ``slow_from`` on."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.decode_work and time.time() < self.slow_from:
            x, y = SyntheticImages.__getitem__(self._plain, i)
            return x, y
        return super().__getitem__(i)

    @property
    def _plain(self) -> SyntheticImages:
        return SyntheticImages(self.n, self.read_delay_s, 0, self.slow_from)


class Gate:
    """Whether this rank's injected work is on: from the onset, unless a fix removed it."""

    def __init__(self, onset: Onset, faulty: bool) -> None:
        self.onset, self.faulty = onset, faulty

    def __bool__(self) -> bool:
        return self.faulty and self.onset.on


class SlowGrad(torch.autograd.Function):
    gate: Gate | None = None

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        if SlowGrad.gate:
            time.sleep(DELAY_S)
        return grad


class Net(SmallConvNet):
    def __init__(self, forward_gate: Gate | None, backward_gate: Gate | None) -> None:
        super().__init__()
        self.forward_gate, self.backward_gate = forward_gate, backward_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.forward_gate:
            time.sleep(DELAY_S)
        h = self.features(x)
        if self.backward_gate is not None:
            SlowGrad.gate = self.backward_gate
            h = SlowGrad.apply(h)
        return self.head(h)


def long_startup(rank: int, seconds: float) -> torch.Tensor:
    """Start-up as a real job has it: rank 0 reads and prepares the data set (here, slow reads
    and 128 MiB built in chunks) while the other ranks wait at a barrier, then every rank loads
    its copy. Returns the loaded data (held for the run, as a data set in memory is)."""
    t0 = time.time()
    chunks = 16
    prepared: list[torch.Tensor] = []
    if rank == 0:
        for _ in range(chunks):
            prepared.append(torch.randn(PREPARED_BYTES // 4 // chunks))
            time.sleep(max(0.0, (0.8 * seconds) / chunks))  # slow storage
    dist.barrier()
    loaded = torch.empty(PREPARED_BYTES // 4)
    loaded.normal_()
    time.sleep(max(0.0, seconds - (time.time() - t0)))
    dist.barrier()
    return loaded


def main() -> None:
    p = parser()
    p.add_argument("--case", choices=CASES, default="none")
    p.add_argument("--startup", type=float, default=STARTUP_S, help="long_startup's seconds")
    args = p.parse_args()
    rank, world, device = setup()
    held = long_startup(rank, args.startup) if args.case == "long_startup" else None
    fixes = Fixes.parse(args.fix)
    fixes.say(rank, KNOWN)
    case, f = args.case, args.fault_rank
    periodic_on_rank0 = case in ("eval_rank0", "checkpoint_rank0")
    fault_rank = 0 if periodic_on_rank0 else f
    controls = ("none", "even_eval", "long_startup")
    faulty = rank == fault_rank and case not in controls
    # A stall's lever (the rank's work between steps) removes it: evaluation sharded over every
    # rank, a checkpoint saved off the step, logging off the step.
    levers = (
        "rank_work",
        "memory_release",
        "retained_tensors",
        "evaluation_on_all_ranks",
        "logging_off_step",
        "checkpoint_async",
    )
    removed = any(fixes.has(rank, lever) for lever in levers)
    # The evaluation's fix on rank 0 makes every rank evaluate its share.
    sharded = any(fixes.has(0, lever) for lever in ("rank_work", "evaluation_on_all_ranks"))
    # An extra module is held from the start, as an EMA copy is (the probe scans for modules
    # outside the model once at its first budget): its onset is the start.
    after = 0.0 if case == "memory_imbalance" else args.fault_after
    onset = Onset(rank, fault_rank, after, faulty=case not in controls)
    gate = Gate(onset, faulty and not removed)
    trace = MemoryTrace(rank, onset.at) if faulty and case == "memory_growth" else None
    kept: list[torch.Tensor] = []  # memory_growth: every step's loss, with its graph

    # --- data ---------------------------------------------------------------------------------
    workers = args.workers
    batch = args.batch_size
    read_delay = 0.0
    decode = 0
    cheap = fixes.has(rank, "loading_cost")
    if faulty and case in ("io_starvation", "accum_starvation") and not cheap:
        read_delay = 0.004
    if faulty and case == "cpu_starvation" and not cheap:
        decode, workers = 10, 0
    if faulty and case == "too_many_workers":
        decode, workers = 2, 8
    micro = 4 if case == "accum_starvation" else 1
    if micro > 1:
        batch = batch // micro
    uneven = faulty and case == "uneven_batch"
    if not uneven:
        batch = int(fixes.get(rank, "batch_size", batch))  # type: ignore[call-overload]
    workers = int(fixes.get(rank, "num_workers", workers))  # type: ignore[call-overload]
    dataset = Images(read_delay_s=read_delay, decode_work=decode, slow_from=onset.at)
    loader = make_loader(dataset, rank, world, batch, workers, device)
    batch_fix = fixes.get(rank, "batch_size")
    doubled = int(batch_fix) if uneven and batch_fix else batch * 2  # type: ignore[call-overload]
    uneven_loader = make_loader(dataset, rank, world, doubled, workers, device) if uneven else None

    # --- model --------------------------------------------------------------------------------
    net = Net(
        gate if case in ("forward_straggler", "slowdown") else None,
        gate if case == "backward_straggler" else None,
    )
    model = DDP(net.to(device))
    extra: nn.Module | None = None
    if gate and case == "memory_imbalance":
        extra = nn.Linear(8192, 8192)  # 256 MiB held beside the model: an EMA copy
        extra.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ckpt_dir = tempfile.mkdtemp(prefix="faults-ckpt-")
    # 256 MiB of training state a checkpoint carries (rank 0 only).
    state = torch.randn(64 * 2**20 if rank == 0 and case == "checkpoint_rank0" else 1)
    every_ckpt = int(fixes.get(0, "checkpoint_interval", EVERY))  # type: ignore[call-overload]
    saver: threading.Thread | None = None
    eval_x = torch.randn(32, 3, 32, 32)

    def evaluate(batches: int) -> None:
        model.eval()
        with torch.no_grad():
            for _ in range(batches):
                model.module(eval_x)
        model.train()

    def save() -> None:
        torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "state": state},
                   os.path.join(ckpt_dir, "last.pt"))  # fmt: skip

    agreed = torch.zeros(1)
    shard = torch.zeros(4 * 2**20)  # slow_transfer: 16 MiB of float32 a rank, gathered each step
    gathered_shards = [torch.empty_like(shard) for _ in range(world)]
    stopper = Stopper(args.seconds)
    step, epoch = 0, 0
    iterator = iter(loader)
    current = loader
    while True:
        onset.step_begins()
        if uneven_loader is not None and onset.on and current is not uneven_loader:
            current, iterator = uneven_loader, iter(uneven_loader)
        opt.zero_grad(set_to_none=True)
        for m in range(micro):
            try:
                x, y = next(iterator)
            except StopIteration:
                epoch += 1
                current.sampler.set_epoch(epoch)
                iterator = iter(current)
                x, y = next(iterator)
            sync = model.no_sync() if m < micro - 1 else contextlib.nullcontext()
            with sync:
                loss = loss_fn(model(x.to(device)), y.to(device)) / micro
                if case == "memory_growth" and gate:
                    loss.backward(retain_graph=True)
                    kept.append(loss)  # the leak: the loss kept with its graph
                else:
                    loss.backward()
        opt.step()
        step += 1
        if case in ("slow_transfer", "slow_collective"):
            # A collective only some ranks call hangs the job: the ranks agree on the onset
            # (each reads its own clock) before any of them calls it.
            agreed.fill_(1.0 if onset.on else 0.0)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        if case == "slow_transfer" and agreed.item():
            dist.all_gather(gathered_shards, shard)
        if case == "slow_collective" and agreed.item():
            payload = list(range(250_000)) if faulty and not removed else [0]
            gathered: list[object] = [None] * world
            dist.all_gather_object(gathered, {"metrics": payload})
        if step % EVERY == 0:
            if case == "periodic_stall" and gate:
                time.sleep(0.5)
            if case == "eval_rank0" and onset.on:
                if faulty and not removed:
                    evaluate(40)
                elif sharded:
                    evaluate(40 // world)  # the fix: every rank evaluates its share
            if case == "even_eval":
                evaluate(40 // world)
        if step % every_ckpt == 0 and case == "checkpoint_rank0" and faulty and onset.on:
            if removed:  # the fix: saved off the training thread
                if saver is None or not saver.is_alive():
                    saver = threading.Thread(target=save, daemon=True)
                    saver.start()
            else:
                save()
        onset.step_done()
        if trace is not None:
            trace.step_done(step)
        if stopper.done(step):
            break
    if saver is not None:
        saver.join()
    onset.report()
    if trace is not None:
        trace.report()
    del held, kept
    finish(rank, step)


if __name__ == "__main__":
    main()
