"""A Ray Train job: ``TorchTrainer`` with 2 CPU workers on the local Ray (DDP over gloo).

Ray Train's workers are Ray actor processes started by the raylet, not children of this script.
Under ``auditor run -- python examples/frameworks/ray_train.py`` this script starts the local Ray,
whose workers inherit the probe's environment. On a cluster started elsewhere, opt the workers
in through the runtime environment (see the README, "Frameworks").

``--fault starved``: rank 1 reads each sample from slow storage (num_workers=0).
``--fault slow``: rank 1's model does extra work in forward (a sleep: device time, not host CPU).

    python examples/frameworks/ray_train.py --fault starved
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import ray.train
import ray.train.torch
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, Dataset

BATCH = 8
WORKERS = 2


# Every rank's forward stands in for device compute with a sleep (these examples run on CPU):
# a step of tens of milliseconds, as real steps are, so the frameworks' own bookkeeping between
# phases is the small share it is on a real job.
COMPUTE_S = 0.03


def train_loop(config: dict[str, Any]) -> None:
    # Defined inside the loop so that Ray ships them with it (this script is not importable
    # on the workers).
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

    class Net(nn.Module):
        def __init__(self, extra_s: float) -> None:
            super().__init__()
            self.extra_s = extra_s
            self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.extra_s:
                time.sleep(self.extra_s)
            return self.body(x)

    torch.set_num_threads(1)
    fault, steps, delay = config["fault"], config["steps"], config["delay"]
    faulty = ray.train.get_context().get_world_rank() == 1
    extra_s = COMPUTE_S + (delay if faulty and fault == "slow" else 0.0)
    model = ray.train.torch.prepare_model(Net(extra_s))
    data = Samples(steps * BATCH * WORKERS, delay / BATCH if faulty and fault == "starved" else 0)
    loader = ray.train.torch.prepare_data_loader(DataLoader(data, batch_size=BATCH, shuffle=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.zeros(())
    for x, y in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    ray.train.report({"loss": float(loss.detach())})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fault", choices=("none", "starved", "slow"), default="none")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--delay", type=float, default=0.04, help="seconds the fault costs per step")
    p.add_argument("--storage", default="", help="where Ray Train keeps results (default: temp)")
    args = p.parse_args()
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"fault": args.fault, "steps": args.steps, "delay": args.delay},
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        run_config=RunConfig(storage_path=args.storage or tempfile.mkdtemp(prefix="ray-train-")),
    )
    result = trainer.fit()
    print(f"ray train done: {result.error or 'ok'}", flush=True)


if __name__ == "__main__":
    main()
