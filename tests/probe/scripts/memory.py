"""A two-rank training job (torchrun, gloo, CPU) of a known MLP, for the memory budget tests.

It knows nothing of the auditor. The MLP is ``Linear(IN, HID) - ReLU - Linear(HID, HID) - ReLU -
Linear(HID, OUT)`` in float32, so its parameter bytes and the activations one sample keeps for
backward are known in closed form (``tests/probe/test_memory.py`` computes them):

* ``--optim``: adam (two state tensors per parameter, plus a scalar ``step``), sgdm (SGD with
  momentum: one), sgd (none);
* ``--copy-rank R``: rank R keeps an extra copy of the model (an EMA made with deepcopy, updated
  every step);
* ``--fsdp``: FSDP2 ``fully_shard`` on each Linear and the root instead of DDP.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--optim", choices=["adam", "sgdm", "sgd"], default="adam")
p.add_argument("--copy-rank", type=int, default=-1)
p.add_argument("--fsdp", action="store_true")
p.add_argument("--steps", type=int, default=12)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--in-dim", type=int, default=64)
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--out-dim", type=int, default=10)
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)

net = nn.Sequential(
    nn.Linear(args.in_dim, args.hidden),
    nn.ReLU(),
    nn.Linear(args.hidden, args.hidden),
    nn.ReLU(),
    nn.Linear(args.hidden, args.out_dim),
)
ema = copy.deepcopy(net) if rank == args.copy_rank else None

model: nn.Module
if args.fsdp:
    from torch.distributed.fsdp import fully_shard

    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    model = fully_shard(net)
else:
    model = nn.parallel.DistributedDataParallel(net)

opt: torch.optim.Optimizer
if args.optim == "adam":
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
elif args.optim == "sgdm":
    opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
else:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

g = torch.Generator().manual_seed(rank)
for _ in range(args.steps):
    x = torch.randn(args.batch, args.in_dim, generator=g)
    y = torch.randint(0, args.out_dim, (args.batch,), generator=g)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if ema is not None:
        with torch.no_grad():
            for e, q in zip(ema.parameters(), net.parameters(), strict=True):
                e.mul_(0.99).add_(q.detach().full_tensor() if args.fsdp else q.detach(), alpha=0.01)

dist.destroy_process_group()
print("DONE=1")
