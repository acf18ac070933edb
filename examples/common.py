"""A small image-classification workload shared by the examples: model, dataset, loop.

Sized to run on CPUs (gloo) in seconds; on GPUs the same scripts use NCCL and CUDA.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def parse_args(**defaults: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--seconds", type=float, default=defaults.get("seconds", 12.0), help="train this long"
    )
    p.add_argument("--max-steps", type=int, default=defaults.get("max_steps", 100_000))
    p.add_argument("--batch-size", type=int, default=defaults.get("batch_size", 32))
    p.add_argument("--workers", type=int, default=defaults.get("workers", 1))
    p.add_argument("--fault-rank", type=int, default=1, help="the rank that misbehaves")
    p.add_argument("--fault-after", type=float, default=0.0, help="seconds before the fault starts")
    return p.parse_args()


def setup() -> tuple[int, int, torch.device]:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        return rank, world, torch.device("cuda", local)
    torch.set_num_threads(1)
    return rank, world, torch.device("cpu")


class SyntheticImages(Dataset):
    """Deterministic fake 3x32x32 images. ``read_delay_s`` mimics slow storage per sample and
    ``decode_work`` mimics CPU-heavy decoding (matrix products on the host)."""

    def __init__(
        self,
        n: int = 50_000,
        read_delay_s: float = 0.0,
        decode_work: int = 0,
        slow_from: float = 0.0,
    ) -> None:
        self.n = n
        self.read_delay_s = read_delay_s
        self.decode_work = decode_work
        self.slow_from = slow_from  # wall-clock time from which reads are slow (0: always)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(3, 32, 32, generator=g)
        if self.read_delay_s and time.time() >= self.slow_from:
            time.sleep(self.read_delay_s)
        if self.decode_work:
            # Decoding with a numpy/BLAS library, as image and audio codecs often do.
            m = np.random.default_rng(i).standard_normal((160, 160), dtype=np.float32)
            for _ in range(self.decode_work):
                m = np.tanh(m @ m)
            x = x + float(m.mean()) * 1e-6
        return x, i % 10


class SmallConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(32 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def make_loader(
    dataset: Dataset, rank: int, world: int, batch_size: int, workers: int, device: torch.device
) -> DataLoader:
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
    )


def train(
    model: nn.Module, loader: DataLoader, device: torch.device, *, seconds: float, max_steps: int
) -> int:
    """An ordinary loop. Every rank runs the same number of steps (rank 0 decides when to stop,
    so ranks never disagree at the all-reduce)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    start, step, epoch = time.time(), 0, 0
    stop = torch.zeros(1)
    while True:
        loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            step += 1
            if step % 10 == 0:
                stop.fill_(1.0 if time.time() - start >= seconds or step >= max_steps else 0.0)
                dist.broadcast(stop, src=0)
                if stop.item():
                    return step
        epoch += 1


def finish(rank: int, steps: int) -> None:
    if rank == 0:
        print(f"trained {steps} steps", flush=True)
    dist.destroy_process_group()
