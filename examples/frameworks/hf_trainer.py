"""A Hugging Face ``Trainer`` job: a tiny GPT-2 built from a config (nothing downloaded) on
synthetic token sequences, launched with torchrun on CPU.

``--fault starved``: rank 1 reads each sample from slow storage (dataloader_num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).

    torchrun --nproc_per_node=2 examples/frameworks/hf_trainer.py --fault starved
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BATCH = 8
SEQ = 32


class Tokens(Dataset):
    """Synthetic token sequences; ``read_delay_s`` mimics slow storage per sample."""

    def __init__(self, n: int, read_delay_s: float) -> None:
        self.n, self.read_delay_s = n, read_delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.read_delay_s:
            time.sleep(self.read_delay_s)
        ids = torch.randint(0, 128, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


# Every rank's forward stands in for device compute with a sleep (these examples run on CPU):
# a step of tens of milliseconds, as real steps are, so the frameworks' own bookkeeping between
# phases is the small share it is on a real job.
COMPUTE_S = 0.03


class SlowGPT2(GPT2LMHeadModel):
    """The same model with extra work in every forward (a slower device, say)."""

    extra_s = COMPUTE_S

    # Named parameters: the Trainer keeps only the dataset columns that forward names.
    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        time.sleep(self.extra_s)
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
    args = p.parse_args()
    torch.set_num_threads(1)
    faulty = int(os.environ.get("RANK", "0")) == 1
    config = GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    if faulty and args.fault == "slow":
        SlowGPT2.extra_s = COMPUTE_S + args.delay
    model: GPT2LMHeadModel = SlowGPT2(config)
    starved = faulty and args.fault == "starved"
    data = Tokens(args.steps * BATCH * 2, args.delay / BATCH if starved else 0.0)
    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        max_steps=args.steps,
        per_device_train_batch_size=BATCH,
        learning_rate=1e-3,
        use_cpu=True,
        dataloader_num_workers=0,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    result = Trainer(model=model, args=training, train_dataset=data).train()
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"trained {result.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
