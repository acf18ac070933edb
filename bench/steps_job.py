"""examples/train_ddp.py, timed from inside: prints ``steps_per_s=<x>`` excluding start-up.

The job is the example's own model, dataset, loader and training loop (imported from
``examples/common.py``, nothing copied). The only addition is a forward pre-hook on the DDP model
that notes the clock at every step's forward; the rate is (steps - 1 - warm-up) over the time
from the first counted step to the last one, so interpreter start, ``import torch``, process
group set-up and DataLoader worker start-up are all excluded. Rank 0 prints (DDP keeps the ranks
in lockstep, so rank 0's rate is the job's rate).

    torchrun --nproc_per_node=2 bench/steps_job.py --seconds 20
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

from common import (
    SmallConvNet,
    SyntheticImages,
    finish,
    make_loader,
    parse_args,
    setup,
    train,
)
from torch.nn.parallel import DistributedDataParallel as DDP

WARMUP_STEPS = int(os.environ.get("BENCH_WARMUP_STEPS", "5"))


class StepTimer:
    """Forward pre-hook: the time of each step's forward (the first ``warmup`` ones skipped)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.calls = 0
        self.first: float | None = None
        self.last: float | None = None

    def __call__(self, module: Any, args: Any) -> None:
        self.calls += 1
        if self.calls <= self.warmup:
            return
        t = time.perf_counter()
        if self.first is None:
            self.first = t
        self.last = t

    def rate(self) -> tuple[int, float, float]:
        """(timed intervals, seconds, steps per second)."""
        if self.first is None or self.last is None or self.last <= self.first:
            return 0, 0.0, 0.0
        n = self.calls - self.warmup - 1
        dt = self.last - self.first
        return n, dt, n / dt


def main() -> None:
    args = parse_args()
    rank, world, device = setup()
    model = DDP(SmallConvNet().to(device))
    timer = StepTimer(WARMUP_STEPS)
    model.register_forward_pre_hook(timer)
    loader = make_loader(SyntheticImages(), rank, world, args.batch_size, args.workers, device)
    steps = train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps)
    if rank == 0:
        n, dt, rate = timer.rate()
        print(f"steps_per_s={rate:.6f} timed_steps={n} timed_s={dt:.6f}", flush=True)
    finish(rank, steps)


if __name__ == "__main__":
    main()
