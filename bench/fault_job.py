"""examples/starved_rank.py that says when its fault starts: ``FAULT_ONSET <epoch seconds>``.

The same workload as the example (model, dataset, loader and loop from ``examples/common.py``):
rank ``--fault-rank`` reads every sample 4 ms slowly, with one DataLoader worker, from
``--fault-after`` seconds on. That rank prints the wall-clock time at which its reads turn slow,
up front, on stdout, so a benchmark can measure the time from onset to finding.

    torchrun --nproc_per_node=2 bench/fault_job.py --fault-after 8 --seconds 30
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP

READ_DELAY_S = 0.004  # as in examples/starved_rank.py


def main() -> None:
    args = parse_args()
    rank, world, device = setup()
    slow = rank == args.fault_rank
    onset = time.time() + args.fault_after
    if slow:
        print(f"FAULT_ONSET {onset:.6f} rank={rank}", flush=True)
    dataset = SyntheticImages(read_delay_s=READ_DELAY_S if slow else 0.0, slow_from=onset)
    model = DDP(SmallConvNet().to(device))
    loader = make_loader(dataset, rank, world, args.batch_size, args.workers, device)
    finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))


if __name__ == "__main__":
    main()
