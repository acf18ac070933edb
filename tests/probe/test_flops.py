"""FLOPs per step, counted (``auditor.probe.flops``): known models against counts by hand.

Hand counts. A ``Linear(i, o)`` on a batch of ``B`` costs ``2*B*i*o`` FLOPs forward (one
multiply-add per weight per sample), the same again for its weight's gradient, and the same
again for its input's gradient, which autograd computes only where the input needs one: never
for the first layer (the data needs no gradient). A ``Conv2d(c, k, 3)`` with an output of
``B x k x H x W`` costs ``2 * B*k*H*W * c*3*3`` forward, the same for the weight's gradient and,
past the first layer, the same for the input's. Element-wise work (ReLU, the loss, SGD's update)
is in no formula: FLOPs are the matrix products, as ``FlopCounterMode`` counts them.

In-process tests drive :class:`FlopMeter` by hand (its dispatch mode is entered and left
cleanly); the others run a real training loop with the probe booted (``scripts/flops.py``).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from auditor.probe.flops import FlopMeter, dtype_class, flop_kind, shape_of
from auditor.samples import FlopCount, StepSample

from . import SCRIPTS, Job, JobResult

IN, HID, OUT = 64, 128, 10  # scripts/flops.py's Linear stack


def linear_flops(batch: int, dims: tuple[int, ...] = (IN, HID, OUT)) -> int:
    """Forward and backward of a Linear stack over ``dims``, by hand."""
    pairs = list(itertools.pairwise(dims))
    forward = sum(2 * batch * i * o for i, o in pairs)
    weight_grads = forward
    input_grads = sum(2 * batch * i * o for i, o in pairs[1:])  # not the first layer's input
    return forward + weight_grads + input_grads


def conv_flops(batch: int) -> int:
    """``Conv2d(3, 8, 3, padding=1) - ReLU - Conv2d(8, 4, 3, stride=2)`` on 3x16x16, by hand."""
    first = 2 * batch * 8 * 16 * 16 * (3 * 3 * 3)  # output 8x16x16, 27 MACs each
    second = 2 * batch * 4 * 7 * 7 * (8 * 3 * 3)  # output 4x7x7 ((16-3)//2+1), 72 MACs each
    forward = first + second
    return forward + forward + second  # weight grads of both, the input grad of the second


def conv_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2))


def linear_model() -> nn.Module:
    return nn.Sequential(nn.Linear(IN, HID), nn.ReLU(), nn.Linear(HID, OUT))


class Loop:
    """A training loop driving a meter the way the probe's hooks do."""

    def __init__(self, model: nn.Module, **kwargs: object) -> None:
        self.model = model
        self.step = 0
        self.meter = FlopMeter(torch, rank=lambda: 0, step=lambda: self.step, **kwargs)  # type: ignore[arg-type]
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def run(self, *micro_batches: torch.Tensor, autocast: bool = False) -> None:
        for x in micro_batches:
            self.meter.forward_begin(self.model, x.shape)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = self.model(x)
            out.float().square().mean().backward()
        self.opt.step()
        self.meter.step_end()
        self.opt.zero_grad()
        self.step += 1

    def counts(self) -> list[FlopCount]:
        """The counts made so far (their costs left unknown: no steps resolved)."""
        self.meter.resolved([], final=True)
        return self.meter.take()


def within(counted: float, exact: float, tolerance: float = 0.01) -> bool:
    return abs(counted - exact) <= tolerance * exact


def test_linear_stack_forward_and_backward_by_hand() -> None:
    loop = Loop(linear_model(), at_step=2)
    for _ in range(4):
        loop.run(torch.randn(32, IN))
    (c,) = loop.counts()
    assert c.step == 2 and c.micro_batches == 1 and c.samples == 32 and c.device == "cpu"
    assert within(c.flops, linear_flops(32)), (c.flops, linear_flops(32))
    assert c.by_dtype == {"fp32": c.flops}
    assert not loop.meter.counting


def test_backward_is_counted() -> None:
    # Forward alone is a third of a deep stack's FLOPs; backward's weight and input gradients
    # (run by autograd's engine, on this thread for CPU tensors) are the rest.
    dims = (IN, HID, HID, HID, OUT)
    loop = Loop(nn.Sequential(*(nn.Linear(i, o) for i, o in itertools.pairwise(dims))))
    loop.step = 3
    loop.run(torch.randn(8, IN))
    (c,) = loop.counts()
    forward = sum(2 * 8 * i * o for i, o in itertools.pairwise(dims))
    assert within(c.flops, linear_flops(8, dims))
    assert c.flops > 2.5 * forward


