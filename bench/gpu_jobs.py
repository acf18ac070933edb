"""The training jobs ``bench/gpu_validate.py`` runs: ordinary PyTorch loops, nothing auditor-aware.

    python bench/gpu_jobs.py phases  --arm probe|plain|sync --steps N --out FILE
    python bench/gpu_jobs.py memory  --batch B --steps N --out FILE
    torchrun --nproc_per_node=2 bench/gpu_jobs.py verdict --fault starve|forward|none --seconds S
    torchrun --nproc_per_node=2 bench/gpu_jobs.py verdict --fault startup|leak|slowdown \
        --seconds S --out 'FILE_{rank}.json'
    python bench/gpu_jobs.py train   --seconds S          (the job the NVML recording watches)
    python bench/gpu_jobs.py matmul  --dtype bf16|fp32 [--starve] --seconds S --out FILE

Every job runs on ``cuda:0`` where CUDA is there and on the CPU otherwise (``gpu_validate.py
--dry-run``), with sizes chosen per device so that each phase costs milliseconds on an H100 and
the whole plan stays short on a 2-core CPU.

``phases``: one process, a DataLoader of pinned host batches -> ``Tensor.to(non_blocking=True)``
-> an MLP's forward -> backward -> Adam. The three compute phases cost apart in a known ratio
(backward about twice forward; Adam a memory-bound pass over the parameters). ``--arm sync``
times each phase on the host between ``torch.cuda.synchronize()`` calls (the reference);
``plain`` and ``probe`` run the loop untouched and record the host's step times (the probe, when
``auditor``'s environment is set, measures its own phases with CUDA events). Every arm counts the
synchronisations CUDA's sync debug mode reports outside the reference's own.

``memory``: one process, the MLP with Adam at batch ``--batch`` (inputs made on the device from a
batch-returning dataset, so the host stays out of it): writes the exact bytes of parameters,
gradients and optimizer state and the allocator's peak over a measured step.

``verdict``: two ranks on the one GPU (gloo over CUDA tensors: NCCL refuses two ranks on one
device), DDP over a small MLP. ``--fault starve``: rank 1 reads from slow storage with
``num_workers=0`` and pageable memory; ``forward``: rank 1 runs extra device work in its forward;
``none``: the same job balanced. Over time (``gpu_validate.py``'s ``over_time`` group):
``startup``: balanced, after a start-up as long as its training (every rank holds
``STARTUP_HOLD_BYTES`` on the device from the start and waits until ``--seconds`` have passed
since its process began, as a job loading a checkpoint and a data set does); ``leak``: rank 1
keeps every step's loss with its graph (``backward(retain_graph=True)``, the loss appended to a
list), so its allocated memory climbs by the saved activations of a step, every step; the rank
measures that itself (``torch.cuda.memory_allocated()`` after every step; its resident set on
the CPU) and writes the least-squares slope per step and per second; ``slowdown``: rank 1 adds
the forward straggler's device work from the middle of its training on and writes the first
step that carried it. ``--out`` takes ``{rank}``: each rank writes its own file.

``matmul``: one process, bias-free Linear layers of known FLOPs per step (``matmul_flops``) on
batches made on the device, in bf16 (autocast) or fp32 with TF32 off; ``--starve`` reads each
batch for as long as a step computes, so the device waits half the time (``gpu_validate.py``'s
``mfu`` group).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda", 0) if CUDA else torch.device("cpu")

# (width, layers, batch) of the phase job's MLP: on an H100 (fp32, TF32 off) forward ~9 ms,
# backward ~18 ms, Adam ~1 ms over 50M parameters, H2D ~1.3 ms of 32 MiB pinned.
PHASE_SHAPE = (4096, 3, 2048) if CUDA else (256, 3, 128)
# (width, layers) of the memory job: deep and narrow, so that the activations kept for backward
# (layers + 1 tensors of batch x width) dwarf backward's transient gradient tensors.
MEMORY_SHAPE = (1024, 24) if CUDA else (128, 12)
# The verdict job: a small MLP (1M parameters: gloo's all-reduce over host copies stays cheap).
VERDICT_SHAPE = (512, 4, 64)
# Extra device work of the forward straggler: matrix products on a buffer (about 30 ms on an
# H100 in fp32); on the CPU a sleep stands in for device time.
STRAGGLER_MM = (4096, 12)
STRAGGLER_CPU_S = 0.03
# The matmul job's starved read (``--starve``), in steps of its own compute.
STARVE_STEPS = 2.0
# Slow storage of the starved rank: seconds per sample read.
STARVE_READ_S = 0.002
# What each rank of the start-up job holds on the device before its first step (a checkpoint,
# a data set loaded to the GPU); on the CPU, in host memory.
STARTUP_HOLD_BYTES = 2**30 if CUDA else 64 * 2**20
# The leak job's batch: the graph a step keeps is its saved activations (5 tensors of batch x
# width, 2.5 MiB at 256), so that the climb over a few seconds clears memory_growth's floor of
# 0.5% of the capacity (700 MiB of an H200) several times over, on a GPU and on a large host.
LEAK_BATCH = 256
# The slowdown job: rank 1 turns slow this far into its training (a share of --seconds).
SLOWDOWN_AT = 0.5
FAULTS = ("starve", "forward", "none", "startup", "leak", "slowdown")
# (width, layers, batch) of the matmul job: bias-free Linear layers, FLOPs per step exactly
# 2 x batch x width^2 x (3 x layers - 1) (forward; backward's weight gradients; the input
# gradients of every layer but the first, whose input needs none). On an H100 3 TFLOPs a step:
# about 4 ms in bf16, 60 ms in fp32 with TF32 off.
MATMUL_SHAPE = (8192, 4, 8192) if CUDA else (256, 4, 256)


def mlp(width: int, layers: int) -> nn.Sequential:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*mods)


class Rows(Dataset):
    """``n`` deterministic rows of ``width`` floats, made once on the host."""

    def __init__(self, n: int, width: int, read_s: float = 0.0) -> None:
        self.x = torch.randn(n, width, generator=torch.Generator().manual_seed(0))
        self.read_s = read_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.read_s:
            time.sleep(self.read_s)
        return self.x[i]


class Slab(Rows):
    """Rows fetched a batch at a time (``__getitems__``: one slice, not a stack of rows), so
    that the host keeps ahead of the device as in a job whose loading is not the bottleneck."""

    def __getitems__(self, idx: list[int]) -> torch.Tensor:
        return self.x[idx[0] : idx[0] + len(idx)]


class Batches(Dataset):
    """Whole batches made on the device (``__getitems__``: one call per batch)."""

    def __init__(self, batch: int, width: int) -> None:
        self.batch, self.width = batch, width

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        raise NotImplementedError  # always fetched whole, by __getitems__

    def __getitems__(self, idx: list[int]) -> torch.Tensor:
        return torch.randn(len(idx), self.width, device=DEVICE)


def _same(batch: torch.Tensor) -> torch.Tensor:
    return batch


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


class SyncCounter:
    """Counts the synchronisations CUDA's sync debug mode warns about (none on the CPU)."""

    def __init__(self) -> None:
        self.count = 0
        self._shown = warnings.showwarning

    def __enter__(self) -> SyncCounter:
        if CUDA:
            warnings.simplefilter("always")
            warnings.showwarning = self._show  # type: ignore[assignment]
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def _show(self, message: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message):
            self.count += 1
        else:
            self._shown(message, *args, **kwargs)

    def __exit__(self, *exc: object) -> None:
        if CUDA:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = self._shown


