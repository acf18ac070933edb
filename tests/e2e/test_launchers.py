"""The probe attaches however ranks are started: torch.multiprocessing.spawn and plain python."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import run_auditor

pytestmark = pytest.mark.e2e

SPAWN = """
import os, time, torch, torch.distributed as dist, torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.nn.parallel import DistributedDataParallel as DDP

def worker(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = DDP(nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = DataLoader(TensorDataset(torch.randn(2048, 32), torch.randint(0, 4, (2048,))),
                      batch_size=16)
    for x, y in data:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        time.sleep(0.005)
    dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = str(s.getsockname()[1]); s.close()
    mp.spawn(worker, args=(2, port), nprocs=2)
    print("spawned job done")
"""

PLAIN = """
import time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.Adam(model.parameters())
data = DataLoader(TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,))),
                  batch_size=32, num_workers=1)
for x, y in data:
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    time.sleep(0.005)
print("plain job done")
"""


def test_mp_spawn_ranks_are_measured(ray_address: str, tmp_path: Path) -> None:
    script = tmp_path / "spawn_job.py"
    script.write_text(SPAWN)
    run = run_auditor(
        ["--quiet", "--address", ray_address], [sys.executable, str(script)], tmp=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "spawned job done" in run.stdout
    assert run.report is not None
    ranks = {r["rank"]: r for r in run.report["ranks"]}
    assert set(ranks) == {0, 1}
    for r in ranks.values():
        assert r["steps"] >= 100
        assert r["parallel_mode"] == "ddp"
        assert r["batch_size"] == 16
        assert r["collective_wait_s"] is not None


def test_plain_python_single_process_is_measured(ray_address: str, tmp_path: Path) -> None:
    script = tmp_path / "plain_job.py"
    script.write_text(PLAIN)
    run = run_auditor(
        ["--quiet", "--address", ray_address], [sys.executable, str(script)], tmp=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "plain job done" in run.stdout
    assert run.report is not None
    (rank,) = run.report["ranks"]
    assert rank["rank"] == 0 and rank["parallel_mode"] == "none"
    assert rank["steps"] >= 100 and rank["batch_size"] == 32
    assert rank["forward_s"] > 0 and rank["backward_s"] > 0 and rank["optimizer_s"] > 0
    assert rank["loader"]["num_workers"] == 1
