"""What the probe's activation sampling costs a real model, per forward.

The memory meter (:mod:`auditor.probe.memory`) measures the activations of a sampled forward
with saved-tensor hooks: a Python call for every tensor autograd saves, which a transformer
saves hundreds of. The near-empty step of ``probe_hotpath.py`` saves three, and its median step
leaves the sampled ones out, so neither shows this cost. Here:

* ``sampled_forward_ms``: on a 12-layer transformer encoder built from torch's own layers (d_model
  128, 4 heads, a batch of 4 sequences of 16 or 20 in turn; nothing downloaded), the forward with
  the meter sampling it less the same forward without the meter, in alternated pairs in this
  process (median and range over ``--pairs``). The meter's base interval is 1 and the lengths
  alternate, so it samples every forward it sees. The plain forward and backward (``step_ms``)
  for scale.
* ``samples``: how many of ``--forwards`` forwards the meter samples when each sample holds (the
  meter's own schedule, run on a small model), against a fixed every ``ACTIVATIONS_EVERY``-th.
* ``cost_per_forward_us``: the sampled forward's cost spread over every forward, both ways.

    python bench/memory_sampling.py [--pairs 15] [--forwards 5000]

Writes bench/results/memory_sampling.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import Any

import _common as c
import torch
from torch import nn

from auditor.probe.memory import ACTIVATIONS_EVERY, MemoryMeter

LAYERS, WIDTH, HEADS, BATCH, SEQ = 12, 128, 4, 4, 16


def _model() -> nn.Module:
    layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, LAYERS), nn.Linear(WIDTH, 1))


def _forward_s(model: nn.Module, x: torch.Tensor, meter: MemoryMeter | None) -> float:
    """One forward (with ``meter`` around it, if any) in seconds; its backward untimed."""
    t = time.perf_counter()
    if meter is not None:
        meter.forward_begin(model, BATCH)
    try:
        out = model(x)
    finally:
        if meter is not None:
            meter.forward_end()
    took = time.perf_counter() - t
    out.square().mean().backward()
    return took


def _ms(stats: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v * 1e3, 3) if isinstance(v, float) else v for k, v in stats.items()}


def sampled_cost(pairs: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _model()
    # Two sequence lengths in turn: each sample moves from the last, so with a base interval
    # of 1 the meter samples every forward it sees (its steady state, after its first).
    inputs = [torch.randn(BATCH, n, WIDTH) for n in (SEQ, SEQ + SEQ // 4)]
    meter = MemoryMeter(torch, rank=lambda: 0, activations_every=1, scan=False)
    for x in inputs * 2:  # warm-up, and the meter's one-time checks of the model
        _forward_s(model, x, None)
        _forward_s(model, x, meter)
    plain: list[float] = []
    extra: list[float] = []
    for i in range(pairs):
        x = inputs[i % 2]
        before = meter.samples
        if i % 4 < 2:  # which arm goes first alternates
            bare, probed = _forward_s(model, x, None), _forward_s(model, x, meter)
        else:
            probed, bare = _forward_s(model, x, meter), _forward_s(model, x, None)
        if meter.samples != before + 1:
            raise SystemExit("a forward the meter should have sampled was not")
        plain.append(bare)
        extra.append(probed - bare)
    budget = meter.measure()
    t = time.perf_counter()
    for _ in range(3):
        _forward_s(model, inputs[0], None)
    step_s = (time.perf_counter() - t) / 3
    return {
        "sampled_forward_ms": _ms(c.summary(extra)),
        "forward_ms": round(statistics.median(plain) * 1e3, 3),
        "step_ms": round(step_s * 1e3, 3),
        "activation_bytes": budget.activation_bytes if budget is not None else None,
    }


def schedule(forwards: int) -> dict[str, int]:
    """Samples the meter takes in ``forwards`` forwards whose activations hold, against a fixed
    every ``ACTIVATIONS_EVERY``-th."""
    model = nn.Linear(8, 1)
    meter = MemoryMeter(torch, rank=lambda: 0, scan=False)
    x = torch.randn(4, 8)
    for _ in range(forwards):
        meter.forward_begin(model, 4)
        try:
            out = model(x)
        finally:
            meter.forward_end()
        out.sum().backward()
    return {"adaptive": meter.samples, "fixed": math.ceil(forwards / ACTIVATIONS_EVERY)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--forwards", type=int, default=5000)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    cost = sampled_cost(args.pairs)
    samples = schedule(args.forwards)
    per_sample_ms = cost["sampled_forward_ms"]["median"]
    summary = {
        **cost,
        "forwards": args.forwards,
        "samples": samples,
        "cost_per_forward_us": {
            k: round(per_sample_ms * 1e3 * n / args.forwards, 2) for k, n in samples.items()
        },
        "model": f"TransformerEncoder, {LAYERS} layers, d_model {WIDTH}, batch {BATCH}, "
        f"sequences of {SEQ} or {SEQ + SEQ // 4}",
    }
    c.write_result("memory_sampling", {"summary": summary})
    json.dump(summary, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