def test_conv_stack_by_hand() -> None:
    loop = Loop(conv_model(), at_step=0)
    loop.run(torch.randn(4, 3, 16, 16))
    (c,) = loop.counts()
    assert within(c.flops, conv_flops(4)), (c.flops, conv_flops(4))
    assert c.samples == 4


def test_autocast_bf16_splits_by_dtype() -> None:
    # Under CPU autocast the Linear layers run in bf16; a head kept in fp32 (autocast off around
    # it) stays fp32, forward and backward.
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(IN, HID)
            self.head = nn.Linear(HID, OUT)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(self.body(x))
            with torch.autocast("cpu", enabled=False):
                return self.head(h.float())

    loop = Loop(Mixed(), at_step=0)
    loop.run(torch.randn(16, IN), autocast=True)
    (c,) = loop.counts()
    body = 2 * 2 * 16 * IN * HID  # forward + weight grad (its input needs no gradient)
    head = 3 * 2 * 16 * HID * OUT  # forward + weight grad + input grad
    assert within(c.by_dtype["bf16"], body), c.by_dtype
    assert within(c.by_dtype["fp32"], head), c.by_dtype
    assert sum(c.by_dtype.values()) == c.flops


def test_gradient_accumulation_counts_every_micro_batch() -> None:
    loop = Loop(linear_model(), at_step=1)
    for _ in range(3):
        loop.run(*(torch.randn(8, IN) for _ in range(4)))
    (c,) = loop.counts()
    assert c.micro_batches == 4 and c.samples == 32
    assert within(c.flops, 4 * linear_flops(8))
    assert within(c.flops_per_micro_batch, linear_flops(8))


def test_recounted_on_a_new_shape_and_resent_on_a_known_one() -> None:
    loop = Loop(linear_model(), at_step=1)
    for _ in range(3):
        loop.run(torch.randn(16, IN))
    first = loop.counts()
    loop.run(torch.randn(24, IN))  # a new batch size: counted again
    loop.run(torch.randn(24, IN))
    second = loop.counts()
    loop.run(torch.randn(16, IN))  # back to a shape counted before: no count, the old one again
    again = loop.counts()
    assert [c.step for c in first] == [1] and within(first[0].flops, linear_flops(16))
    assert [c.step for c in second] == [3] and within(second[0].flops, linear_flops(24))
    assert [c.step for c in again] == [1] and again[0].flops == first[0].flops
    assert again[0].time > second[0].time  # the latest count is the running shape's
    assert not loop.meter.counting


def test_counts_are_bounded() -> None:
    loop = Loop(linear_model(), at_step=0, max_counts=2)
    for b in (4, 5, 6, 7):
        loop.run(torch.randn(b, IN))
    assert [c.samples for c in loop.counts()] == [4, 5]


def test_evaluation_forward_does_not_start_a_count() -> None:
    loop = Loop(linear_model(), at_step=0)
    with torch.no_grad():
        loop.meter.forward_begin(loop.model, (64, IN))
        loop.model(torch.randn(64, IN))
    assert not loop.meter.counting
    loop.run(torch.randn(8, IN))
    assert [c.samples for c in loop.counts()] == [8]


def test_compiled_model_is_left_alone() -> None:
    model = linear_model()
    object.__setattr__(model, "_orig_mod", None)  # what torch.compile's wrapper carries
    loop = Loop(model, at_step=0)
    loop.run(torch.randn(8, IN))
    assert loop.counts() == [] and loop.meter.skipped == "compiled"


