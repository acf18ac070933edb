"""The measured memory budget's arithmetic (``auditor.analysis.budget``) and the memory rules'
verdicts built on it: every lever's bytes and batch, worked out by hand.

The reference rank: 100 MiB of float32 parameters, 100 MiB of gradients, Adam's 200 MiB of
state, no buffers, 10 MiB of activations per sample at batch 8, on a 1 GiB GPU with a 10%
margin (921.6 MiB usable). Fixed part 400 MiB; at batch 8, 480 MiB.
"""

from __future__ import annotations

import math

import pytest

from auditor.analysis.budget import (
    AUTOCAST_FACTOR,
    CHECKPOINT_FACTOR,
    DEVICE_LESS_OUTSIDE,
    DEVICE_TOTAL,
    HOST_SHARE,
    capacity,
    model_for,
)
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import memory_headroom, memory_imbalance, memory_pressure
from auditor.analysis.snapshot import RankView, Snapshot
from auditor.samples import MemoryBudget, RankInfo, StepSample
from auditor.wording import fmt_bytes
from tests.helpers.units import GIB, MIB


def adam(rank: int = 0, **kw: object) -> MemoryBudget:
    base: dict[str, object] = dict(
        rank=rank,
        time=100.0,
        step=1,
        device="cuda:0",
        param_count=4,
        param_bytes=100 * MIB,
        param_bytes_by_dtype={"float32": 100 * MIB},
        grad_bytes=100 * MIB,
        optimizer_bytes=200 * MIB,
        optimizer_bytes_by_kind={"exp_avg": 100 * MIB, "exp_avg_sq": 100 * MIB},
        optimizer="Adam",
        activation_bytes=80 * MIB,
        activation_batch=8,
        device_total_bytes=GIB,
    )
    base.update(kw)
    return MemoryBudget(**base)  # type: ignore[arg-type]


USABLE = 0.9 * GIB
FREE = USABLE - 400 * MIB  # room for activations at the reference


def test_fixed_part_and_capacity_on_a_gpu() -> None:
    m = model_for(adam(), batch=8, margin=0.1, world_size=1)
    assert m.fixed_bytes == 400 * MIB
    assert m.per_sample_bytes == 10 * MIB
    assert m.current_bytes == 480 * MIB
    assert m.capacity_bytes == pytest.approx(USABLE)
    assert m.capacity_source == DEVICE_TOTAL == "device_total"
    assert m.largest_batch() == math.floor(FREE / (10 * MIB)) == 52
    assert m.main_lever == "fixed"  # 400 MiB fixed against 80 MiB of activations


def test_what_the_gpu_holds_outside_the_allocator_is_not_room_for_the_batch() -> None:
    # 100 MiB of CUDA context (and whatever else the GPU holds beside this rank's allocator).
    m = model_for(adam(device_outside_bytes=100 * MIB), batch=8, margin=0.1, world_size=1)
    assert m.capacity_bytes == pytest.approx(USABLE - 100 * MIB)
    assert m.capacity_source == DEVICE_LESS_OUTSIDE
    assert m.largest_batch() == math.floor((FREE - 100 * MIB) / (10 * MIB)) == 42
    assert m.usable(GIB) == GIB - 100 * MIB


def test_the_allocators_peak_beyond_the_tensors_grows_with_the_batch() -> None:
    # The allocator peaked at 560 MiB where the tensors account for 480 MiB at batch 8: 80 MiB
    # of temporaries and fragmentation, 10 MiB a sample, on top of 10 MiB of activations.
    m = model_for(adam(device_peak_bytes=560 * MIB), batch=8, margin=0.1, world_size=1)
    assert m.overhead_bytes == 80 * MIB
    assert m.current_bytes == 560 * MIB  # the prediction at the current batch is the peak
    assert m.largest_batch() == math.floor(FREE / (20 * MIB)) == 26
    # Checkpointing shrinks the activations, not the temporaries.
    per = 10 * MIB / CHECKPOINT_FACTOR + 10 * MIB
    assert m.levers()["checkpointing"].largest_batch == math.floor(FREE / per)
    # A peak below the model (it was measured before the batch grew) changes nothing.
    low = model_for(adam(device_peak_bytes=300 * MIB), batch=8, margin=0.1, world_size=1)
    assert low.overhead_bytes == 0 and low.largest_batch() == 52


def test_capacity_on_a_cpu_job_is_the_ranks_share_of_the_host() -> None:
    b = adam(device="cpu", device_total_bytes=None, host_total_bytes=32 * GIB)
    b2 = MemoryBudget(**{**b.to_dict(), "host_available_bytes": 8 * GIB, "local_ranks": 2})
    cap, source = capacity(b2, margin=0.1, batch=8)
    assert source == HOST_SHARE
    # what the rank holds now (480 MiB) + 90% of its half of the available 8 GiB
    assert cap == pytest.approx(480 * MIB + 0.9 * 4 * GIB)


