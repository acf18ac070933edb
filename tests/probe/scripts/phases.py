"""Two-rank jobs (torchrun, gloo, CPU) whose loops nest the phases the way frameworks do, for
the exclusive-phase tests. It knows nothing of the auditor. Known sleeps make each phase long
enough to see: the model's forward sleeps ``FWD_S``; ``--slow-rank`` sleeps more in forward on
that rank; ``--starve-rank`` makes that rank's loading slow (its peer then waits in the next
collective).

Shapes (``--shape``):

* ``closure``: DDP, forward and backward inside ``optimizer.step(closure)`` (Lightning).
* ``checkpoint``: the model's second block under ``torch.utils.checkpoint`` (backward re-runs
  its forward, sleep included), no DDP wrapper (so the probe's global module hooks, which find
  the model in the first steps, see the recompute's top-level call inside backward), gradients
  all-reduced by hand.
* ``allreduce``: DDP over a model with a BatchNorm (DDP broadcasts its buffers at each
  forward), then an explicit ``dist.all_reduce`` of the loss after backward and an
  ``all_gather_object`` of a metric.
* ``gather``: no DDP wrapper: a token count ``all_gather_into_tensor`` between the batch's copy
  and the forward (Hugging Face Trainer), gradients all-reduced by hand before the step.
* ``fsdp``: FSDP2 ``fully_shard`` on each block and the root.
* ``fsdp1``: FSDP1 ``FullyShardedDataParallel`` around the model (CPU, gloo).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, Dataset, DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--shape", required=True)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-s", type=float, default=0.04, help="the slow rank's extra forward sleep")
p.add_argument("--starve-rank", type=int, default=-1)
args = p.parse_args()

FWD_S = 0.02
torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
BATCH = 4


class Items(Dataset):
    def __len__(self) -> int:
        return args.steps * BATCH * dist.get_world_size()

    def __getitem__(self, i: int):
        if rank == args.starve_rank:
            time.sleep(0.015)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, x.sum(dim=0, keepdim=True)


class Sleep(nn.Module):
    def __init__(self, s: float) -> None:
        super().__init__()
        self.s = s
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.s)
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        extra = args.slow_s if rank == args.slow_rank else 0.0
        self.a = Sleep(FWD_S / 2 + extra)
        self.b = Sleep(FWD_S / 2)
        self.head = nn.Linear(16, 1)
        self.norm = nn.BatchNorm1d(16) if args.shape == "allreduce" else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(self.norm(x))
        x = checkpoint(self.b, x, use_reentrant=False) if args.shape == "checkpoint" else self.b(x)
        return self.head(x)


net = Net()
if args.shape == "fsdp":
    from torch.distributed.fsdp import fully_shard

    fully_shard(net.a)
    fully_shard(net.b)
    model: nn.Module = fully_shard(net)
elif args.shape == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel

    model = FullyShardedDataParallel(net, device_id=torch.device("cpu"))
elif args.shape in ("gather", "checkpoint"):
    model = net
else:
    model = nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(Items(), batch_size=BATCH, sampler=DistributedSampler(Items(), shuffle=False))

for x, y in data:
    # The batch's "copy to the device": a real copy on CPU (a round trip through float64).
    x, y = x.to(torch.float64).to(torch.float32), y.to(torch.float64).to(torch.float32)
    if args.shape == "closure":

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
        continue
    if args.shape == "gather":
        count = torch.tensor([float(x.numel())])
        counts = torch.zeros(dist.get_world_size())
        dist.all_gather_into_tensor(counts, count)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    if args.shape in ("gather", "checkpoint"):
        for prm in model.parameters():
            dist.all_reduce(prm.grad)
    if args.shape == "allreduce":
        total = loss.detach().clone()
        dist.all_reduce(total)
        metrics: list[object] = [None] * dist.get_world_size()
        dist.all_gather_object(metrics, float(total))
    opt.step()

print(f"RANK{rank}_DONE=1", flush=True)
dist.destroy_process_group()
