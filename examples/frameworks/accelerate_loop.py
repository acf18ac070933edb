"""A plain Hugging Face Accelerate loop: ``Accelerator().prepare`` and ``accelerator.backward``.
Faults: see ``workload.py``.

    accelerate launch --multi_gpu --num_processes 2 examples/frameworks/accelerate_loop.py
"""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader
from workload import BATCH, Fault, Samples, device_time, fault_parser

args = fault_parser().parse_args()
accelerator = Accelerator(cpu=True)
torch.set_num_threads(1)
fault = Fault.of(args.fault, args.delay, accelerator.process_index)


class Net(nn.Module):
    def __init__(self, forward_s: float) -> None:
        super().__init__()
        self.forward_s = forward_s
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device_time(self.forward_s)
        return self.body(x)


data = Samples(args.steps * BATCH * accelerator.num_processes, fault.read_s)
model = Net(fault.forward_s)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=0)
model, opt, loader = accelerator.prepare(model, opt, loader)

steps = 0
for x, y in loader:
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    accelerator.backward(loss)
    opt.step()
    steps += 1
accelerator.wait_for_everyone()
if accelerator.is_main_process:
    print(f"trained {steps} steps", flush=True)
accelerator.end_training()