def test_checkpointing_lever() -> None:
    lv = model_for(adam(), batch=8, margin=0.1, world_size=1).levers()["checkpointing"]
    assert lv.frees_bytes == round(80 * MIB * (1 - 1 / CHECKPOINT_FACTOR)) == 60 * MIB
    assert lv.largest_batch == math.floor(FREE / (10 * MIB / CHECKPOINT_FACTOR)) == 208


def test_autocast_lever_halves_activations() -> None:
    lv = model_for(adam(), batch=8, margin=0.1, world_size=1).levers()["autocast_bf16"]
    assert lv.frees_bytes == 40 * MIB
    assert lv.largest_batch == math.floor(FREE / (10 * MIB / AUTOCAST_FACTOR)) == 104


def test_bf16_parameters_halve_parameters_and_gradients() -> None:
    levers = model_for(adam(), batch=8, margin=0.1, world_size=1).levers()
    assert levers["bf16_params"].frees_bytes == 100 * MIB
    assert levers["bf16_params"].largest_batch == math.floor((FREE + 100 * MIB) / (10 * MIB))
    half = adam(param_bytes_by_dtype={"bfloat16": 100 * MIB})
    levers = model_for(half, batch=8, margin=0.1, world_size=1).levers()
    assert "bf16_params" not in levers and "autocast_bf16" not in levers


def test_optimizer_levers_adam_to_momentum_to_sgd() -> None:
    levers = model_for(adam(), batch=8, margin=0.1, world_size=1).levers()
    # Adam x4 -> SGD with momentum x3 frees one copy; -> plain SGD x2 frees two.
    assert levers["sgd_momentum"].frees_bytes == 100 * MIB
    assert levers["sgd"].frees_bytes == 200 * MIB
    assert levers["sgd"].largest_batch == math.floor((FREE + 200 * MIB) / (10 * MIB)) == 72
    momentum = adam(optimizer_bytes=100 * MIB, optimizer_bytes_by_kind={"momentum_buffer": 100})
    levers = model_for(momentum, batch=8, margin=0.1, world_size=1).levers()
    assert "sgd_momentum" not in levers and levers["sgd"].frees_bytes == 100 * MIB


def test_step_counters_are_not_state_to_give_up() -> None:
    b = adam(
        optimizer_bytes=200 * MIB + 16,
        optimizer_bytes_by_kind={"exp_avg": 100 * MIB, "exp_avg_sq": 100 * MIB, "step": 16},
    )
    m = model_for(b, batch=8, margin=0.1, world_size=1)
    assert m.state_bytes == 200 * MIB
    assert m.levers()["sgd_momentum"].frees_bytes == 100 * MIB


def test_sharding_lever_keeps_a_world_size_share() -> None:
    levers = model_for(adam(), batch=8, margin=0.1, world_size=4).levers()
    assert levers["shard"].frees_bytes == 300 * MIB  # 400 MiB fixed, a quarter stays
    assert levers["shard"].largest_batch == math.floor((USABLE - 100 * MIB) / (10 * MIB))
    assert "shard" not in model_for(adam(), batch=8, margin=0.1, world_size=1).levers()
    sharded = adam(sharded=True)
    assert "shard" not in model_for(sharded, batch=8, margin=0.1, world_size=4).levers()


def test_activations_are_the_lever_when_they_dominate() -> None:
    b = adam(activation_bytes=8 * 100 * MIB)  # 100 MiB a sample: 800 MiB at batch 8
    assert model_for(b, batch=8, margin=0.1, world_size=1).main_lever == "activations"


def test_the_largest_levers_as_fixes() -> None:
    m = model_for(adam(), batch=8, margin=0.1, world_size=4)
    # shard 300 MiB, sgd 200 MiB, then bf16_params and sgd_momentum 100 MiB each (the first).
    assert [lv.name for lv in m.largest_levers()] == ["shard", "sgd", "bf16_params"]
    assert m.fixes(0, ("memory_headroom",), gpu="GPU-0") == [
        Fix("sharding", 0, None, True, None, ("memory_headroom",), "GPU-0"),
        Fix("optimizer", 0, "Adam", "sgd", None, ("memory_headroom",), "GPU-0"),
        Fix("bf16_params", 0, None, True, None, ("memory_headroom",), "GPU-0"),
    ]
    assert m.evidence()["source"] == "budget"
    assert m.evidence()["capacity_source"] == DEVICE_TOTAL


def test_extra_module_copies_count_in_the_fixed_part() -> None:
    m = model_for(adam(other_module_bytes=100 * MIB), batch=8, margin=0.1, world_size=1)
    assert m.fixed_bytes == 500 * MIB


def test_fmt_bytes_keeps_small_figures_readable() -> None:
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(3 * GIB) == "3.0 GiB"
    assert fmt_bytes(12) == "12 B"


# --- the rules on measured budgets ---------------------------------------------------------------


def view(rank: int, budget: MemoryBudget, *, batch: int = 8, steps: int = 10) -> RankView:
    info = RankInfo(rank=rank, world_size=2, host="h", device=budget.device, parallel_mode="ddp")
    rows = tuple(
        StepSample(rank=rank, step=i, time=100.0 + i, step_s=0.1, batch_size=batch)
        for i in range(steps)
    )
    return RankView(info=info, steps=rows, memory=budget)


