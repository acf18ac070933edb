"""An ordinary DDP training script (gloo on CPU, NCCL on CUDA) whose rank 0 keeps every step's
outputs in a list for an end-of-run metric, without ``.detach()``: the classic leak. Its memory
climbs by the outputs' size every step (``--keep-mb``), the other rank's stays put.

It knows nothing of the auditor. With ``--memory-log DIR`` each rank writes ``DIR/rank<N>.log``, one
line per step, ``<step> <rss bytes> <allocated bytes>``: its own RSS (``/proc/self/statm``) and,
on CUDA, the allocator's allocated bytes, so a test measures the true rate from outside.

    torchrun --nproc_per_node=2 leaking_job.py --seconds 15 --keep-mb 3
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=15.0, help="train this long")
p.add_argument("--max-steps", type=int, default=100_000)
p.add_argument("--keep-mb", type=float, default=3.0, help="MiB of outputs kept per step")
p.add_argument("--leak-rank", type=int, default=0, help="the rank that keeps its outputs")
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--memory-log", default="", help="folder for each rank's per-step memory log")
args = p.parse_args()

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if cuda:
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
else:
    torch.set_num_threads(1)
    device = torch.device("cpu")
torch.manual_seed(rank)
# Outputs of --keep-mb MiB per step: a classifier over that many classes (float32).
classes = max(16, int(args.keep_mb * 2**20 / (args.batch_size * 4)))
model = DDP(
    nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, classes)).to(device),
    device_ids=[device.index] if cuda else None,
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
data = torch.utils.data.TensorDataset(
    torch.randn(args.batch_size * 64, 32), torch.randint(0, classes, (args.batch_size * 64,))
)
loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
page = os.sysconf("SC_PAGE_SIZE")
log = open(os.path.join(args.memory_log, f"rank{rank}.log"), "w") if args.memory_log else None  # noqa: SIM115


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page


kept: list[torch.Tensor] = []  # "for the epoch's accuracy at the end"
start, step = time.time(), 0
stop = torch.zeros(1, device=device)
done = False
while not done:
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = loss_fn(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == args.leak_rank:
            kept.append(out)  # the leak: should be out.detach() (or the accuracy, as a number)
        step += 1
        if log is not None:
            allocated = torch.cuda.memory_allocated() if cuda else 0
            log.write(f"{step} {rss_bytes()} {allocated}\n")
        if step % 10 == 0:
            late = time.time() - start >= args.seconds or step >= args.max_steps
            stop.fill_(1.0 if late else 0.0)
            dist.broadcast(stop, src=0)
            if stop.item():
                done = True
                break
if log is not None:
    log.close()
if rank == 0:
    print(f"trained {step} steps in {time.time() - start:.2f} s, kept {len(kept)}", flush=True)
dist.barrier()
dist.destroy_process_group()
