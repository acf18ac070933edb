"""A DDP job started with ``torch.multiprocessing.spawn`` instead of torchrun.

``--fault starved``: rank 1 reads each sample from slow storage (num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).

    python examples/frameworks/mp_spawn.py --fault slow
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

BATCH = 8
WORLD = 2


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


# Every rank's forward stands in for device compute with a sleep (these examples run on CPU):
# a step of tens of milliseconds, as real steps are, so the frameworks' own bookkeeping between
# phases is the small share it is on a real job.
COMPUTE_S = 0.03


class Net(nn.Module):
    def __init__(self, extra_s: float) -> None:
        super().__init__()
        self.extra_s = extra_s
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_s:
            time.sleep(self.extra_s)
        return self.body(x)


def worker(rank: int, port: int, fault: str, steps: int, delay: float) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    faulty = rank == 1
    model = DDP(Net(COMPUTE_S + (delay if faulty and fault == "slow" else 0.0)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Samples(steps * BATCH * WORLD, delay / BATCH if faulty and fault == "starved" else 0.0)
    loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, WORLD, rank))
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(port, args.fault, args.steps, args.delay), nprocs=WORLD)
    print("spawned job done", flush=True)


if __name__ == "__main__":
    main()
