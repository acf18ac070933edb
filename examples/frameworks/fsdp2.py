"""An FSDP2 job: ``fully_shard`` on each block and on the root, over gloo on CPU (NCCL and CUDA
when a GPU is present). Parameters are gathered before each block's forward and backward, and
gradients reduce-scattered after: FSDP's collectives, not DDP's all-reduce.

``--fault starved``: rank 1 reads each sample from slow storage (num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).

    torchrun --nproc_per_node=2 examples/frameworks/fsdp2.py --fault starved
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

BATCH = 8


class Samples(Dataset):
    """Synthetic features; ``read_delay_s`` mimics slow storage per sample."""

    def __init__(self, n: int, read_delay_s: float) -> None:
        self.n, self.read_delay_s = n, read_delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.tensor(i % 4)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


# Every rank's forward stands in for device compute with a sleep (these examples run on CPU):
# a step of tens of milliseconds, as real steps are, so the frameworks' own bookkeeping between
# phases is the small share it is on a real job.
COMPUTE_S = 0.03


class Net(nn.Module):
    def __init__(self, extra_s: float, width: int = 64, depth: int = 3) -> None:
        super().__init__()
        self.extra_s = extra_s
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_s:
            time.sleep(self.extra_s)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)
    device = torch.device("cuda") if cuda else torch.device("cpu")
    faulty = rank == 1
    model = Net(COMPUTE_S + (args.delay if faulty and args.fault == "slow" else 0.0)).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    starved = faulty and args.fault == "starved"
    data = Samples(args.steps * BATCH * world, args.delay / BATCH if starved else 0.0)
    loader = DataLoader(
        data, batch_size=BATCH, sampler=DistributedSampler(data, world, rank), num_workers=0
    )
    steps = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        steps += 1
    if rank == 0:
        print(f"trained {steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
