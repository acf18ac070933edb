"""A DDP job started with ``torch.multiprocessing.spawn`` instead of torchrun.

Faults: see ``workload.py``.

    python examples/frameworks/mp_spawn.py --fault slow
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from workload import BATCH, Fault, Samples, device_time, fault_parser

WORLD = 2


class Net(nn.Module):
    def __init__(self, forward_s: float) -> None:
        super().__init__()
        self.forward_s = forward_s
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_time(self.forward_s)
        return self.body(x)


def worker(rank: int, port: int, fault: str, steps: int, delay: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    cost = Fault.of(fault, delay, rank)
    model = DDP(Net(cost.forward_s))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Samples(steps * BATCH * WORLD, cost.read_s)
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, WORLD, rank))
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


def main() -> None:
    args = fault_parser().parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.fault, args.steps, args.delay), nprocs=WORLD)
    print("spawned job done", flush=True)


if __name__ == "__main__":
    main()
