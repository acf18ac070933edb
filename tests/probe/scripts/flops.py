"""A training loop whose FLOPs per step are known by hand (tests/probe/test_flops.py).

``--model linear``: ``Linear(IN, HID) - ReLU - Linear(HID, OUT)``; ``--model conv``:
``Conv2d(3, 8, 3, padding=1) - ReLU - Conv2d(8, 4, 3, stride=2)`` on 3x16x16 images. A
DataLoader of ``--batch`` samples (``--batch2`` from step ``--switch-at`` on: a new input shape),
``--accumulate`` micro-batches per optimizer step, ``--autocast`` for CPU autocast bf16,
``--ddp``: DDP over gloo (under torchrun).
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

IN, HID, OUT = 64, 128, 10


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("linear", "conv"), default="linear")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batch2", type=int, default=0)
    p.add_argument("--switch-at", type=int, default=8)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--autocast", action="store_true")
    p.add_argument("--ddp", action="store_true")
    args = p.parse_args()
    if args.ddp:
        torch.distributed.init_process_group("gloo")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.model == "linear":
        model: nn.Module = nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))
        shape: tuple[int, ...] = (IN,)
    else:
        model = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2), nn.Flatten()
        )
        shape = (3, 16, 16)
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def loader(batch: int) -> DataLoader:
        n = batch * args.accumulate * args.steps
        return DataLoader(TensorDataset(torch.randn(n, *shape)), batch_size=batch)

    step = 0
    batches = iter(loader(args.batch))
    while step < args.steps:
        if args.batch2 and step == args.switch_at:
            batches = iter(loader(args.batch2))
        for _ in range(args.accumulate):
            (x,) = next(batches)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
                out = model(x)
            (out.float().square().mean() / args.accumulate).backward()
        opt.step()
        opt.zero_grad()
        step += 1
    if args.ddp:
        torch.distributed.destroy_process_group()
    print(f"DONE={os.environ.get('RANK', '0')}", flush=True)


if __name__ == "__main__":
    main()