def snap(*views: RankView) -> Snapshot:
    return Snapshot(job="j", start=0.0, end=200.0, ranks=tuple(views))


def test_headroom_says_the_largest_batch_from_the_budget() -> None:
    found = memory_headroom.RULE(snap(view(0, adam()), view(1, adam(rank=1))))
    assert [(f.severity, f.ranks) for f in found] == [("info", (0, 1))]
    row = found[0].evidence["per_rank"]["0"]
    assert row["largest_batch"] == 52 and row["current_batch"] == 8
    assert row["levers"]["sgd"]["frees_bytes"] == 200 * MIB
    assert row["main_lever"] == "fixed"
    assert found[0].gpus == ()
    assert found[0].fixes == tuple(
        Fix("batch_size", r, 8, 52, None, ("memory_headroom",)) for r in (0, 1)
    )


def test_headroom_warns_when_the_batch_does_not_fit_on_a_gpu() -> None:
    found = memory_headroom.RULE(snap(view(0, adam(), batch=64)))
    assert [(f.kind, f.severity, f.ranks) for f in found] == [("memory_headroom", "warning", (0,))]
    # 640 MiB of activations against a 400 MiB fixed part: checkpointing first.
    assert found[0].facts.ranks[0].main_lever == "activations"
    assert [(x.lever, x.proposed) for x in found[0].fixes] == [
        ("gradient_checkpointing", True),
        ("autocast_bf16", True),
        ("optimizer", "sgd"),
    ]
    big = adam(
        param_bytes=250 * MIB, param_bytes_by_dtype={"float32": 250 * MIB}, grad_bytes=250 * MIB,
        optimizer_bytes=500 * MIB, optimizer_bytes_by_kind={"exp_avg": 250 * MIB},
    )  # fmt: skip
    found = memory_headroom.RULE(snap(view(0, big)))
    assert [f.severity for f in found] == ["warning"]
    assert found[0].facts.ranks[0].main_lever == "fixed"
    assert found[0].evidence["per_rank"]["0"]["levers"]["sgd"]["frees_bytes"] == 500 * MIB
    assert found[0].fixes[0] == Fix("optimizer", 0, "Adam", "sgd", None, ("memory_headroom",))


def test_headroom_on_a_cpu_job_stays_info() -> None:
    cpu = adam(
        device="cpu", device_total_bytes=None, host_total_bytes=64 * GIB,
        host_available_bytes=32 * GIB, local_ranks=2,
    )  # fmt: skip
    found = memory_headroom.RULE(snap(view(0, cpu)))
    assert found and all(f.severity == "info" for f in found)
    # The host would "fit" thousands of samples: the figure stays in the evidence, and no fix
    # offers a batch the rank should not take.
    assert found[0].evidence["per_rank"]["0"]["largest_batch"] > 1000
    assert found[0].evidence["per_rank"]["0"]["capacity_source"] == HOST_SHARE
    assert found[0].fixes == ()


def test_pressure_on_a_cpu_host_short_of_memory() -> None:
    def cpu(avail: int) -> MemoryBudget:
        return adam(
            device="cpu", device_total_bytes=None, host_total_bytes=64 * GIB,
            host_available_bytes=avail,
        )  # fmt: skip

    assert memory_pressure.RULE(snap(view(0, cpu(16 * GIB)))) == []
    found = memory_pressure.RULE(snap(view(0, cpu(2 * GIB))))  # 3% available
    assert [(f.severity, f.ranks) for f in found] == [("warning", (0,))]
    assert found[0].facts.host == "h" and found[0].gpus == ()
    assert Fix("optimizer", 0, "Adam", "sgd", None, ("memory_pressure",)) in found[0].fixes
    found = memory_pressure.RULE(snap(view(0, cpu(GIB))))  # 1.6%
    assert found[0].severity == "critical"


def test_imbalance_names_the_rank_with_an_extra_copy() -> None:
    found = memory_imbalance.RULE(
        snap(view(0, adam()), view(1, adam(rank=1, other_module_bytes=100 * MIB)))
    )
    assert [f.ranks for f in found] == [(1,)]
    assert found[0].evidence["extra_by_part"] == {"other_module_bytes": 100 * MIB}
    assert found[0].evidence["source"] == "budget"
    assert found[0].facts.main_part == "other_module_bytes"
    assert found[0].fixes == (Fix("memory_release", 1, 100 * MIB, 0, None, ("memory_imbalance",)),)


def test_balanced_budgets_raise_nothing() -> None:
    views = [view(r, adam(rank=r)) for r in range(4)]
    assert memory_imbalance.RULE(snap(*views)) == []


def test_small_differences_are_not_an_imbalance() -> None:
    # 512 KiB more buffers: under the 1 MiB floor.
    found = memory_imbalance.RULE(
        snap(view(0, adam()), view(1, adam(rank=1, buffer_bytes=512 * 1024)))
    )
    assert found == []
