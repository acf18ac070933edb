"""A DeepSpeed engine loop: ``deepspeed.initialize``, ``engine(x)``, ``engine.backward(loss)``,
``engine.step()``, with ZeRO stage ``--zero`` (0, 1 or 2) and ``--accumulate`` micro-batches per
optimizer step (DeepSpeed's ``gradient_accumulation_steps``: ``engine.step()`` is called after
every micro-batch and updates the model at the boundary only). On CPU it runs over gloo
(``DS_ACCELERATOR=cpu`` where DeepSpeed would not find it alone); on GPUs over NCCL.

Faults: see ``workload.py``.

    deepspeed --num_gpus=2 examples/frameworks/deepspeed_engine.py --zero 2 --fault starved
"""

from __future__ import annotations

import os

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from workload import BATCH, Fault, Samples, device_time, fault_parser


class Net(nn.Module):
    def __init__(self, forward_s: float) -> None:
        super().__init__()
        self.forward_s = forward_s
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_time(self.forward_s)
        return self.body(x)


def main() -> None:
    p = fault_parser()
    p.add_argument("--zero", type=int, choices=(0, 1, 2), default=0, help="ZeRO stage")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the DeepSpeed launcher")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        torch.set_num_threads(1)
    fault = Fault.of(args.fault, args.delay, rank)
    config = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": args.accumulate,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "zero_optimization": {"stage": args.zero},
        # SGD under ZeRO: DeepSpeed tests its own optimizers only, and says so unless told.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1_000_000,
    }
    model = Net(fault.forward_s)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    data = Samples(args.steps * args.accumulate * BATCH * world, fault.read_s)
    loader = DataLoader(
        data, batch_size=BATCH, sampler=DistributedSampler(data, world, rank), num_workers=0
    )
    for x, y in loader:
        x, y = x.to(engine.device), y.to(engine.device)
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
    if rank == 0:
        print(f"trained {engine.global_steps} steps", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
