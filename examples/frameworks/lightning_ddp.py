"""A PyTorch Lightning job: ``Trainer(strategy="ddp" or "ddp_spawn", accelerator="cpu",
devices=2)``. Lightning runs forward and backward inside ``optimizer.step(closure)``.

Faults: see ``workload.py``; ``--accumulate N`` sets ``accumulate_grad_batches``.
``--val-every N`` validates every N steps (the sanity check first) on a loader of its own with
``--val-workers`` workers, as jobs often give their validation other workers than their
training.

    python examples/frameworks/lightning_ddp.py --strategy ddp --fault starved
"""

from __future__ import annotations

import tempfile

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader
from workload import BATCH, Fault, Samples, device_time, fault_parser


class Classifier(L.LightningModule):
    def __init__(
        self, fault: str, delay: float, steps: int, val_workers: int = 0, accumulate: int = 1
    ) -> None:
        super().__init__()
        self.fault, self.delay, self.steps = fault, delay, steps
        self.accumulate = accumulate
        self.val_workers = val_workers
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_time(Fault.of(self.fault, self.delay, self.global_rank).forward_s)
        return self.body(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader:
        torch.set_num_threads(1)
        fault = Fault.of(self.fault, self.delay, self.global_rank)
        data = Samples(self.steps * BATCH * self.accumulate * 2, fault.read_s)
        return DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=0)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y), sync_dist=True)

    def val_dataloader(self) -> DataLoader:
        fault = Fault.of(self.fault, self.delay, self.global_rank)
        data = Samples(4 * BATCH * 2, fault.read_s)
        return DataLoader(data, batch_size=BATCH, num_workers=self.val_workers)


def main() -> None:
    p = fault_parser()
    p.add_argument("--strategy", choices=("ddp", "ddp_spawn"), default="ddp")
    p.add_argument("--val-every", type=int, default=0, help="steps between validations")
    p.add_argument("--val-workers", type=int, default=0)
    args = p.parse_args()
    # Lightning validates every epoch once a module defines validation: only when asked here.
    val = (
        {"val_check_interval": args.val_every, "check_val_every_n_epoch": None}
        if args.val_every
        else {"limit_val_batches": 0}
    )
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
        accumulate_grad_batches=args.accumulate,
        **val,
    )
    trainer.fit(Classifier(args.fault, args.delay, args.steps, args.val_workers, args.accumulate))
    # Under ddp_spawn the ranks trained in spawned processes: this one only launched them.
    if trainer.global_rank == 0:
        print("fit done", flush=True)
    # Lightning leaves the process group up; gloo can abort at exit when it is not taken down.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
