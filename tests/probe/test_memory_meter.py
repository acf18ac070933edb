"""The memory meter in this process (no hooks patched into torch: the meter is called directly,
as the probe's model and optimizer hooks call it).

Exact figures come from tensors of known size: float32 is 4 bytes a value.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from auditor.probe.memory import MemoryMeter, fixed_part


def step(meter: MemoryMeter, model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    meter.forward_begin(model, int(x.shape[0]))
    try:
        out = model(x)
    finally:
        meter.forward_end()
    out.square().mean().backward()
    opt.step()
    meter.after_step(model, opt)


def test_shared_parameters_count_once() -> None:
    emb = nn.Embedding(100, 16)
    head = nn.Linear(16, 100, bias=False)
    head.weight = emb.weight  # tied, as language models tie input and output embeddings
    model = nn.Sequential(emb, head)
    fixed = fixed_part(model, [])
    fixed.pop("_seen")
    assert fixed["param_bytes"] == 100 * 16 * 4
    assert fixed["param_count"] == 1


def test_views_of_one_storage_count_once() -> None:
    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Parameter(torch.zeros(3, 8, 8))
            self.register_buffer("a", torch.zeros(10))
            self.register_buffer("b", self.a[:5])  # a view of a: one storage

    fixed = fixed_part(Split(), [])
    assert fixed["param_bytes"] == 3 * 8 * 8 * 4
    assert fixed["buffer_bytes"] == 10 * 4


def test_activations_exclude_parameters_and_sample_every_nth_step() -> None:
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = MemoryMeter(torch, rank=lambda: 0, activations_every=3)
    sampled = []
    for i in range(7):
        step(meter, model, opt, torch.randn(16, 8))
        b = meter.take()
        if b is not None:
            sampled.append((i, b.activation_step))
    # Input (8) and tanh's output (32, saved by tanh and the second Linear): 4 bytes each.
    assert meter.latest is not None
    assert meter.latest.activation_bytes == 16 * (8 + 32) * 4
    assert meter.latest.activations_per_sample == (8 + 32) * 4
    assert meter.latest.activations_every == 3
    assert meter._forwards == 7  # every forward seen, one in three measured


def _sampled_forwards(
    meter: MemoryMeter, model: nn.Module, inputs: list[torch.Tensor]
) -> list[int]:
    """The forwards (1-based) on which ``meter`` measured the activations, one input each."""
    sampled = []
    for i, x in enumerate(inputs, 1):
        before = meter.samples
        meter.forward_begin(model, int(x.shape[0]))
        try:
            model(x).sum().backward()
        finally:
            meter.forward_end()
        if meter.samples > before:
            sampled.append(i)
    return sampled


def test_activations_that_hold_are_sampled_less_and_less_often() -> None:
    """The first forward, then every 10th; each sample that holds doubles the interval, up to
    every 640th forward."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    meter = MemoryMeter(torch, rank=lambda: 0, scan=False)
    x = torch.randn(4, 8)
    sampled = _sampled_forwards(meter, model, [x] * 2000)
    assert sampled == [1, 11, 31, 71, 151, 311, 631, 1271, 1911]
    assert meter._act is not None and meter._act[:2] == (4 * (8 + 16) * 4, 4)


