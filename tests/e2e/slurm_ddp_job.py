"""An ordinary DDP script written for SLURM: its place in the job from ``SLURM_PROCID``,
``SLURM_NTASKS`` and ``SLURM_LOCALID`` (no ``RANK``, no launcher), the rendezvous from the
``MASTER_ADDR``/``MASTER_PORT`` its batch script exports, as SLURM training scripts do. Rank
``--fault-rank`` reads from slow storage with one loader worker (examples/starved_rank.py).

    srun -n2 python slurm_ddp_job.py --fault-rank 1
"""

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from common import SmallConvNet, SyntheticImages, finish, make_loader, parse_args, train
from torch.nn.parallel import DistributedDataParallel as DDP

args = parse_args()
rank = int(os.environ["SLURM_PROCID"])
world = int(os.environ["SLURM_NTASKS"])
local = int(os.environ.get("SLURM_LOCALID", "0"))
addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)
if torch.cuda.is_available():
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
else:
    torch.set_num_threads(1)
    device = torch.device("cpu")
slow = rank == args.fault_rank
dataset = SyntheticImages(
    read_delay_s=0.004 if slow else 0.0, slow_from=time.time() + args.fault_after
)
model = DDP(SmallConvNet().to(device))
loader = make_loader(dataset, rank, world, args.batch_size, args.workers, device)
finish(rank, train(model, loader, device, seconds=args.seconds, max_steps=args.max_steps))
