"""A Hugging Face ``Trainer`` job: a tiny GPT-2 built from a config (nothing downloaded) on
synthetic token sequences, launched with torchrun on CPU.

Faults: see ``workload.py`` (the loader here is the Trainer's, ``dataloader_num_workers=0``);
``--accumulate N`` sets ``gradient_accumulation_steps``.

    torchrun --nproc_per_node=2 examples/frameworks/hf_trainer.py --fault starved
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from workload import BATCH, Fault, device_time, fault_parser

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


class TimedGPT2(GPT2LMHeadModel):
    """GPT-2 whose forward also takes ``forward_s`` of (stand-in) device time."""

    forward_s = 0.0

    # Named parameters: the Trainer keeps only the dataset columns that forward names.
    def forward(self, input_ids: Any = None, labels: Any = None, **kwargs: Any) -> Any:
        device_time(self.forward_s)
        return super().forward(input_ids=input_ids, labels=labels, **kwargs)


def main() -> None:
    args = fault_parser().parse_args()
    torch.set_num_threads(1)
    fault = Fault.of(args.fault, args.delay, int(os.environ.get("RANK", "0")))
    config = GPT2Config(vocab_size=128, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    TimedGPT2.forward_s = fault.forward_s
    model = TimedGPT2(config)
    data = Tokens(args.steps * BATCH * args.accumulate * 2, fault.read_s)
    training = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-trainer-"),
        max_steps=args.steps,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=args.accumulate,
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
    # The Trainer leaves the process group up; gloo can abort at exit when it is not taken down.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