def test_activations_that_move_are_sampled_at_the_base_interval_again() -> None:
    """A longer sequence saves more per sample: the sample that sees it brings the interval
    back to every 10th forward, and the next sample holds again from there."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    meter = MemoryMeter(torch, rank=lambda: 0, scan=False)
    short, long = torch.randn(4, 6, 8), torch.randn(4, 12, 8)
    sampled = _sampled_forwards(meter, model, [short] * 100 + [long] * 100)
    # 1, 11, 31, 71 on the short sequence; the next (151) sees the long one: every 10th again.
    assert sampled == [1, 11, 31, 71, 151, 161, 181]
    assert meter._act is not None and meter._act[:2] == (4 * 12 * (8 + 16) * 4, 4)


def test_coexists_with_activation_checkpointing() -> None:
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())

    class Net(nn.Module):
        def __init__(self, ckpt: bool) -> None:
            super().__init__()
            self.block = copy.deepcopy(block)
            self.head = nn.Linear(64, 1)
            self.ckpt = ckpt

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = checkpoint(self.block, x, use_reentrant=False) if self.ckpt else self.block(x)
            return self.head(h)

    x = torch.randn(32, 16)
    grads = {}
    acts = {}
    for ckpt in (False, True):
        torch.manual_seed(1)  # the same head both times
        net = Net(ckpt)
        opt = torch.optim.SGD(net.parameters(), lr=0.0)
        meter = MemoryMeter(torch, rank=lambda: 0, activations_every=1, scan=False)
        step(meter, net, opt, x)
        assert meter.latest is not None and meter.latest.activation_bytes is not None
        acts[ckpt] = meter.latest.activation_bytes
        grads[ckpt] = [p.grad.clone() for p in net.parameters() if p.grad is not None]
    # The checkpointed block keeps none of its insides: fewer saved bytes, same gradients.
    assert acts[True] < acts[False]
    assert grads[False], "no gradient to compare"
    for a, b in zip(grads[False], grads[True], strict=True):
        assert torch.allclose(a, b)


def test_an_extra_copy_outside_the_model_is_found() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20))
    opt = torch.optim.Adam(model.parameters())
    meter = MemoryMeter(torch, rank=lambda: 0, scan_interval_s=0.0)
    gc.collect()  # earlier tests' garbage goes now, not between the two scans
    ema = copy.deepcopy(model)
    step(meter, model, opt, torch.randn(4, 10))
    b = meter.take()
    assert b is not None
    own = (10 * 20 + 20 + 2 * 20) * 4  # weight, bias, BN weight and bias
    buffers = (2 * 20) * 4 + 8  # running mean and var, num_batches_tracked (int64)
    assert b.param_bytes == own and b.buffer_bytes == buffers
    # Other tests' modules may still be alive in this process: the copy is the difference.
    del ema
    gc.collect()
    step(meter, model, opt, torch.randn(4, 10))
    after = meter.measure()
    assert after is not None
    assert b.other_module_bytes - after.other_module_bytes == own + buffers


@pytest.mark.parametrize(
    ("make", "kinds"),
    [
        (lambda p: torch.optim.Adam(p), {"exp_avg": 1, "exp_avg_sq": 1}),
        (lambda p: torch.optim.AdamW(p), {"exp_avg": 1, "exp_avg_sq": 1}),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), {"momentum_buffer": 1}),
        (lambda p: torch.optim.SGD(p, lr=0.1), {}),
    ],
)
def test_optimizer_state_by_kind(make: object, kinds: dict[str, int]) -> None:
    model = nn.Linear(50, 50)
    opt = make(model.parameters())  # type: ignore[operator]
    meter = MemoryMeter(torch, rank=lambda: 0, scan=False)
    step(meter, model, opt, torch.randn(4, 50))
    b = meter.take()
    assert b is not None
    p = (50 * 50 + 50) * 4
    by = {k: v for k, v in b.optimizer_bytes_by_kind.items() if k != "step"}
    assert by == {k: n * p for k, n in kinds.items()}
    assert b.grad_bytes == p


def test_a_changed_budget_is_sent_again_and_an_unchanged_one_is_not() -> None:
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    meter = MemoryMeter(
        torch,
        rank=lambda: 0,
        check_every=2,
        check_interval_s=0.0,
        activations_every=100,
        scan=False,
    )
    step(meter, model, opt, torch.randn(2, 4))
    assert meter.take() is not None
    for _ in range(3):
        step(meter, model, opt, torch.randn(2, 4))
    assert meter.take() is None  # nothing changed
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(100))]})
    model.extra = opt.param_groups[-1]["params"][0]  # the model grows a parameter
    for _ in range(2):
        step(meter, model, opt, torch.randn(2, 4))
    b = meter.take()
    assert b is not None and b.param_bytes == (16 + 4 + 100) * 4


def test_every_optimizer_that_steps_is_counted_and_none_kept_alive() -> None:
    """Two optimizers stepping in turn (a GAN's) both hold state in the budget; one the script
    drops leaves it: the meter holds optimizers weakly."""
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    a = torch.optim.Adam(model[0].parameters())
    b = torch.optim.Adam(model[1].parameters())
    meter = MemoryMeter(torch, rank=lambda: 0, check_every=1, check_interval_s=0.0, scan=False)
    for _ in range(2):
        step(meter, model, a, torch.randn(2, 10))
        step(meter, model, b, torch.randn(2, 10))
    budget = meter.measure()
    assert budget is not None
    p = (10 * 10 + 10) * 4
    assert budget.optimizer_bytes_by_kind["exp_avg"] == 2 * p
    del b
    gc.collect()
    budget = meter.measure()
    assert budget is not None and budget.optimizer_bytes_by_kind["exp_avg"] == p


def test_evaluation_forwards_do_not_replace_the_sample() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = MemoryMeter(torch, rank=lambda: 0, activations_every=1, scan=False)
    step(meter, model, opt, torch.randn(4, 8))
    with torch.no_grad():  # an evaluation pass: nothing saved, not a sample
        meter.forward_begin(model, 64)
        model(torch.randn(64, 8))
        meter.forward_end()
    step(meter, model, opt, torch.randn(4, 8))
    assert meter.latest is not None
    assert meter.latest.activation_batch == 4
    assert meter.latest.activation_bytes == 4 * (8 + 16) * 4


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own imports
def test_a_compiled_model_is_not_sampled() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model[0].compile()  # marks the module; nothing is compiled until it runs
    meter = MemoryMeter(torch, rank=lambda: 0, activations_every=1, scan=False)
    meter.forward_begin(model, 4)
    assert meter.sampling is None
    meter.forward_end()
