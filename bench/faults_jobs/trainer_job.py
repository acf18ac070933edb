"""A Hugging Face ``Trainer`` job (a tiny GPT-2 built from a config, nothing downloaded; on CPU)
for ``bench/faults.py``: ``--case starvation`` makes rank 1 read each sample from slow storage
from ``--fault-after`` seconds after training starts (no DataLoader worker); ``--case none`` is
balanced.

    torchrun --nproc_per_node=2 bench/faults_jobs/trainer_job.py --case starvation

Knobs (``--fix``): ``num_workers`` (the rank's ``dataloader_num_workers``),
``persistent_workers``, ``pin_memory``, ``loading_cost`` (cheap reads).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "frameworks"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from knobs import Fixes, Onset, Stopper, parser  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from workload import BATCH, COMPUTE_S, device_time  # noqa: E402

SEQ = 32
KNOWN = ("num_workers", "persistent_workers", "pin_memory", "loading_cost")
READ_S = 0.005  # per sample on the starved rank: 40 ms a batch of 8


class Tokens(Dataset):
    """``slow_from[0]``: the onset, set when training starts (workers start after that)."""

    def __init__(self, n: int, read_delay_s: float, slow_from: list[float]) -> None:
        self.n, self.read_delay_s, self.slow_from = n, read_delay_s, slow_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.read_delay_s and time.time() >= self.slow_from[0]:
            time.sleep(self.read_delay_s)
        ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class TimedGPT2(GPT2LMHeadModel):
    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        device_time(COMPUTE_S)
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


class Clock(TrainerCallback):
    def __init__(self, rank: int, args: Any, at: list[float]) -> None:
        self.rank, self.args, self.at = rank, args, at
        self.onset: Onset | None = None
        self.stopper: Stopper | None = None
        self.step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        a = self.args
        self.onset = Onset(self.rank, a.fault_rank, a.fault_after, faulty=a.case != "none")
        self.at[0] = self.onset.at
        self.stopper = Stopper(a.seconds)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        assert self.onset is not None and self.stopper is not None
        self.step += 1
        self.onset.step_done()
        if self.stopper.done(self.step):
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.onset is not None:
            self.onset.report()


def main() -> None:
    p = parser()
    p.add_argument("--case", choices=("none", "starvation"), default="none")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    fixes = Fixes.parse(args.fix)
    fixes.say(rank, KNOWN)
    slow = args.case == "starvation" and rank == args.fault_rank
    slow = slow and not fixes.has(rank, "loading_cost")
    workers = int(fixes.get(rank, "num_workers", 0))  # type: ignore[call-overload]
    at = [time.time() + 3600.0]
    config = GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        max_steps=1_000_000,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        use_cpu=True,
        dataloader_num_workers=workers,
        dataloader_persistent_workers=bool(fixes.get(rank, "persistent_workers")) and workers > 0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    data = Tokens(2_000_000, READ_S if slow else 0.0, at)
    clock = Clock(rank, args, at)
    trainer = Trainer(model=TimedGPT2(config), args=training, train_dataset=data, callbacks=[clock])
    result = trainer.train()
    if rank == 0:
        print(f"trained {result.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
