"""One rank is slow in forward (a slower device, or rank-specific work such as extra logging).

The delay is modelled as device time (a sleep), which does not take host CPU from the others.

    torchrun --nproc_per_node=2 examples/slow_forward.py
"""

import time

import torch
from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP


class SlowForward(SmallConvNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return super().forward(x)


args = parse_args()
rank, world, device = setup()
net = SlowForward() if rank == args.fault_rank else SmallConvNet()
model = DDP(net.to(device))
loader = make_loader(SyntheticImages(), rank, world, args.batch_size, args.workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
