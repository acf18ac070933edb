"""Constructed DDP jobs with stalls: a rank's own work that spikes in some steps.

:mod:`.jobs` makes every step alike; a stall is a step unlike the others, and where it lands
matters. So this builder runs each rank's clock through every step as a real DDP loop does:

* rank ``r`` starts step ``k`` where its step ``k - 1`` ended, does its data wait, h2d, forward
  and backward compute (a stall placed ``"forward"`` lands here, a ``"data"`` one in the data
  wait), and reaches the all-reduce;
* the all-reduce ends ``comm`` after the last rank reached it; each rank's collective wait is
  that end less its arrival;
* then its optimizer step and, for a stall placed ``"other"`` (a ``torch.save`` after
  ``optimizer.step()``), the stall in no phase: the step ends when the loop asks for the next
  batch. So the peers wait for that stall at the *next* step's all-reduce.

Stalls are :class:`StallSpec` (every ``every`` steps from ``first``, or at the listed steps),
named in ``StepSample.outside`` where ``name`` is given. Multiplicative jitter from a seeded RNG;
samples go through the real :class:`SampleStore` as node agents deliver them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.samples import Batch, StepSample

from .jobs import JobBuilder, RankSpec


@dataclass(frozen=True)
class StallSpec:
    """Extra seconds of a rank's own work in some steps."""

    seconds: float
    every: int | None = None
    first: int = 0
    steps: tuple[int, ...] = ()
    # ``other`` (after the optimizer step, in no phase), ``forward`` or ``data``.
    where: str = "other"
    # Named in ``StepSample.outside`` (``checkpoint``, ``evaluation``, ``logging``); None: not.
    name: str | None = None

    def at(self, step: int) -> bool:
        if step in self.steps:
            return True
        return (
            self.every is not None and step >= self.first and (step - self.first) % self.every == 0
        )


def stall_snapshot(
    specs: Sequence[RankSpec],
    stalls: Mapping[int, StallSpec | Sequence[StallSpec]],
    *,
    steps: int = 60,
    comm: float = 0.004,
    jitter: float = 0.02,
    seed: int = 0,
    warmup: int = 0,
    window_s: float | None = None,
    store: SampleStore | None = None,
) -> Snapshot:
    """A snapshot of ``steps`` steps of a DDP job whose ranks stall as ``stalls`` says."""
    store = store if store is not None else SampleStore(job="test", warmup_steps=warmup)
    store.add(Batch(infos=JobBuilder(specs).infos()))
    rng = random.Random(seed)

    def jit(v: float) -> float:
        return v * (1.0 + rng.uniform(-jitter, jitter)) if jitter > 0 and v else v

    of_rank = {r: [s] if isinstance(s, StallSpec) else list(s) for r, s in stalls.items()}
    clock = [1_000.0] * len(specs)
    for k in range(steps):
        plans = []
        for r, spec in enumerate(specs):
            extra = {"other": 0.0, "forward": 0.0, "data": 0.0}
            named: dict[str, float] = {}
            for st in of_rank.get(r, ()):
                if st.at(k):
                    s = jit(st.seconds)
                    extra[st.where] += s
                    if st.name is not None:
                        named[st.name] = named.get(st.name, 0.0) + s
            phases = {
                "data_wait": jit(spec.data_wait) + extra["data"],
                "h2d": jit(spec.h2d),
                "forward": jit(spec.forward) + extra["forward"],
                "backward": jit(spec.backward),
                "optimizer": jit(spec.optimizer),
            }
            pre = sum(v for name, v in phases.items() if name != "optimizer")
            plans.append((phases, clock[r] + pre, extra["other"], named))
        done = max(arrive for _, arrive, _, _ in plans) + jit(comm)
        batch = []
        for r, (phases, arrive, other, named) in enumerate(plans):
            end = done + phases["optimizer"] + other
            batch.append(
                StepSample(
                    rank=r,
                    step=k,
                    time=end,
                    step_s=end - clock[r],
                    data_wait_s=phases["data_wait"],
                    h2d_s=phases["h2d"],
                    forward_s=phases["forward"],
                    backward_s=phases["backward"],
                    optimizer_s=phases["optimizer"],
                    collective_wait_s=done - arrive,
                    batch_size=specs[r].batch_size,
                    outside=named or None,
                )
            )
            clock[r] = end
        store.add(Batch(steps=tuple(batch)))
    now = max(clock)
    return store.snapshot(now=now, window_s=window_s)
