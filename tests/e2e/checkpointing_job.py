"""An ordinary DDP training script (gloo, CPU) whose rank 0 saves a checkpoint every few steps,
as scripts do, while the other ranks go on to the next all-reduce and wait there.

It knows nothing of the auditor. Rank 0 prints ``SAVE_S=`` (the seconds its ``torch.save`` calls
took, timed by the script itself) at the end.

    torchrun --nproc_per_node=2 checkpointing_job.py --steps 60 --save-every 10
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--save-every", type=int, default=10)
p.add_argument("--width", type=int, default=1024)
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(
    nn.Sequential(
        nn.Linear(64, args.width),
        nn.ReLU(),
        nn.Linear(args.width, args.width),
        nn.Linear(args.width, 1),
    )
)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
data = torch.utils.data.TensorDataset(
    torch.randn(args.steps * 16, 64), torch.randn(args.steps * 16, 1)
)
loader = torch.utils.data.DataLoader(data, batch_size=16)
folder = tempfile.mkdtemp(prefix="ckpt")
save_s = 0.0
for i, (x, y) in enumerate(loader):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and (i + 1) % args.save_every == 0:
        t = time.perf_counter()
        for _ in range(3):  # the model, and two older copies kept as a rolling history
            torch.save(
                {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": i},
                os.path.join(folder, f"step{i}-{_}.pt"),
            )
        save_s += time.perf_counter() - t
dist.barrier()
if rank == 0:
    print(f"SAVE_S={save_s!r}", flush=True)
dist.destroy_process_group()
