"""A PyTorch Lightning job: ``Trainer(strategy="ddp" or "ddp_spawn", accelerator="cpu",
devices=2)``. Lightning runs forward and backward inside ``optimizer.step(closure)``.

``--fault starved``: rank 1 reads each sample from slow storage (num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).

    python examples/frameworks/lightning_ddp.py --strategy ddp --fault starved
"""

from __future__ import annotations

import argparse
import tempfile
import time

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

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


class Classifier(L.LightningModule):
    def __init__(self, fault: str, delay: float, steps: int) -> None:
        super().__init__()
        self.fault, self.delay, self.steps = fault, delay, steps
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slow = self.fault == "slow" and self.global_rank == 1
        time.sleep(COMPUTE_S + (self.delay if slow else 0.0))
        return self.body(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader:
        torch.set_num_threads(1)
        starved = self.fault == "starved" and self.global_rank == 1
        data = Samples(self.steps * BATCH * 2, self.delay / BATCH if starved else 0.0)
        return DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", choices=("ddp", "ddp_spawn"), default="ddp")
    p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
    args = p.parse_args()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=args.strategy,
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-"),
    )
    trainer.fit(Classifier(args.fault, args.delay, args.steps))
    # Under ddp_spawn the ranks trained in spawned processes: this one only launched them.
    if trainer.global_rank == 0:
        print("fit done", flush=True)


if __name__ == "__main__":
    main()
