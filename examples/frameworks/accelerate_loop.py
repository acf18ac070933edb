"""A plain Hugging Face Accelerate loop: ``Accelerator().prepare`` and ``accelerator.backward``.

``--fault starved``: rank 1 reads each sample from slow storage (num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).

    accelerate launch --multi_gpu --num_processes 2 examples/frameworks/accelerate_loop.py
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
p.add_argument("--steps", type=int, default=60)
p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
args = p.parse_args()

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
torch.set_num_threads(1)
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


faulty = rank == 1
data = Samples(
    args.steps * BATCH * accelerator.num_processes,
    args.delay / BATCH if faulty and args.fault == "starved" else 0.0,
)
model = Net(COMPUTE_S + (args.delay if faulty and args.fault == "slow" else 0.0))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=0)
model, opt, loader = accelerator.prepare(model, opt, loader)

steps = 0
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    accelerator.backward(loss)
    opt.step()
    steps += 1
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    print(f"trained {steps} steps", flush=True)
accelerator.end_training()
