"""One rank reads its samples from slow storage with too few DataLoader workers.

Rank ``--fault-rank`` waits 4 ms per sample (a slow network filesystem, say); with one worker
it cannot keep up, and every other rank waits for it at the all-reduce. With ``--fault-after S``
its reads turn slow only S seconds into the run.

    torchrun --nproc_per_node=2 examples/starved_rank.py
"""

import time

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank, world, device = setup()
slow = rank == args.fault_rank
dataset = SyntheticImages(
    read_delay_s=0.004 if slow else 0.0, slow_from=time.time() + args.fault_after
)
model = DDP(SmallConvNet().to(device))
loader = make_loader(dataset, rank, world, args.batch_size, args.workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
