"""A DeepSpeed engine loop in one process (world of 1, gloo on CPU) for the probe tests: the
model's forward sleeps ``FWD_S``, ``engine.backward`` and ``engine.step`` after every
micro-batch, ``--accum`` micro-batches per optimizer step, ZeRO stage ``--zero``. Prints
``UPDATES=<the engine's optimizer steps>`` and ``MICRO=<its micro-steps>``.
"""

from __future__ import annotations

import argparse
import os
import time

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FWD_S = 0.02

p = argparse.ArgumentParser()
p.add_argument("--accum", type=int, default=1)
p.add_argument("--zero", type=int, default=0)
p.add_argument("--updates", type=int, default=12)
args = p.parse_args()

os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
deepspeed.init_distributed(dist_backend="gloo")
torch.set_num_threads(1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FWD_S)
        return self.body(x)


model = Net()
config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": args.accum,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": args.zero},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1_000_000,
}
engine, _, _, _ = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=config
)
n = args.updates * args.accum * 4
data = DataLoader(TensorDataset(torch.randn(n, 16), torch.randint(0, 4, (n,))), batch_size=4)
for x, y in data:
    loss = nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
print(f"UPDATES={engine.global_steps}", flush=True)
print(f"MICRO={engine.micro_steps}", flush=True)
torch.distributed.destroy_process_group()
