"""A training loop that also saves checkpoints and evaluates, as ordinary scripts do.

Every ``--every`` steps it saves its state with ``torch.save`` (``--dcp``: once with
``torch.distributed.checkpoint.save``) and runs an evaluation loop: ``model.eval()``, a loader
of its own under ``torch.no_grad()``, ``model.train()``. The durations are known: the saved state
holds an object whose pickling takes ``SAVE_S``, the evaluation loader's items take
``EVAL_ITEM_S`` each and every forward takes ``FWD_S``. It prints ``STARTED=`` and ``FINISHED=``
(wall clock) at its first and last line, for the account of its run.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402
import io  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--every", type=int, default=4)
p.add_argument("--dcp", action="store_true")
args = p.parse_args()
if args.dcp:
    import torch.distributed.checkpoint as dcp  # before the loop: its import is start-up

FWD_S = 0.01
TRAIN_ITEM_S = 0.002
EVAL_ITEM_S = 0.01
SAVE_S = 0.05
BATCH = 4
EVAL_BATCHES = 2


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        return torch.randn(8), torch.randn(1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x):
        time.sleep(FWD_S)
        return self.lin(x)


class SlowToSave:
    """Pickling it takes SAVE_S: a slow disk, without one."""

    def __reduce__(self):
        time.sleep(SAVE_S)
        return (SlowToSave, ())


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
train = torch.utils.data.DataLoader(Items(args.steps * BATCH, TRAIN_ITEM_S), batch_size=BATCH)
evaluation = torch.utils.data.DataLoader(Items(EVAL_BATCHES * BATCH, EVAL_ITEM_S), batch_size=BATCH)
saves = evals = 0
for i, (x, y) in enumerate(train):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if (i + 1) % args.every == 0 and i + 1 < args.steps:
        if args.dcp and saves == 0:
            dcp.save({"model": model.state_dict()}, checkpoint_id=tempfile.mkdtemp())
        else:
            torch.save({"model": model.state_dict(), "meta": SlowToSave()}, io.BytesIO())
        saves += 1
        model.eval()
        with torch.no_grad():
            for ex, _ in evaluation:
                model(ex)
        model.train()
        evals += 1
print(f"SAVES={saves}")
print(f"EVALS={evals}")
print(f"STARTED={STARTED!r}")
print(f"FINISHED={time.time()!r}", flush=True)
