"""One rank is slow inside backward: an autograd function whose gradient is expensive there.

Backward wall time looks the same on every rank, because the fast ones wait inside backward
for the gradient all-reduce; only the wait at the collective tells which rank is slow.

    torchrun --nproc_per_node=2 examples/slow_backward.py
"""

import time

import torch
from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP


class SlowGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        time.sleep(0.03)
        return grad


class SlowBackward(SmallConvNet):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(SlowGrad.apply(self.features(x)))


args = parse_args()
rank, world, device = setup()
net = SlowBackward() if rank == args.fault_rank else SmallConvNet()
model = DDP(net.to(device))
loader = make_loader(SyntheticImages(), rank, world, args.batch_size, args.workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