def test_counted_step_flagged_and_its_cost_from_its_neighbours() -> None:
    loop = Loop(linear_model(), at_step=2)
    for _ in range(4):
        loop.run(torch.randn(8, IN))

    def sample(step: int, step_s: float) -> StepSample:
        return StepSample(rank=0, step=step, time=100.0 + step, step_s=step_s)

    m = loop.meter
    first = m.resolved([sample(0, 0.5), sample(1, 0.10)])
    assert not any(s.flops_counted for s in first) and m.take() == []
    # The counted step resolves after its predecessor; its successor comes in a later flush.
    counted = m.resolved([sample(2, 0.25)])
    assert [s.flops_counted for s in counted] == [True] and m.take() == []
    later = m.resolved([sample(3, 0.12), sample(4, 0.11)])
    assert not any(s.flops_counted for s in later)
    (c,) = m.take()
    assert c.cost_s == pytest.approx(0.15)  # 0.25 less the faster neighbour (0.10)
    m.resend()
    assert m.take() == [c]


def test_tf32_only_for_fp32_on_cuda_where_allowed() -> None:
    # (dtype, device, convolution?, TF32 for matmuls, TF32 for convolutions) -> class
    assert flop_kind(torch.float32, "cuda", False, True, False) == "tf32"
    assert flop_kind(torch.float32, "cuda", False, False, True) == "fp32"
    assert flop_kind(torch.float32, "cuda", True, False, True) == "tf32"
    assert flop_kind(torch.float32, "cuda", True, True, False) == "fp32"
    assert flop_kind(torch.float32, "cpu", False, True, True) == "fp32"  # CPU: no TF32
    assert flop_kind(torch.bfloat16, "cuda", False, True, True) == "bf16"


def test_dtype_classes_and_shapes() -> None:
    assert [dtype_class(d) for d in (torch.bfloat16, torch.float16, torch.float32)] == [
        "bf16",
        "fp16",
        "fp32",
    ]
    assert dtype_class(torch.float64) == "fp64" and dtype_class(torch.int8) == "int8"
    assert dtype_class(torch.complex64) == "other"
    x = torch.zeros(4, 3)
    assert shape_of({"input_ids": x, "labels": x}) == (4, 3)
    assert shape_of((torch.tensor(1.0), [x])) == (4, 3)
    assert shape_of(()) is None


# --- the probe booted in a real training loop -----------------------------------------------
def _run(*args: str, env: dict[str, str] | None = None) -> JobResult:
    res = Job([str(SCRIPTS / "flops.py"), *args], env=env).result(timeout=120)
    assert res.returncode == 0 and "DONE=" in res.stdout, res.stderr[-3000:]
    return res


def _counts(res: JobResult) -> dict[int, FlopCount]:
    """Each counted step's count (a count may arrive twice: resent on a new connection)."""
    return {c.step: c for c in res.flops}


@pytest.fixture(scope="module")
def accumulating() -> JobResult:
    # 2 micro-batches of 16 per step; from step 8 on, of 24 (a new shape: counted again).
    return _run("--accumulate", "2", "--batch2", "24", "--switch-at", "8")


def test_probe_counts_a_step_after_warm_up(accumulating: JobResult) -> None:
    counts = _counts(accumulating)
    assert sorted(counts) == [3, 8], counts
    c = counts[3]
    assert c.micro_batches == 2 and c.samples == 32 and c.device == "cpu"
    assert within(c.flops, 2 * linear_flops(16)), (c.flops, 2 * linear_flops(16))
    assert c.by_dtype == {"fp32": c.flops}
    assert c.cost_s is not None and c.cost_s >= 0.0


def test_probe_recounts_on_a_new_batch_shape(accumulating: JobResult) -> None:
    c = _counts(accumulating)[8]
    assert c.micro_batches == 2 and c.samples == 48
    assert within(c.flops, 2 * linear_flops(24))


def test_probe_flags_only_the_counted_steps(accumulating: JobResult) -> None:
    flagged = [s.step for s in accumulating.steps if s.flops_counted]
    assert flagged == [3, 8]
    assert len(accumulating.steps) == 12


def test_probe_conv_under_autocast() -> None:
    res = _run("--model", "conv", "--batch", "4", "--autocast", "--steps", "6")
    (c,) = _counts(res).values()
    # CPU autocast runs convolutions in bf16, forward and backward.
    assert set(c.by_dtype) == {"bf16"}
    assert within(c.flops, conv_flops(4)), (c.flops, conv_flops(4))


def test_probe_flops_off() -> None:
    res = _run("--steps", "6", env={"AUDITOR_PROBE_FLOPS": "0"})
    assert res.flops == [] and not any(s.flops_counted for s in res.steps)
    assert len(res.steps) == 6
