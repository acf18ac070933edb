"""A two-rank DDP job (torchrun, gloo, CPU) that forks a child after every backward, as a
DataLoader does when it starts its workers. It knows nothing of the auditor.

It prints ``THREAD_STATES``: the Python thread states the training loop created, from any thread
(the interpreter numbers them from 1, so the count is the difference of two new ids), and
``FORKS_HUNG``: children that had not exited 10 s after the fork (a child can block for ever in
``PyOS_AfterFork_Child`` when another thread held the interpreter's thread-list lock at the fork,
python/cpython#112275).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()

_api = ctypes.pythonapi
_api.PyThreadState_Get.restype = ctypes.c_void_p
_api.PyThreadState_GetID.restype = ctypes.c_uint64
_api.PyThreadState_GetID.argtypes = [ctypes.c_void_p]


def next_thread_state_id() -> int:
    """The id of the interpreter's next thread state: one past that of a thread started now."""
    got: list[int] = []
    t = threading.Thread(
        target=lambda: got.append(_api.PyThreadState_GetID(_api.PyThreadState_Get()))
    )
    t.start()
    t.join()
    return got[0] + 1


def fork_and_reap() -> bool:
    """Fork a child that exits at once; True when it did."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        time.sleep(0.001)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return False


torch.manual_seed(0)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
# Small buckets: several all-reduces, so several completion callbacks, per backward.
model = nn.parallel.DistributedDataParallel(
    nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=0.01
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(8, 64)
hung = 0
before = next_thread_state_id()
for _ in range(args.steps):
    opt.zero_grad()
    model(x).sum().backward()
    hung += not fork_and_reap()
    opt.step()
created = next_thread_state_id() - before - 1  # less the reader's own
# One write per process: the ranks share torchrun's stdout.
sys.stdout.write(f"RANK{rank}_THREAD_STATES={created}\nRANK{rank}_FORKS_HUNG={hung}\n")
sys.stdout.flush()
dist.destroy_process_group()
