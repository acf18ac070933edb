"""Every rank's DataLoader starts its workers anew at every epoch (``persistent_workers`` is
off, DataLoader's default), and each worker takes 0.3 s to start: its imports, a tokenizer,
opening its files. With short epochs the ranks wait for that at every epoch's first batch.

    torchrun --nproc_per_node=2 examples/restarting_workers.py
"""

import time

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP


def started(worker_id: int) -> None:
    time.sleep(0.3)  # the worker's own start-up


args = parse_args(workers=4)
rank, world, device = setup()
dataset = SyntheticImages(n=world * args.batch_size * 20)  # 20 steps an epoch
model = DDP(SmallConvNet().to(device))
loader = make_loader(dataset, rank, world, args.batch_size, args.workers, device)
loader.worker_init_fn = started
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
