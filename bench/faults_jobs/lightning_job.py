"""A PyTorch Lightning DDP job (``examples/frameworks/workload.py``'s workload, on CPU) for
``bench/faults.py``: ``--case starvation`` makes rank 1 read each sample from slow storage from
``--fault-after`` seconds on (no DataLoader worker); ``--case none`` is balanced (a control).

    python bench/faults_jobs/lightning_job.py --case starvation [--fix 1.num_workers=4]

Knobs (``--fix``): ``num_workers``, ``persistent_workers`` and ``pin_memory`` of the rank's
training loader, ``loading_cost`` (cheap reads).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "frameworks"))
sys.path.insert(0, HERE)

import lightning as L  # noqa: E402
import torch  # noqa: E402
from knobs import Fixes, Onset, Stopper, parser  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from workload import BATCH, COMPUTE_S, device_time  # noqa: E402

KNOWN = ("num_workers", "persistent_workers", "pin_memory", "loading_cost")
READ_S = 0.005  # per sample on the starved rank: 40 ms a batch of 8, above the 30 ms step


class Samples(Dataset):
    """``slow_from`` is shared with the module: its first element is the onset, set when
    training starts (Lightning builds the loader before that, and iterates it after)."""

    def __init__(self, n: int, read_delay_s: float, slow_from: list[float]) -> None:
        self.n, self.read_delay_s, self.slow_from = n, read_delay_s, slow_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_delay_s and time.time() >= self.slow_from[0]:
            time.sleep(self.read_delay_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.tensor(i % 4)


class Classifier(L.LightningModule):
    def __init__(self, case: str, fault_rank: int, fixes: Fixes) -> None:
        super().__init__()
        self.case, self.fault_rank, self.fixes = case, fault_rank, fixes
        self.at = [time.time() + 3600.0]  # the onset, once training starts
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_time(COMPUTE_S)
        return self.body(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader:
        torch.set_num_threads(1)
        rank = self.global_rank
        slow = self.case == "starvation" and rank == self.fault_rank
        slow = slow and not self.fixes.has(rank, "loading_cost")
        workers = int(self.fixes.get(rank, "num_workers", 0))  # type: ignore[call-overload]
        persistent = bool(self.fixes.get(rank, "persistent_workers", False)) and workers > 0
        data = Samples(200_000, READ_S if slow else 0.0, self.at)
        return DataLoader(
            data, batch_size=BATCH, shuffle=True, num_workers=workers,
            persistent_workers=persistent,
        )  # fmt: skip


class Clock(L.Callback):
    """The onset's rate, and rank 0's decision to stop after ``--seconds``."""

    def __init__(self, seconds: float, fault_rank: int, after: float, case: str) -> None:
        self.seconds, self.fault_rank, self.after, self.case = seconds, fault_rank, after, case
        self.onset: Onset | None = None
        self.stopper: Stopper | None = None
        self.step = 0

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        rank = trainer.global_rank
        self.onset = Onset(rank, self.fault_rank, self.after, faulty=self.case != "none")
        assert isinstance(module, Classifier)
        module.at[0] = self.onset.at
        self.stopper = Stopper(self.seconds)

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        assert self.onset is not None and self.stopper is not None
        self.step += 1
        self.onset.step_done()
        if self.stopper.done(self.step):
            trainer.should_stop = True

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self.onset is not None:
            self.onset.report()


def main() -> None:
    p = parser()
    p.add_argument("--case", choices=("none", "starvation"), default="none")
    args = p.parse_args()
    fixes = Fixes.parse(args.fix)
    clock = Clock(args.seconds, args.fault_rank, args.fault_after, args.case)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=1_000_000,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tempfile.mkdtemp(prefix="lightning-"),
        callbacks=[clock],
    )
    module = Classifier(args.case, args.fault_rank, fixes)
    fixes.say(int(os.environ.get("LOCAL_RANK", "0")), KNOWN)
    trainer.fit(module)
    if trainer.global_rank == 0:
        print("fit done", flush=True)


if __name__ == "__main__":
    main()
