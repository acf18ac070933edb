"""Check the live NVML source on a GPU machine: every field of every GPU, and what one read costs.

    python bench/nvml_check.py [--reads 200] [--record-job [--name nvml_live] [--seconds 20]]

1. For every GPU NVML lists: one ``NvmlSource.sample()``; each DeviceSample field is reported as
   present (with its value) or missing (None: not supported or not permitted on this GPU, with
   the NVML function and reason), and sanity-checked (ratios in 0..1, used <= total memory,
   current clocks <= max, PCIe current <= max, power > 0).
2. The cost of one ``sample()`` per GPU: median and p95 over ``--reads`` reads.
3. With ``--record-job``: a short CUDA training job (a small MLP on ``--device``, default cuda:0,
   for ``--seconds``) runs in a child process while every GPU is sampled once a second; the
   samples are written as an ``auditor.recording/v1`` file to
   ``tests/data/<name>/recording.jsonl`` (one ``Batch(devices=...)`` per tick), a real-shaped
   fixture for the recorded device source. The summary says whether the job's PID showed up in
   the GPU's process list (in a container NVML may report host PIDs, so "no" is not a bug).

Prints a JSON summary and writes it to ``bench/results/nvml_check.json`` (``BENCH_RESULTS_DIR``
to write elsewhere). Exit status: 0 when the checks pass or when there is no GPU (``no GPU:
skipped``), 1 when a GPU is lost or a value fails a sanity check, 2 when the training job fails.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import fields
from typing import Any

import _common as c

from auditor.samples import Batch, DeviceSample
from auditor.telemetry.nvml import NvmlSource
from auditor.telemetry.recorded import SCHEMA, RecordingWriter
from auditor.telemetry.sources import DeviceIdentity

# DeviceSample fields that come from NVML reads (identity and time excluded).
VALUE_FIELDS = tuple(
    f.name
    for f in fields(DeviceSample)
    if f.name not in ("node", "index", "uuid", "time", "model", "lost", "processes")
)
# Which NVML function feeds which field (for "missing" reports).
FIELD_FUNCTIONS = {
    "gpu_util": "nvmlDeviceGetUtilizationRates",
    "mem_util": "nvmlDeviceGetUtilizationRates",
    "mem_used_bytes": "nvmlDeviceGetMemoryInfo",
    "mem_total_bytes": "nvmlDeviceGetMemoryInfo",
    "sm_clock_mhz": "nvmlDeviceGetClockInfo",
    "sm_clock_max_mhz": "nvmlDeviceGetMaxClockInfo",
    "mem_clock_mhz": "nvmlDeviceGetClockInfo",
    "mem_clock_max_mhz": "nvmlDeviceGetMaxClockInfo",
    "throttle_reasons": "nvmlDeviceGetCurrentClocksEventReasons",
    "power_w": "nvmlDeviceGetPowerUsage",
    "power_limit_w": "nvmlDeviceGetEnforcedPowerLimit",
    "temperature_c": "nvmlDeviceGetTemperature",
    "pcie_gen": "nvmlDeviceGetCurrPcieLinkGeneration",
    "pcie_gen_max": "nvmlDeviceGetMaxPcieLinkGeneration",
    "pcie_width": "nvmlDeviceGetCurrPcieLinkWidth",
    "pcie_width_max": "nvmlDeviceGetMaxPcieLinkWidth",
}


def sanity(s: DeviceSample) -> list[str]:
    """Values that cannot be right (missing values are not problems)."""
    out: list[str] = []
    if s.lost:
        return ["GPU is lost"]
    for name in ("gpu_util", "mem_util"):
        v = getattr(s, name)
        if v is not None and not 0.0 <= v <= 1.0:
            out.append(f"{name}={v} outside 0..1")
    pairs = (
        ("mem_used_bytes", "mem_total_bytes"),
        ("sm_clock_mhz", "sm_clock_max_mhz"),
        ("mem_clock_mhz", "mem_clock_max_mhz"),
        ("pcie_gen", "pcie_gen_max"),
        ("pcie_width", "pcie_width_max"),
    )
    for cur, top in pairs:
        a, b = getattr(s, cur), getattr(s, top)
        if a is not None and b is not None and a > b:
            out.append(f"{cur}={a} > {top}={b}")
    if s.mem_total_bytes is not None and s.mem_total_bytes <= 0:
        out.append(f"mem_total_bytes={s.mem_total_bytes}")
    for name in ("power_w", "power_limit_w"):
        v = getattr(s, name)
        if v is not None and v <= 0:
            out.append(f"{name}={v} not positive")
    if s.temperature_c is not None and not 0 < s.temperature_c < 130:
        out.append(f"temperature_c={s.temperature_c} implausible")
    return out


def check_gpu(source: NvmlSource, ident: DeviceIdentity, reads: int) -> dict[str, Any]:
    s = source.sample(ident.uuid)
    missing_fns = source.nvml.missing()
    present = {
        name: (list(v) if isinstance(v, tuple) else v)
        for name in VALUE_FIELDS
        if (v := getattr(s, name)) is not None
    }
    missing = {
        name: missing_fns.get(FIELD_FUNCTIONS[name], "NVML error (see the log)")
        for name in VALUE_FIELDS
        if getattr(s, name) is None
    }
    costs: list[float] = []
    for _ in range(reads):
        t = time.perf_counter()
        source.sample(ident.uuid)
        costs.append((time.perf_counter() - t) * 1000.0)
    costs.sort()
    p95 = costs[min(len(costs) - 1, round(0.95 * (len(costs) - 1)))] if costs else None
    return {
        "index": ident.index,
        "uuid": ident.uuid,
        "model": ident.model,
        "lost": s.lost,
        "present": present,
        "missing": missing,
        "processes": [[p.pid, p.used_bytes] for p in s.processes],
        "problems": sanity(s),
        "sample_cost_ms": {
            "reads": reads,
            "median": statistics.median(costs) if costs else None,
            "p95": p95,
            "max": costs[-1] if costs else None,
        },
    }


# -- the recorded training job -------------------------------------------------------------------

TRAIN_CODE = r"""
import sys, time
import torch
seconds, device = float(sys.argv[1]), sys.argv[2]
if not torch.cuda.is_available():
    print("torch sees no CUDA device", file=sys.stderr)
    sys.exit(3)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(2048, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 10),
).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(1024, 2048, device=device)
y = torch.randint(0, 10, (1024,), device=device)
steps, end = 0, time.time() + seconds
while time.time() < end:
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    steps += 1
    if steps % 50 == 0:
        torch.cuda.synchronize()
