"""What every framework example shares: the fault options, a synthetic dataset and the time
each rank's forward takes.

``--fault starved``: rank 1 reads each sample from slow storage (num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).
``--accumulate N`` (HF Trainer and Lightning): N micro-batches of ``BATCH`` per optimizer step.

Ray Train's example keeps its own copy: its workers unpickle the training function where this
folder is not importable.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

BATCH = 8
# Every rank's forward stands in for device compute with a sleep (these examples run on CPU):
# a step of tens of milliseconds, as real steps are, so the frameworks' own bookkeeping between
# phases is the small share it is on a real job.
COMPUTE_S = 0.03


def fault_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
    # Gradient accumulation: micro-batches of BATCH per optimizer step (HF Trainer's
    # gradient_accumulation_steps, Lightning's accumulate_grad_batches).
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    return p


@dataclass(frozen=True)
class Fault:
    """What ``--fault`` costs one rank: seconds per sample read, seconds per forward."""

    read_s: float
    forward_s: float

    @classmethod
    def of(cls, fault: str, delay: float, rank: int) -> Fault:
        faulty = rank == 1
        return cls(
            read_s=delay / BATCH if faulty and fault == "starved" else 0.0,
            forward_s=COMPUTE_S + (delay if faulty and fault == "slow" else 0.0),
        )


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


def device_time(seconds: float) -> None:
    """The forward's compute, as a sleep: these examples run on CPUs shared by every rank."""
    time.sleep(seconds)
