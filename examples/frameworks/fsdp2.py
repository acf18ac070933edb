"""An FSDP2 job: ``fully_shard`` on each block and on the root, over gloo on CPU (NCCL and CUDA
when a GPU is present). Parameters are gathered before each block's forward and backward, and
gradients reduce-scattered after: FSDP's collectives, not DDP's all-reduce.

Faults: see ``workload.py``.

    torchrun --nproc_per_node=2 examples/frameworks/fsdp2.py --fault starved
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from workload import BATCH, Fault, Samples, device_time, fault_parser


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, forward_s: float, width: int = 64, depth: int = 3) -> None:
        super().__init__()
        self.forward_s = forward_s
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_time(self.forward_s)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    args = fault_parser().parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)
    device = torch.device("cuda") if cuda else torch.device("cpu")
    fault = Fault.of(args.fault, args.delay, rank)
    model = Net(fault.forward_s).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Samples(args.steps * BATCH * world, fault.read_s)
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
