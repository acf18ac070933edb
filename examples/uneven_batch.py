"""Ranks that disagree on the per-rank batch size (a config bug: rank 1 doubles it).

torchrun --nproc_per_node=2 examples/uneven_batch.py
"""

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank, world, device = setup()
batch_size = args.batch_size * 2 if rank == args.fault_rank else args.batch_size
model = DDP(SmallConvNet().to(device))
loader = make_loader(SyntheticImages(), rank, world, batch_size, args.workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