def phases(args: argparse.Namespace) -> dict[str, Any]:
    width, layers, batch = PHASE_SHAPE
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = mlp(width, layers).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    loader = DataLoader(
        Slab(batch * 4, width), batch_size=batch, num_workers=0, pin_memory=CUDA, collate_fn=_same
    )
    steps: list[float] = []
    ref: dict[str, list[float]] = {"h2d": [], "forward": [], "backward": [], "optimizer": []}
    done = 0
    counter = SyncCounter()
    _sync()
    last = time.perf_counter()
    with counter:
        while done < args.steps:
            for x in loader:
                if args.arm == "sync":
                    _sync()
                    t0 = time.perf_counter()
                    x = x.to(DEVICE, non_blocking=True)
                    _sync()
                    t1 = time.perf_counter()
                    out = model(x)
                    _sync()
                    t2 = time.perf_counter()
                    loss = out.square().mean()
                    _sync()
                    t3 = time.perf_counter()
                    loss.backward()
                    _sync()
                    t4 = time.perf_counter()
                    opt.step()
                    _sync()
                    t5 = time.perf_counter()
                    opt.zero_grad(set_to_none=True)
                    for k, v in zip(ref, (t1 - t0, t2 - t1, t4 - t3, t5 - t4), strict=True):
                        ref[k].append(v)
                else:
                    x = x.to(DEVICE, non_blocking=True)
                    loss = model(x).square().mean()
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                now = time.perf_counter()
                steps.append(now - last)
                last = now
                done += 1
                if done >= args.steps:
                    break
    _sync()
    warm = max(1, len(steps) // 5)  # start-up steps (allocator, kernels' first launches) out
    out: dict[str, Any] = {
        "arm": args.arm,
        "device": str(DEVICE),
        "shape": {"width": width, "layers": layers, "batch": batch},
        "steps": len(steps),
        "step_s_median": statistics.median(steps[warm:]),
        "syncs": counter.count,
    }
    if args.arm == "sync":
        out["reference_s"] = {k: statistics.median(v[warm:]) for k, v in ref.items()}
    return out


def memory(args: argparse.Namespace) -> dict[str, Any]:
    width, layers = MEMORY_SHAPE
    torch.manual_seed(0)
    model = mlp(width, layers).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=True)
    loader = DataLoader(Batches(args.batch, width), batch_size=args.batch, collate_fn=lambda b: b)
    peak: int | None = None
    for i, x in enumerate(loader):
        if i == args.steps - 1 and CUDA:  # the last step, allocator warm and state built
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i == args.steps - 1:
            if CUDA:
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated()
            break
    params = list(model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    by_kind: dict[str, int] = {}
    for st in opt.state.values():
        for k, t in st.items():
            if torch.is_tensor(t):
                by_kind[k] = by_kind.get(k, 0) + t.numel() * t.element_size()
    return {
        "device": str(DEVICE),
        "batch": args.batch,
        "shape": {"width": width, "layers": layers},
        "param_bytes": param_bytes,
        "grad_bytes": param_bytes,  # every parameter trains; grads are sized like them
        "optimizer_bytes": sum(by_kind.values()),
        "optimizer_bytes_by_kind": dict(sorted(by_kind.items())),
        "peak_bytes": peak,
        "device_total_bytes": torch.cuda.get_device_properties(0).total_memory if CUDA else None,
    }


class Straggler(nn.Module):
    """With ``slow``, the forward also runs device work whose result it drops (a costly metric,
    an extra head nobody trains): time on the device, not on the host; from wall-clock time
    ``slow_from`` on where given (a rank that turns slow). Every rank wraps its model alike
    (DDP wants the same modules everywhere); the work tensor is no buffer, so DDP neither
    checks nor broadcasts it."""

    def __init__(self, inner: nn.Module, slow: bool, slow_from: float = 0.0) -> None:
        super().__init__()
        self.inner = inner
        size = STRAGGLER_MM[0]
        self.work = torch.randn(size, size, device=DEVICE) / size**0.5 if slow and CUDA else None
        self.slow = slow
        self.slow_from = slow_from

    @property
    def on(self) -> bool:
        return self.slow and time.time() >= self.slow_from

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.on:
            return self.inner(x)
        if self.work is not None:
            w = self.work
            for _ in range(STRAGGLER_MM[1]):
                w = torch.mm(w, self.work)
        else:
            time.sleep(STRAGGLER_CPU_S)
        return self.inner(x)


def _slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ``ys`` against ``xs``."""
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else None


def _memory_now() -> int:
    """The memory a leak grows: the caching allocator's allocated bytes on a GPU (a host-side
    counter: no synchronisation), the resident set on the CPU."""
    if CUDA:
        return torch.cuda.memory_allocated()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def long_startup(seconds: float) -> tuple[torch.Tensor, float]:
    """Take ``STARTUP_HOLD_BYTES`` on the device and wait until ``seconds`` have passed since
    this process began (a start-up as long as the training that follows): the memory (held for
    the run by the caller) and the start-up's length."""
    import psutil

    began = psutil.Process().create_time()
    hold = torch.empty(STARTUP_HOLD_BYTES // 4, device=DEVICE)
    hold.fill_(1.0)
    time.sleep(max(0.0, began + seconds - time.time()))
    return hold, time.time() - began


def verdict(args: argparse.Namespace) -> dict[str, Any]:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if CUDA:
        torch.cuda.set_device(0)  # both ranks on the one GPU
    else:
        torch.set_num_threads(1)
    width, layers, batch = VERDICT_SHAPE
    if args.fault == "leak":
        batch = LEAK_BATCH
    held, startup_s = long_startup(args.seconds) if args.fault == "startup" else (None, None)
    torch.manual_seed(0)
    slow = args.fault in ("forward", "slowdown") and rank == 1
    # The slowdown job's rank 1 turns slow SLOWDOWN_AT into its training (set as it starts).
    later = float("inf") if args.fault == "slowdown" else 0.0
    net = Straggler(mlp(width, layers), slow=slow, slow_from=later).to(DEVICE)
    model = nn.parallel.DistributedDataParallel(net, device_ids=[0] if CUDA else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    starve = args.fault == "starve"
    data = Rows(4096, width, read_s=STARVE_READ_S if starve and rank == 1 else 0.0)
    sampler = torch.utils.data.distributed.DistributedSampler(data)
    loader = DataLoader(
        data,
        batch_size=batch,
        sampler=sampler,
        num_workers=0 if starve else 2,
        pin_memory=CUDA and not starve,
        persistent_workers=not starve,
        drop_last=True,
    )
    leak = args.fault == "leak" and rank == 1
    kept: list[torch.Tensor] = []  # the leak: every step's loss, with its graph
    trace: tuple[list[float], list[float], list[float]] = ([], [], [])  # step, time, bytes
    slow_step: int | None = None
    start, step, epoch = time.time(), 0, 0
    if args.fault == "slowdown":
        net.slow_from = start + SLOWDOWN_AT * args.seconds
    stop = torch.zeros(1)
    while True:
        sampler.set_epoch(epoch)
        for x in loader:
            if slow_step is None and args.fault == "slowdown" and net.on:
                slow_step = step  # the first step (from 0) that carries the extra work
            x = x.to(DEVICE, non_blocking=True)
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            if leak:
                loss.backward(retain_graph=True)
                kept.append(loss)
            else:
                loss.backward()
            opt.step()
            if leak:
                trace[0].append(step)
                trace[1].append(time.time())
                trace[2].append(_memory_now())
            step += 1
            if step % 10 == 0:  # rank 0 decides when to stop: ranks never disagree at a collective
                stop.fill_(1.0 if time.time() - start >= args.seconds else 0.0)
                dist.broadcast(stop, src=0)
                if stop.item():
                    dist.barrier()  # both ranks leave together: no peer torn down mid-call
                    dist.destroy_process_group()
                    del held, kept
                    out: dict[str, Any] = {"rank": rank, "steps": step, "startup_s": startup_s}
                    if args.fault == "startup":
                        out["held_bytes"] = STARTUP_HOLD_BYTES
                    if leak:
                        out.update(
                            measure="memory_allocated" if CUDA else "rss",
                            bytes_per_step=_slope(trace[0], trace[2]),
                            bytes_per_s=_slope(trace[1], trace[2]),
                            first_bytes=trace[2][0],
                            last_bytes=trace[2][-1],
                            device_total_bytes=(
                                torch.cuda.get_device_properties(0).total_memory if CUDA else None
                            ),
                        )
                    if args.fault == "slowdown" and slow:
                        out["slow_from_step"] = slow_step
                    return out
        epoch += 1


class Fed(Dataset):
    """Whole batches made on the device, each after ``read_s`` seconds on the host (slow
    storage read in the main process: the device waits for it)."""

    def __init__(self, batch: int, width: int) -> None:
        self.batch, self.width, self.read_s = batch, width, 0.0

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        raise NotImplementedError  # always fetched whole, by __getitems__

    def __getitems__(self, idx: list[int]) -> torch.Tensor:
        if self.read_s:
            time.sleep(self.read_s)
        return torch.randn(len(idx), self.width, device=DEVICE)


def matmul_flops(width: int, layers: int, batch: int) -> int:
    """The exact FLOPs of one step of the matmul job (see ``MATMUL_SHAPE``)."""
    return 2 * batch * width * width * (3 * layers - 1)


def matmul(args: argparse.Namespace) -> dict[str, Any]:
    """The matmul job of known FLOPs (``gpu_validate.py``'s ``mfu`` group): bf16 under autocast,
    or fp32 with TF32 off; ``--starve``: each batch read for as long as two steps compute (the
    loop's own steps timed first), so that the device waits about half of each step: the read
    of the next batch overlaps the step the device is still running (the loop never waits for
    the device), so a read as long as one step leaves the device barely idle (an H200 run: 20%
    of the step waiting for data, MFU 0.85 of the fed job's)."""
    width, layers, batch = MATMUL_SHAPE
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    model = nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    model = model.to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)
    half = args.dtype == "bf16"

    def step(x: torch.Tensor) -> None:
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=half):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    data = Fed(batch, width)
    read_s = 0.0
    if args.starve:  # the step's own time, measured once (synchronised: before the run)
        x = torch.randn(batch, width, device=DEVICE)
        step(x)
        _sync()
        t = time.perf_counter()
        for _ in range(5):
            step(x)
        _sync()
        read_s = data.read_s = STARVE_STEPS * (time.perf_counter() - t) / 5
    loader = DataLoader(data, batch_size=batch, num_workers=0, collate_fn=_same)
    start, steps = time.time(), 0
    for x in loader:
        step(x)
        steps += 1
        if time.time() - start >= args.seconds:
            break
    _sync()
    return {
        "steps": steps,
        "exact_flops": matmul_flops(width, layers, batch),
        "dtype": args.dtype,
        "read_s": read_s,
        "shape": [width, layers, batch],
        "device_name": torch.cuda.get_device_name(0) if CUDA else None,
    }


