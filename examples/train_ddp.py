"""Balanced DDP training: every rank gets the same data path, batch and model.

torchrun --nproc_per_node=2 examples/train_ddp.py
"""

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank, world, device = setup()
model = DDP(SmallConvNet().to(device))
loader = make_loader(SyntheticImages(), rank, world, args.batch_size, args.workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
