"""An ordinary DDP training script (gloo, CPU) that all-gathers a large tensor every step on
every rank (an embedding table's shards, a metric's full state): the transfer itself is slow,
and no rank is slower than another. Before the gather, a barrier lines the ranks up, so the
script's own timing of the gather is the transfer alone; each rank prints the bytes and the
median seconds it measured (``GATHER_BYTES=``, ``GATHER_S=``) at the end.

It knows nothing of the auditor.

    torchrun --nproc_per_node=2 gather_job.py --seconds 8 --mb 24
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=8.0)
p.add_argument("--mb", type=float, default=24.0, help="each rank's share of the gather")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

model = DDP(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
shard = torch.full((int(args.mb * 2**20 / 4),), float(rank))
gathered = [torch.empty_like(shard) for _ in range(world)]
data = [(torch.randn(32, 64), torch.randn(32, 1)) for _ in range(16)]

times: list[float] = []
start = time.monotonic()
step = 0
while True:
    stop = torch.tensor([float(rank == 0 and time.monotonic() - start > args.seconds)])
    dist.all_reduce(stop)
    if stop.item():
        break
    x, y = data[step % len(data)]
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    dist.barrier()
    t = time.perf_counter()
    dist.all_gather(gathered, shard)
    times.append(time.perf_counter() - t)
    step += 1

nbytes = sum(t.nbytes for t in gathered)
print(f"GATHER_BYTES={nbytes} GATHER_S={statistics.median(times[2:]):.6f} RANK={rank}", flush=True)
dist.destroy_process_group()