torch.cuda.synchronize()
print(f"steps={steps} loss={loss.item():.4f}", flush=True)
"""


def record_job(
    source: NvmlSource,
    idents: list[DeviceIdentity],
    *,
    name: str,
    seconds: float,
    device: str,
    driver: dict[str, Any],
    interval_s: float = 1.0,
) -> dict[str, Any]:
    path = os.path.join(c.REPO, "tests", "data", name, "recording.jsonl")
    meta = {
        "source": "bench/nvml_check.py --record-job",
        "host": source.node,
        "driver": driver,
        "train": {"device": device, "seconds": seconds, "model": "MLP 2048-4096-4096-10, bs 1024"},
        "interval_s": interval_s,
    }
    writer = RecordingWriter(path, job=name, meta=meta)
    ticks = 0
    seen_pid = False
    peak_util: dict[str, float] = {}
    lead_s = 2.0  # idle samples before the job starts and after it ends
    proc: subprocess.Popen[str] | None = None
    t0 = time.time()
    ended_at: float | None = None
    try:
        while True:
            now = time.time()
            if proc is None and now - t0 >= lead_s:
                proc = subprocess.Popen(
                    [sys.executable, "-c", TRAIN_CODE, str(seconds), device],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            if proc is not None and ended_at is None and proc.poll() is not None:
                ended_at = now
            if ended_at is not None and now - ended_at >= lead_s:
                break
            samples = tuple(source.sample(i.uuid) for i in idents)
            writer.write(Batch(devices=samples))
            ticks += 1
            for s in samples:
                if s.gpu_util is not None:
                    peak_util[s.uuid] = max(peak_util.get(s.uuid, 0.0), s.gpu_util)
                if proc is not None and any(p.pid == proc.pid for p in s.processes):
                    seen_pid = True
            time.sleep(max(0.0, t0 + ticks * interval_s - time.time()))
    finally:
        writer.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
    assert proc is not None
    out, err = proc.communicate(timeout=30)
    return {
        "path": os.path.relpath(path, c.REPO),
        "schema": SCHEMA,
        "ticks": ticks,
        "train_returncode": proc.returncode,
        "train_output": (out.strip() or err.strip())[-500:],
        "train_pid_seen_in_processes": seen_pid,
        "peak_gpu_util": peak_util,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reads", type=int, default=200, help="sample() reads per GPU for the cost")
    p.add_argument("--record-job", action="store_true", help="record a short CUDA training job")
    p.add_argument("--name", default="nvml_live", help="scenario name under tests/data/")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the training job")
    p.add_argument("--device", default="cuda:0", help="torch device of the training job")
    args = p.parse_args(argv)

    source = NvmlSource(socket.gethostname())
    ok, reason = source.available()
    if not ok:
        print(f"no GPU: skipped ({reason})")
        print(json.dumps({"skipped": True, "reason": reason}))
        return 0
    with source:
        idents = source.devices()
        if not idents:
            reason = "the NVIDIA driver is loaded but reports no GPU"
            print(f"no GPU: skipped ({reason})")
            print(json.dumps({"skipped": True, "reason": reason}))
            return 0
        driver = source.driver_info()
        gpus = [check_gpu(source, ident, args.reads) for ident in idents]
        recording = None
        if args.record_job:
            recording = record_job(
                source,
                idents,
                name=args.name,
                seconds=args.seconds,
                device=args.device,
                driver=driver,
            )
        missing_functions = source.nvml.missing()
    problems = {g["uuid"]: g["problems"] for g in gpus if g["problems"]}
    summary: dict[str, Any] = {
        "skipped": False,
        "host": source.node,
        "driver": driver,
        "gpus": gpus,
        "missing_functions": missing_functions,
        "problems": problems,
        "recording": recording,
    }
    summary["result_file"] = c.write_result("nvml_check", summary)
    print(json.dumps(summary, indent=2))
    if recording is not None and recording["train_returncode"] != 0:
        return 2
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
