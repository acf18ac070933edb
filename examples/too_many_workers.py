"""Too many DataLoader workers on too few cores: rank 1 starts 8 CPU-heavy decoders.

Its decoding (numpy/BLAS, as image and audio codecs often are) needs about one core in all, but
it runs in 8 worker processes, each with its own dataset copy and BLAS thread pool, on a host
whose cores the training processes already use.

    torchrun --nproc_per_node=2 examples/too_many_workers.py
"""

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, setup, train
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank, world, device = setup()
heavy = rank == args.fault_rank
dataset = SyntheticImages(decode_work=4 if heavy else 0)
workers = 8 if heavy else args.workers
model = DDP(SmallConvNet().to(device))
loader = make_loader(dataset, rank, world, args.batch_size, workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
