"""Snapshots of jobs that counted their FLOPs (``RankView.flops``), for the MFU analysis, the
low_mfu rule, its wording and the reports: every rank's steps, its account of the run, its
GPU (an NVML name of the peak table) and its :class:`~auditor.samples.FlopCount`, built exactly
as the contract of issue 30 gives it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from auditor.analysis.accounting import Account
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.samples import DeviceSample, FlopCount, LoaderConfig, RankInfo, StepSample

H100 = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class RankSpec:
    """One rank: seconds per step by phase, FLOPs per step by dtype, samples per step."""

    data_wait_s: float = 0.002
    h2d_s: float = 0.001
    forward_s: float = 0.030
    backward_s: float = 0.060
    optimizer_s: float = 0.005
    collective_wait_s: float = 0.002
    other_s: float = 0.002
    by_dtype: Mapping[str, float] = field(default_factory=lambda: {"bf16": 40e12})
    batch: int = 64
    micro_batches: int = 1
    startup_s: float = 0.0

    @property
    def step_s(self) -> float:
        return (
            self.data_wait_s
            + self.h2d_s
            + self.forward_s
            + self.backward_s
            + self.optimizer_s
            + self.collective_wait_s
            + self.other_s
        )


def count(rank: int, spec: RankSpec, *, device: str = "cuda", step: int = 10) -> FlopCount:
    by_dtype = dict(spec.by_dtype)
    return FlopCount(
        rank=rank,
        time=1.0,
        step=step,
        flops=sum(by_dtype.values()),
        by_dtype=by_dtype,
        micro_batches=spec.micro_batches,
        samples=spec.batch,
        device=device,
        cost_s=0.05,
    )


def flops_snapshot(
    specs: Mapping[int, RankSpec] | list[RankSpec],
    *,
    steps: int = 100,
    device: str = "cuda",
    model: str = H100,
    counted: bool = True,
    **info: Any,
) -> Snapshot:
    """A DDP job of ``specs`` ranks, ``steps`` steps each, one GPU per rank (``model``) or the
    CPU, with its whole run accounted (start-up, then the steps) and its FLOPs counted."""
    ranks = dict(enumerate(specs)) if isinstance(specs, list) else dict(specs)
    views = []
    devices = []
    accounts = {}
    for r, spec in sorted(ranks.items()):
        uuid = f"GPU-{r:04d}"
        on_gpu = device == "cuda"
        rank_info = RankInfo(
            rank=r,
            world_size=len(ranks),
            local_rank=r,
            host="node",
            pid=1000 + r,
            device=f"cuda:{r}" if on_gpu else "cpu",
            parallel_mode="ddp",
            devices=(r,) if on_gpu else (),
            device_uuids=(uuid,) if on_gpu else (),
            loader=LoaderConfig(2, True, 2, True, spec.batch // spec.micro_batches, True, "D"),
            **info,
        )
        base = StepSample(
            rank=r,
            step=0,
            time=0.0,
            step_s=spec.step_s,
            data_wait_s=spec.data_wait_s,
            h2d_s=spec.h2d_s,
            forward_s=spec.forward_s,
            backward_s=spec.backward_s,
            optimizer_s=spec.optimizer_s,
            collective_wait_s=spec.collective_wait_s,
            batch_size=spec.batch,
            micro_batches=spec.micro_batches,
        )
        t0 = spec.startup_s
        samples = tuple(
            replace(base, step=i, time=t0 + (i + 1) * spec.step_s) for i in range(steps)
        )
        views.append(
            RankView(
                info=rank_info,
                steps=samples,
                flops=count(r, spec, device=device) if counted else None,
            )
        )
        if on_gpu:
            devices.append(
                DeviceSample(
                    node="node", index=r, uuid=uuid, time=t0 + 1.0, model=model, gpu_util=1.0
                )
            )
        accounts[r] = Account(
            rank=r,
            wall_s=spec.startup_s + steps * spec.step_s,
            startup_s=spec.startup_s,
            steps=steps,
            data_wait_s=steps * spec.data_wait_s,
            h2d_s=steps * spec.h2d_s,
            forward_s=steps * spec.forward_s,
            backward_s=steps * spec.backward_s,
            optimizer_s=steps * spec.optimizer_s,
            collective_wait_s=steps * spec.collective_wait_s,
            other_s=steps * spec.other_s,
        )
    end = max(s.startup_s + steps * s.step_s for s in ranks.values())
    return Snapshot(
        job="mfu",
        start=0.0,
        end=end,
        ranks=tuple(views),
        devices=tuple(devices),
        accounts=accounts,
        total_steps=dict.fromkeys(ranks, steps),
    )
