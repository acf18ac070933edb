"""Rank 0 alone saves a full checkpoint inline every few steps; the other ranks wait for it at the
next all-reduce. Every step looks balanced in the medians: the time goes in the few steps that
save.

    torchrun --nproc_per_node=2 examples/checkpoint_rank0.py --every 5 --state-mb 64

``--who all`` has every rank save its own copy alike (nobody waits for one rank); ``--pause S``
replaces the save with a pause of S seconds (a garbage-collection pause, a rank that stalls).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
from common import SmallConvNet, SyntheticImages, finish, make_loader, setup
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=12.0, help="train this long")
p.add_argument("--max-steps", type=int, default=100_000)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--workers", type=int, default=1)
p.add_argument("--every", type=int, default=5, help="save every N steps")
p.add_argument("--state-mb", type=float, default=64.0, help="size of the extra state saved")
p.add_argument("--who", choices=("0", "all"), default="0", help="rank 0 saves, or every rank")
p.add_argument("--pause", type=float, default=0.0, help="pause this long instead of saving")
args = p.parse_args()

rank, world, device = setup()
model = DDP(SmallConvNet().to(device))
loader = make_loader(SyntheticImages(), rank, world, args.batch_size, args.workers, device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
# What a real checkpoint carries besides the model: an EMA copy, data-loader state, RNG states.
extra = torch.randn(int(args.state_mb * 2**20 / 4))
saves = args.who == "all" or rank == 0
folder = tempfile.mkdtemp(prefix=f"ckpt-rank{rank}-")


def checkpoint(step: int) -> None:
    if args.pause:
        time.sleep(args.pause)
        return
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "extra": extra}
    torch.save(state, os.path.join(folder, "last.pt"))


start, step, epoch = time.time(), 0, 0
stop = torch.zeros(1)
done = False
while not done:
    loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
        step += 1
        if saves and step % args.every == 0:
            checkpoint(step)
        if step % 10 == 0:
            stop.fill_(
                1.0 if time.time() - start >= args.seconds or step >= args.max_steps else 0.0
            )
            dist.broadcast(stop, src=0)
            if stop.item():
                done = True
                break
    epoch += 1
shutil.rmtree(folder, ignore_errors=True)
if rank == 0:
    print(f"trained for {time.time() - start:.2f} s", flush=True)
finish(rank, step)
