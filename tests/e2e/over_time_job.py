"""An ordinary DDP training script (gloo, CPU) with one fault chosen on the command line, for
the tests that judge a run over its phases (tests/e2e/test_over_time_e2e.py).

It knows nothing of the auditor:

* ``--fault forward``: rank 1's forward computes ``--factor`` times as long as rank 0's in every
  step (the same layer run again on its activations, inside the model's forward);
* ``--fault other``: rank 1's every step carries ``--other-ms`` of its own work in no phase,
  between forward and backward (a host-side check, busy on the CPU, as a metric or a debug
  check would be);
* ``--fault none``: balanced.

``--startup S`` sleeps S seconds after the rendezvous and before the first step (a model
loaded from slow storage): a start-up that can be half of a short run. ``--pin`` binds each
rank to core ``rank`` (the CPU binding a launcher gives with numactl or taskset).

    torchrun --nproc_per_node=2 over_time_job.py --seconds 10 --fault forward --factor 5
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
p.add_argument("--seconds", type=float, default=10.0, help="train this long")
p.add_argument("--fault", choices=("none", "forward", "other"), default="none")
p.add_argument("--factor", type=int, default=5, help="rank 1's forward, times rank 0's")
p.add_argument("--other-ms", type=float, default=8.0, help="rank 1's work in no phase a step")
p.add_argument("--startup", type=float, default=0.0, help="seconds before the first step")
p.add_argument("--width", type=int, default=1024)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--pin", action="store_true", help="bind each rank to core <rank>")
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
if args.pin:
    os.sched_setaffinity(0, {rank % os.cpu_count()})  # type: ignore[operator]
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self, width: int, repeat: int) -> None:
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)
        self.repeat = repeat

    def body(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(torch.relu(self.inp(x)))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The same forward again (rank 1 under --fault forward): forward work that backward
        # does not repeat.
        with torch.no_grad():
            for _ in range(self.repeat):
                self.body(x)
        return self.body(x)


repeat = args.factor - 1 if args.fault == "forward" and rank == 1 else 0
model = DDP(Net(args.width, repeat))
opt = torch.optim.SGD(model.parameters(), lr=0.001)
n = args.batch_size * 64
data = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randn(n, 1))
loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, drop_last=True)
other_s = args.other_ms / 1e3 if args.fault == "other" and rank == 1 else 0.0

if args.startup > 0:
    time.sleep(args.startup)

start, step = time.time(), 0
stop = torch.zeros(1)
while True:
    for x, y in loader:
        pred = model(x)
        if other_s:
            # A host-side check between forward and backward: busy on the CPU, in no phase.
            t = time.perf_counter()
            while time.perf_counter() - t < other_s:
                pass
        loss = nn.functional.mse_loss(pred, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0:
            # Rank 0 decides when to stop, so every rank runs the same steps.
            stop.fill_(1.0 if time.time() - start >= args.seconds else 0.0)
            dist.broadcast(stop, src=0)
            if stop.item():
                break
    else:
        continue
    break
if rank == 0:
    print(f"trained {step} steps", flush=True)
dist.destroy_process_group()
