"""A tiny training job for the probe tests. It knows nothing of the auditor (except ``--auto``,
the documented one-line opt-in) and prints what the tests check as ``KEY=value`` lines.

It also checks its own training: after the loop it replays the same batches through a
functional copy of the model (``torch.autograd.grad`` and a manual SGD update: no module call,
no ``backward``, no optimizer, so the probe sees none of it) and prints ``MATCH=True`` when the
trained weights equal the reference. With DDP on one process the all-reduce averages over one
rank, so the reference is plain SGD.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--auto", choices=["none", "before", "after"], default="none")
p.add_argument("--ddp", action="store_true")
p.add_argument("--loader", action="store_true", help="iterate a DataLoader (else plain tensors)")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--batches", type=int, default=6)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--item-sleep", type=float, default=0.0)
# An evaluation loop (forward only, on a loader of its own) after every N training batches.
p.add_argument("--eval-every", type=int, default=0)
p.add_argument("--eval-workers", type=int, default=0)
p.add_argument(
    "--hook", choices=["none", "before", "after", "builtin", "builtin-after"], default="none"
)
# The builtin hook the script registers: FP16_COMPRESS rounds the gradients it all-reduces to
# float16, an effect on the trained weights that shows the hook really ran.
p.add_argument("--builtin", choices=["allreduce", "fp16"], default="allreduce")
p.add_argument("--exit-code", type=int, default=0)
args = p.parse_args()

if args.auto == "before":
    import auditor.probe.auto  # the one-line opt-in, before torch

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if args.auto == "after":
    import auditor.probe.auto  # noqa: F401  (after torch: attaches at once)

LR = 0.1
CALLS = {"comm": 0, "fwd": 0}


class Items(torch.utils.data.Dataset):
    """Deterministic samples (seeded by index), optionally slow to load."""

    def __len__(self) -> int:
        return args.batches * args.batch

    def __getitem__(self, i: int):
        if args.item_sleep:
            time.sleep(args.item_sleep)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(dim=0, keepdim=True) * 0.5


def batches():
    if args.loader:
        loader = torch.utils.data.DataLoader(
            Items(), batch_size=args.batch, shuffle=False, num_workers=args.workers
        )
        yield from loader
    else:
        ds = Items()
        for b in range(args.batches):
            items = [ds[b * args.batch + j] for j in range(args.batch)]
            yield torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def evaluate() -> None:
    data = torch.utils.data.Subset(Items(), range(2 * args.batch))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch, num_workers=args.eval_workers)
    with torch.no_grad():
        for x, _ in loader:
            model(x)


def counting_hook(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    CALLS["comm"] += 1
    return default_hooks.allreduce_hook(state, bucket)


def register(ddp) -> None:
    import torch.distributed as dist

    if args.hook in ("before", "after"):
        ddp.register_comm_hook(None, counting_hook)
    else:
        kinds = {"allreduce": "ALLREDUCE", "fp16": "FP16_COMPRESS"}
        ddp._register_builtin_comm_hook(getattr(dist.BuiltinCommHookType, kinds[args.builtin]))


torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
net.register_forward_hook(lambda m, a, o: CALLS.__setitem__("fwd", CALLS["fwd"] + 1))
initial = [t.detach().clone() for t in net.parameters()]
model = net
if args.ddp:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(net)
    if args.hook in ("before", "builtin"):
        register(model)
opt = torch.optim.SGD(model.parameters(), lr=LR)

seen = []
children_printed = False
for i, (x, y) in enumerate(batches()):
    if args.workers and not children_printed:
        import psutil

        kids = sorted(c.pid for c in psutil.Process().children(recursive=False))
        print("CHILDREN=" + ",".join(str(k) for k in kids))
        children_printed = True
    seen.append((x, y))
    loss = F.mse_loss(model(x), y) / args.accum
    loss.backward()
    if (i + 1) % args.accum == 0:
        opt.step()
        opt.zero_grad()
        print(f"LOSS{i}={loss.item() * args.accum:.6f}")
    if i == 0 and args.ddp and args.hook in ("after", "builtin-after"):
        register(model)
    if args.eval_every and (i + 1) % args.eval_every == 0:
        evaluate()

# Reference: the same updates, computed functionally (invisible to the probe). A builtin
# FP16_COMPRESS hook rounds the gradients of the steps it ran for (from the first, or from the
# second where the script registers it after its first step) to float16.
hooked_from = 1 if args.hook.endswith("after") else 0
rounded = args.ddp and args.hook.startswith("builtin") and args.builtin == "fp16"
ref = [t.clone().requires_grad_(True) for t in initial]
grads = [torch.zeros_like(t) for t in ref]
for i, (x, y) in enumerate(seen):
    h = F.relu(F.linear(x, ref[0], ref[1]))
    loss = F.mse_loss(F.linear(h, ref[2], ref[3]), y) / args.accum
    for acc, g in zip(grads, torch.autograd.grad(loss, ref), strict=True):
        acc += g.half().float() if rounded and i >= hooked_from else g
    if (i + 1) % args.accum == 0:
        with torch.no_grad():
            for t, g in zip(ref, grads, strict=True):
                t -= LR * g
                g.zero_()
match = all(torch.allclose(a, b, atol=1e-6) for a, b in zip(net.parameters(), ref, strict=True))
print(f"MATCH={match}")
print(f"COMM_CALLS={CALLS['comm']}")
print(f"FWD_CALLS={CALLS['fwd']}")
print(f"PID={os.getpid()}")
if args.ddp:
    dist.destroy_process_group()
sys.exit(args.exit_code)
