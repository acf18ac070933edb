"""Exclusive phases and named collectives on real jobs (gloo, CPU): two-rank torchrun jobs, and
single-process worlds (``world_size=1``) for the loop shapes where one rank shows the accounting.

Each two-rank job (``scripts/phases.py``) nests the phases the way a framework does: a closure
inside ``optimizer.step``, activation checkpointing, an explicit all-reduce after backward, a
gather between the batch and the forward (Hugging Face Trainer), FSDP2's ``fully_shard``. The
single-process jobs (:data:`SINGLE_SCRIPT`) cover DDP ``no_sync`` gradient accumulation, CPU
bfloat16 autocast, every kind of collective in one step, a metric sync between epochs and
collectives on another thread. For every step of every rank the phases must not overlap (they
add up to at most the step) and leave little unbooked; the collectives must carry their names.
The model's forward sleeps a known time, so the bounds below come from those sleeps, not from
how fast this machine is.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from auditor.samples import OFF_THREAD_COLLECTIVES, StepSample

from . import SCRIPTS, Job, JobResult, free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PHASES_SCRIPT = SCRIPTS / "phases.py"
FWD_S = 0.02  # the script's forward sleep per step
JOBS = {
    "closure": ["--slow-rank", "1"],
    "checkpoint": [],
    "allreduce": ["--slow-rank", "1"],
    "gather": ["--starve-rank", "1"],
    # 100 ms slower: both FSDP ranks also wait for each other's all-gathers, and on two busy
    # cores that noise reached ~40 ms (the 20 ms margin below failed once in a loaded run).
    "fsdp": ["--slow-rank", "1", "--slow-s", "0.1"],
    "fsdp1": ["--slow-rank", "1", "--slow-s", "0.1"],
}


def start(shape: str) -> Job:
    argv = [
        # --standalone: the rendezvous binds a free port itself (no race between jobs).
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(PHASES_SCRIPT), "--shape", shape, *JOBS[shape],
    ]  # fmt: skip
    return Job(argv, env={"AUDITOR_EXIT_WAIT_S": "10"})


def torn_down_badly(res: JobResult) -> bool:
    """Both ranks finished training, then one aborted while the interpreter shut down: gloo's
    worker threads at finalization (pytorch/pytorch#190489, #179291), rare on a loaded host."""
    done = all(f"RANK{r}_DONE=1" in res.stdout for r in (0, 1))
    return done and "terminate called without an active exception" in res.stderr


@pytest.fixture(scope="module")
def jobs() -> dict[str, JobResult]:
    # One job at a time: the tests compare phase times of a few steps, and six jobs' twelve
    # ranks started together on two cores made a descheduled copy or wait fail them now and
    # then.
    out = {}
    for shape in JOBS:
        res = start(shape).result(timeout=240, wait_rank_s=20, ranks=2)
        if res.returncode != 0 and torn_down_badly(res):
            res = start(shape).result(timeout=240, wait_rank_s=20, ranks=2)  # once more
        assert res.returncode == 0, (
            f"{shape}: rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        )
        out[shape] = res
    return out


def by_rank(res: JobResult) -> dict[int, list[StepSample]]:
    ranks: dict[int, list[StepSample]] = {}
    for s in res.steps:
        ranks.setdefault(s.rank, []).append(s)
    return ranks


def check_adds_up(res: JobResult, shape: str) -> dict[int, list[StepSample]]:
    ranks = by_rank(res)
    assert sorted(ranks) == [0, 1], f"{shape}: ranks {sorted(ranks)}"
    # Every collective of these loops runs on the training thread (CPU autograd included).
    for info in res.infos.values():
        assert OFF_THREAD_COLLECTIVES not in info.unmeasured, (shape, info)
        assert info.off_thread_collectives == 0, (shape, info)
    for r, steps in ranks.items():
        assert len(steps) >= 6, f"{shape} rank {r}: {len(steps)} steps"
        for s in steps:
            booked = s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0)
            # Exclusive: never more than the step (host marks on both sides: tiny slack only).
            assert booked <= s.step_s * 1.001 + 1e-4, f"{shape} rank {r}: overlap in {s}"
            if s.collective_ops is not None:
                assert sum(s.collective_ops.values()) == pytest.approx(s.collective_wait_s)
            # The batch's copies (Tensor.to after the batch arrived) are h2d, and only they are.
            assert s.h2d_s > 0.0, f"{shape} rank {r}: the batch's copy was not timed"
        # Little is left unbooked: the loop's own Python against sleeps of tens of ms.
        other = statistics.median(s.other_s / s.step_s for s in steps[1:])
        assert other < 0.2, f"{shape} rank {r}: {other:.0%} of the step in no phase"
    return ranks


def median(steps: list[StepSample], field: str) -> float:
    return statistics.median(float(getattr(s, field) or 0.0) for s in steps[1:])


def test_closure_inside_optimizer_step(jobs: dict[str, JobResult]) -> None:
    ranks = check_adds_up(jobs["closure"], "closure")
    for steps in ranks.values():
        for s in steps:
            assert s.forward_s >= FWD_S * 0.95  # the forward inside the closure is forward
            assert s.optimizer_s < s.forward_s  # ... and the optimizer keeps only its update
            assert s.collective_ops is not None and "ddp_allreduce" in s.collective_ops
    # Rank 1's forward sleeps 40 ms more: rank 0 waits for it at the gradient all-reduce.
    assert median(ranks[0], "collective_wait_s") > median(ranks[1], "collective_wait_s") + 0.02


def test_checkpoint_recompute_is_backward(jobs: dict[str, JobResult]) -> None:
    """Backward re-runs the checkpointed block, its 10 ms sleep included: that is backward, in
    the first steps too, where the probe's global module hooks see the block called at top
    level from inside backward."""
    ranks = check_adds_up(jobs["checkpoint"], "checkpoint")
    for steps in ranks.values():
        for s in steps:
            assert s.backward_s >= FWD_S / 2 * 0.95
            assert s.forward_s >= FWD_S * 0.95
            assert s.collective_ops is not None and "all_reduce" in s.collective_ops


def test_explicit_collectives_are_named_and_carved_out(jobs: dict[str, JobResult]) -> None:
    ranks = check_adds_up(jobs["allreduce"], "allreduce")
    for steps in ranks.values():
        for s in steps:
            assert s.collective_ops is not None
            named = {"ddp_allreduce", "all_reduce", "all_gather_object", "_broadcast_coalesced"}
            assert named <= set(s.collective_ops), s.collective_ops
    assert median(ranks[0], "collective_wait_s") > median(ranks[1], "collective_wait_s") + 0.02


def test_gather_before_forward_is_collective_not_h2d(jobs: dict[str, JobResult]) -> None:
    """Hugging Face Trainer's shape with a starved rank 1: rank 0 waits for it in the token
    count gather, between its batch's copy and its forward. That wait is collective wait."""
    ranks = check_adds_up(jobs["gather"], "gather")
    fast, starved = ranks[0], ranks[1]
    assert median(starved, "data_wait_s") > 0.04  # 4 items x 15 ms
    assert median(fast, "collective_wait_s") > 0.03
    for s in fast:
        assert s.collective_ops is not None and "all_gather_into_tensor" in s.collective_ops
        assert s.h2d_s < 0.25 * (s.collective_wait_s or 0.0)  # the CPU "copy" is no wait
    assert median(fast, "h2d_s") < 0.005
    for s in starved:
        assert s.data_cpu_s is not None and s.data_cpu_s < s.data_wait_s  # slept, not worked


@pytest.mark.parametrize("shape", ["fsdp", "fsdp1"])
def test_fsdp_is_recognised_and_its_collectives_timed(
    jobs: dict[str, JobResult], shape: str
) -> None:
    """FSDP2 ``fully_shard`` and FSDP1 ``FullyShardedDataParallel``: parallel mode ``fsdp``, the
    all-gathers and reduce-scatters named in the collective wait."""
    res = jobs[shape]
    ranks = check_adds_up(res, shape)
    assert {i.parallel_mode for i in res.infos.values()} == {"fsdp"}
    for steps in ranks.values():
        for s in steps:
            assert s.collective_ops is not None
            ops = set(s.collective_ops)
            assert any(o.startswith("all_gather") for o in ops), ops
            assert any(o.startswith("reduce_scatter") for o in ops), ops
            assert s.forward_s >= FWD_S * 0.95
    # Rank 1's forward is 100 ms slower: rank 0 waits for it in FSDP's collectives, and that
    # wait is not booked as its forward or backward.
    assert median(ranks[0], "collective_wait_s") > median(ranks[1], "collective_wait_s") + 0.02
    assert median(ranks[0], "forward_s") < median(ranks[1], "forward_s")


# --- single-process worlds ---------------------------------------------------------------------

# A loop that knows nothing of the auditor, one shape per ``--shape``:
#
# * ``nosync``: DDP, two micro-batches per optimizer step, the first under ``model.no_sync()``.
# * ``autocast``: DDP, the forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``.
# * ``collectives``: no DDP; an ``all_gather_object`` between the batch and the forward (the
#   copy window: it moves its pickled bytes with ``Tensor.to``), a ``broadcast`` and a
#   ``broadcast_object_list`` inside the forward, the loss ``all_reduce`` after backward and a
#   ``barrier`` before the optimizer step. The object collectives pickle an object that takes
#   ``SLOW_S`` to pickle: a wait inside the collective that the clock must book to it.
# * ``epochs``: two epochs; between them a metric sync (``all_reduce``, ``all_gather_object``)
#   after the loader raised ``StopIteration``.
# * ``offthread``: each step, another thread calls collectives and waits on the step's async
#   all-reduce; the script prints how many calls that thread made.
SINGLE_SCRIPT = """
import argparse
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--shape", required=True)
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()

FWD_S, SLOW_S, BATCH = 0.01, 0.05, 4
ACCUM = 2 if args.shape == "nosync" else 1
EPOCHS = 2 if args.shape == "epochs" else 1
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)


class Items(Dataset):
    def __len__(self):
        return args.steps * BATCH * ACCUM // EPOCHS

    def __getitem__(self, i):
        x = torch.randn(16, generator=torch.Generator().manual_seed(i))
        return x, x.sum(dim=0, keepdim=True)


class Slow:
    # Pickled inside an object collective: SLOW_S of that collective's own time.
    def __reduce__(self):
        time.sleep(SLOW_S)
        return (Slow, ())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        time.sleep(FWD_S)
        h = torch.relu(self.lin(x))
        if args.shape == "collectives":
            dist.broadcast(h.detach().clone(), src=0)
            dist.broadcast_object_list([Slow()], src=0)
        return self.head(h)


net = Net()
model = nn.parallel.DistributedDataParallel(net) if args.shape in ("nosync", "autocast") else net
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(Items(), batch_size=BATCH)
off_thread_calls = 0


def copy(x, y):
    # The batch's "copy to the device": a real copy on CPU (a round trip through float64).
    return x.to(torch.float64).to(torch.float32), y.to(torch.float64).to(torch.float32)


def off_thread(work):
    global off_thread_calls
    dist.all_reduce(torch.ones(1))
    dist.all_gather_object([None], 1.0)
    work.wait()
    off_thread_calls += 3


for epoch in range(EPOCHS):
    for i, (x, y) in enumerate(data):
        if args.shape == "collectives":
            gathered = [None]
            dist.all_gather_object(gathered, Slow())  # in the copy window, before any copy
        else:
            x, y = copy(x, y)
        if args.shape == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        else:
            loss = nn.functional.mse_loss(model(x), y) / ACCUM
        if args.shape == "nosync" and i % ACCUM == 0:
            with model.no_sync():
                loss.backward()
            continue
        loss.backward()
        if args.shape == "collectives":
            total = loss.detach().clone()
            dist.all_reduce(total)
            dist.barrier()
        if args.shape == "offthread":
            work = dist.all_reduce(loss.detach().clone(), async_op=True)
            t = threading.Thread(target=off_thread, args=(work,))
            t.start()
            t.join()
        opt.step()
        opt.zero_grad()
    if args.shape == "epochs":
        # The metric sync between epochs, after the loader's StopIteration.
        metric = torch.tensor([float(epoch)])
        dist.all_reduce(metric)
        dist.all_gather_object([None], Slow())

print(f"OFF_THREAD_CALLS={off_thread_calls}", flush=True)
print("DONE=1", flush=True)
dist.destroy_process_group()
"""
SINGLE_SHAPES = ("nosync", "autocast", "collectives", "epochs", "offthread")
SINGLE_FWD_S, SLOW_S = 0.01, 0.05  # the script's forward sleep, and an object's pickling


@pytest.fixture(scope="module")
def single() -> Iterator[dict[str, JobResult]]:
    with tempfile.TemporaryDirectory(prefix="aud") as tmp:
        script = Path(tmp) / "single.py"
        script.write_text(SINGLE_SCRIPT)
        started = {
            shape: Job(
                [str(script), "--shape", shape],
                env={
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(free_port()),
                    "AUDITOR_EXIT_WAIT_S": "10",
                },
            )
            for shape in SINGLE_SHAPES
        }
        out = {}
        for shape, job in started.items():
            res = job.result(timeout=240, wait_rank_s=20)
            assert res.returncode == 0 and "DONE=1" in res.stdout, (
                f"{shape}: rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
            )
            out[shape] = res
        yield out


def adds_up(s: StepSample, what: str) -> None:
    """Exclusive phases: never more than the step, the ops adding up to the collective wait."""
    booked = s.data_wait_s + s.compute_s + (s.collective_wait_s or 0.0)
    assert booked <= s.step_s * 1.001 + 1e-4, f"{what}: overlap in {s}"
    for phase in ("data_wait_s", "h2d_s", "forward_s", "backward_s", "optimizer_s"):
        assert getattr(s, phase) >= 0.0, f"{what}: {phase} < 0 in {s}"
    if s.collective_ops is not None:
        assert sum(s.collective_ops.values()) == pytest.approx(s.collective_wait_s)


def steps_of(res: JobResult, shape: str, *, booked: bool = True) -> list[StepSample]:
    """The job's steps, each checked to add up; ``booked``: little of the step is left in no
    phase (the loop's own Python against sleeps of tens of ms)."""
    steps = sorted(res.steps, key=lambda s: s.step)
    assert {s.rank for s in steps} == {0}
    assert len(steps) >= 6, f"{shape}: {len(steps)} steps\n{res.stderr[-2000:]}"
    for s in steps:
        adds_up(s, shape)
    if booked:
        other = statistics.median(s.other_s / s.step_s for s in steps[1:])
        assert other < 0.25, f"{shape}: {other:.0%} of the step in no phase"
    return steps


def test_no_sync_gradient_accumulation(single: dict[str, JobResult]) -> None:
    """Two micro-batches a step, the first under ``no_sync``: one step per optimizer step with
    both batches, both forwards and backwards, and DDP's all-reduce of the second only."""
    for s in steps_of(single["nosync"], "nosync"):
        assert s.batch_size == 8  # both micro-batches of the step
        assert s.forward_s >= 2 * SINGLE_FWD_S * 0.95
        assert s.h2d_s > 0.0  # both batches' copies
        assert s.collective_ops is not None and "ddp_allreduce" in s.collective_ops


def test_autocast_bf16_on_cpu(single: dict[str, JobResult]) -> None:
    """The forward under CPU bfloat16 autocast: the casts are the forward's, not a copy."""
    for s in steps_of(single["autocast"], "autocast"):
        assert s.batch_size == 4
        assert s.forward_s >= SINGLE_FWD_S * 0.95
        assert s.h2d_s > 0.0
        assert s.collective_ops is not None and "ddp_allreduce" in s.collective_ops


def test_every_collective_in_a_step_is_named_collective_wait(
    single: dict[str, JobResult],
) -> None:
    """A loss all_reduce, a barrier, a broadcast and a broadcast_object_list (inside forward),
    an all_gather_object in the copy window: each is named and booked as collective wait; the
    copies those object collectives make with ``Tensor.to`` are theirs, never h2d (the loop
    copies nothing in this shape), and their pickling is not forward."""
    steps = steps_of(single["collectives"], "collectives")
    named = {"all_reduce", "barrier", "broadcast", "broadcast_object_list", "all_gather_object"}
    for s in steps:
        assert s.collective_ops is not None and named <= set(s.collective_ops), s.collective_ops
        assert s.h2d_s == 0.0, f"a collective's copy booked as h2d: {s}"
        assert (s.collective_wait_s or 0.0) >= 2 * SLOW_S * 0.95
    ops = [s.collective_ops or {} for s in steps]
    assert statistics.median(o["broadcast_object_list"] for o in ops) >= SLOW_S * 0.95
    assert statistics.median(o["all_gather_object"] for o in ops) >= SLOW_S * 0.95
    # The forward keeps its own sleep, not the object collective's pickling inside it.
    assert statistics.median(s.forward_s for s in steps) < SLOW_S


def test_each_collective_books_the_bytes_it_carries(single: dict[str, JobResult]) -> None:
    """NCCL-tests' size per op and step: the broadcast's (4, 16) float32 activations, the loss
    all_reduce's one float; the object collectives and the barrier carry no known bytes. Under
    DDP, the gradient buckets: every parameter of the Linear(16, 16) and Linear(16, 1) once."""
    for s in steps_of(single["collectives"], "collectives"):
        assert s.collective_bytes == {"broadcast": 4 * 16 * 4, "all_reduce": 4}, s
    params = (16 * 16 + 16 + 16 + 1) * 4
    synced = [s for s in steps_of(single["autocast"], "autocast") if s.collective_bytes]
    assert synced and all(s.collective_bytes == {"ddp_allreduce": params} for s in synced)


def test_metric_sync_between_epochs_is_collective_wait(single: dict[str, JobResult]) -> None:
    """The loader ends its epoch with StopIteration: the data phase must end there too, or the
    metric sync after it reads as loading and goes untimed."""
    steps = steps_of(single["epochs"], "epochs")
    synced = [s for s in steps if s.collective_ops and "all_reduce" in s.collective_ops]
    assert len(synced) == 1, [s.collective_ops for s in steps]
    s = synced[0]
    assert s.step == 3  # the first step of the second epoch holds the sync before it
    assert s.collective_ops is not None
    assert s.collective_ops["all_gather_object"] >= SLOW_S * 0.95
    assert s.data_wait_s < SLOW_S  # not booked as data wait either
    for other in steps:
        if other is not s:
            assert not other.collective_ops, other


def test_collectives_off_the_training_thread_are_counted_not_timed(
    single: dict[str, JobResult],
) -> None:
    """Another thread's collectives are no phase of the step: the rank counts them and says
    they were not measured (the nested all_gather inside all_gather_object is not counted
    twice; a wait on the step's async all-reduce from that thread is counted once)."""
    res = single["offthread"]
    steps = steps_of(res, "offthread", booked=False)  # the other thread's time is in no phase
    calls = int(res.printed("OFF_THREAD_CALLS"))
    assert calls == 3 * len(steps)
    info = res.infos[0]
    assert OFF_THREAD_COLLECTIVES in info.unmeasured
    assert info.off_thread_collectives == calls
    for s in steps:
        assert not s.collective_ops, s  # nothing of the other thread's in the step
