"""An ordinary DDP training script (gloo, CPU) whose rank 1 turns slow halfway: after
``--slow-after`` seconds of training, its forward does extra work its peers do not, ``--factor``
times its own step so far (the median, warm-up left out), modelled as a sleep so that it takes
no CPU from the others on a small host. Rank 0 waits for it at every all-reduce from then on.
Rank 0 stops every rank after ``--seconds`` of training.

It knows nothing of the auditor. Rank 1 prints ``SLOW_FROM=<step>`` and ``EXTRA_S=<seconds>``
when it turns slow (steps counted from 0, as the probe counts them).

    torchrun --nproc_per_node=2 slowdown_job.py --seconds 18 --slow-after 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=18.0)
p.add_argument("--slow-after", type=float, default=8.0)
p.add_argument("--factor", type=float, default=5.0)
p.add_argument("--who", type=int, default=1)
args = p.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * 8 * 8, 10),
        )
        self.extra = 0.0  # seconds of extra work per forward (once slow)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra:
            time.sleep(self.extra)
        return self.body(x)


net = Net()
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(2048, 3, 16, 16), torch.randint(0, 10, (2048,)))
sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(data)
loader = torch.utils.data.DataLoader(data, batch_size=16, sampler=sampler)
step_s: list[float] = []
stop = torch.zeros(1)
i, epoch, start = 0, 0, time.time()
while not stop.item():
    sampler.set_epoch(epoch)
    for x, y in loader:
        if rank == args.who and not net.extra and time.time() - start >= args.slow_after:
            # The rank's own step so far (the median after warm-up), times the factor.
            net.extra = args.factor * statistics.median(step_s[5:])
            print(f"SLOW_FROM={i}", f"EXTRA_S={net.extra:.4f}", flush=True)
        t = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t)
        i += 1
        if i % 10 == 0:  # rank 0 says when to stop, so every rank runs the same steps
            stop.fill_(1.0 if time.time() - start >= args.seconds else 0.0)
            dist.broadcast(stop, src=0)
            if stop.item():
                break
    epoch += 1
dist.barrier()
dist.destroy_process_group()