def train(args: argparse.Namespace) -> dict[str, Any]:
    """A plain CUDA training job for the NVML recording: busy, then idle at the end."""
    width, layers, batch = PHASE_SHAPE
    model = mlp(width, layers).to(DEVICE)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=DEVICE)
    start, steps = time.time(), 0
    while time.time() - start < args.seconds:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 20 == 0:
            _sync()
    return {"steps": steps, "pid": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="job", required=True)
    ph = sub.add_parser("phases")
    ph.add_argument("--arm", choices=("probe", "plain", "sync"), required=True)
    ph.add_argument("--steps", type=int, default=200)
    ph.add_argument("--profile", action="store_true", help="print the loop's 25 costliest calls")
    me = sub.add_parser("memory")
    me.add_argument("--batch", type=int, required=True)
    me.add_argument("--steps", type=int, default=4)
    ve = sub.add_parser("verdict")
    ve.add_argument("--fault", choices=FAULTS, required=True)
    ve.add_argument("--seconds", type=float, default=20.0)
    tr = sub.add_parser("train")
    tr.add_argument("--seconds", type=float, default=20.0)
    mm = sub.add_parser("matmul")
    mm.add_argument("--dtype", choices=("bf16", "fp32"), required=True)
    mm.add_argument("--seconds", type=float, default=8.0)
    mm.add_argument("--starve", action="store_true", help="the device waits about half a step")
    for s in (ph, me, ve, tr, mm):
        s.add_argument("--out", help="write the job's figures here (JSON)")
    args = p.parse_args(argv)
    jobs = {"phases": phases, "memory": memory, "verdict": verdict, "train": train}
    job = {**jobs, "matmul": matmul}[args.job]
    if getattr(args, "profile", False):
        import cProfile
        import pstats

        prof = cProfile.Profile()
        result = prof.runcall(job, args)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        result = job(args)
    if args.out:  # "{rank}" in the path: each rank of a distributed job writes its own file
        with open(args.out.replace("{rank}", str(result.get("rank", 0))), "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
