"""FLOPs per step, counted from the operations that ran, on one sampled step.

After warm-up (the rank's ``at_step``-th optimizer step, the 4th by default) one whole optimizer
step runs under a ``TorchDispatchMode`` that reads every operation torch dispatches and counts
the FLOPs of those in ``torch.utils.flop_counter``'s registry (matrix multiplies, convolutions
and their backward, the attention kernels: the formulas ``FlopCounterMode`` uses), each by the
dtype it ran in. Never an estimate from a parameter count: what ran is what is counted, so a
frozen layer's missing weight gradient, a convolution's real output size, the attention
kernel's sequence length and any activation checkpointing's recompute are all in it.

The window. The mode is entered where the model's forward begins (the first forward of the
step) and left at the optimizer's step post-hook: every micro-batch's forward, the loss, every
backward (gradient accumulation) and the optimizer step itself are inside it (an optimizer's
element-wise updates are in no formula: they count nothing). A framework that runs forward and
backward inside ``optimizer.step(closure)`` (Lightning) is covered alike: its forward opens the
window inside the step, whose post-hook closes it.

Backward. Autograd runs backward on the calling thread for CPU tensors and on a device thread
per GPU for CUDA tensors; a dispatch mode lives in thread-local state, and the autograd engine
carries the caller's thread-local state (``at::ThreadLocalState``, which holds the dispatch
mode stack) onto the thread that runs each backward node (``ThreadLocalStateGuard`` in the
engine's ``evaluate_function``), so backward's kernels are counted on either thread. Tested on
CPU here: backward's matmuls and convolution gradients are in the count.

Dtypes (``FlopCount.by_dtype``): the dtype of the operation's first tensor argument, after
autocast cast it (the mode sits below autocast in the dispatcher): "bf16", "fp16", "fp32",
"fp64", "fp8", "int8", "other"; an fp32 matmul on CUDA while TF32 is allowed for matmuls
(``torch.get_float32_matmul_precision() != "highest"``), or an fp32 convolution while cuDNN
may use TF32 (``torch.backends.cudnn.allow_tf32``), is "tf32". On CPU fp32 stays "fp32".

When. Once after warm-up, and again when the model's input shape changes (a new batch size or
sequence length at the model's forward): a shape counted before is not counted again, its count
is sent again with the time of the switch, so the latest count is always the running shape's.
At most ``max_counts`` counts (8) and ``max_switches`` shape switches (64) per rank: a job whose
shapes change every step (dynamic padding) keeps the counts it has. Skipped (no count): a
compiled model (``torch.compile`` and a Python dispatch mode do not mix), DataParallel over
several GPUs (its replicas' forwards run on threads of their own, outside the mode), a forward
without autograd or inside named outside work (an evaluation).

Cost. Every operation of the counted step pays a Python call (microseconds each); the counted
step is flagged (``StepSample.flops_counted``) so no rule judges it, and its cost is reported:
``FlopCount.cost_s``, its step time less the faster of its neighbours'. Every other step pays
an attribute test and a shape comparison at the model's forward, nothing else.

This module runs inside training ranks: torch comes in as the module object the probe holds
(its ``torch.utils.flop_counter`` is imported only when a count starts), only the standard
library besides.
"""

from __future__ import annotations

import importlib
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from auditor.samples import FlopCount, StepSample

# The optimizer step (0-based) whose FLOPs are counted first: after the loader's workers, the
# allocator and the probe's model discovery (its first 3 steps) have settled.
COUNT_AT_STEP = 3
# Counts per rank at most (a new input shape each), and shape switches followed at most.
MAX_COUNTS = 8
MAX_SWITCHES = 64
# A count not closed by an optimizer step within this many forwards is dropped (a script that
# never steps an optimizer, or an evaluation loop mistaken for training).
MAX_FORWARDS = 256

_UNSEEN = object()  # a shape no forward has: the first forward is a new shape

# Operations the counter never looks at (metadata queries), as FlopCounterMode skips them.
_SKIP = (
    "sym_is_contiguous.default",
    "is_contiguous.default",
    "is_contiguous.memory_format",
    "is_strides_like_format.default",
    "is_non_overlapping_and_dense.default",
    "size.default",
    "sym_size.default",
    "stride.default",
    "sym_stride.default",
    "storage_offset.default",
    "sym_storage_offset.default",
    "numel.default",
    "sym_numel.default",
    "dim.default",
)

_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "float64": "fp64",
    "int8": "int8",
    "uint8": "int8",
}


def dtype_class(dtype: Any) -> str:
    """The ``FlopCount.by_dtype`` key of a torch dtype (TF32 apart)."""
    name = str(dtype).replace("torch.", "")
    if name.startswith("float8"):
        return "fp8"
    return _DTYPES.get(name, "other")


def shape_of(batch: Any, _depth: int = 0) -> Any:
    """The shape of a batch's first tensor with a dimension (tuples, lists, dicts), as
    :func:`~auditor.probe.batches.batch_size_of` finds its batch size; None: no tensor."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return shape if len(shape) else None
    if _depth > 3:
        return None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            # A tensor item read here (the common ``model(x)``): one call a forward, not two.
            s = getattr(item, "shape", None)
            s = (s if len(s) else None) if s is not None else shape_of(item, _depth + 1)
            if s is not None:
                return s
    elif isinstance(batch, dict):
        for item in batch.values():
            s = shape_of(item, _depth + 1)
            if s is not None:
                return s
    return None


def flop_kind(dtype: Any, device: str, conv: bool, tf32_mm: bool, tf32_conv: bool) -> str:
    """The ``FlopCount.by_dtype`` key of one operation: its dtype's class, and "tf32" for an
    fp32 matmul (``tf32_mm``) or convolution (``tf32_conv``) on CUDA while TF32 is allowed."""
    kind = dtype_class(dtype)
    if kind == "fp32" and device == "cuda" and (tf32_conv if conv else tf32_mm):
        return "tf32"
    return kind


def _first_tensor(torch: Any, args: Any) -> Any:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    return b
    return None


def _tf32_allowed(torch: Any) -> tuple[bool, bool]:
    """Whether fp32 matmuls and fp32 convolutions may run as TF32 on CUDA now."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the older flags warn in newer torch
        try:
            mm = torch.get_float32_matmul_precision() != "highest"
        except Exception:
            mm = False
        try:
            conv = bool(torch.backends.cudnn.allow_tf32)
        except Exception:
            conv = False
    return mm, conv


def make_counting_mode(torch: Any) -> Any:
    """A ``TorchDispatchMode`` class that counts the registry's FLOPs by dtype and device."""
    dispatch = importlib.import_module("torch.utils._python_dispatch")
    counter = importlib.import_module("torch.utils.flop_counter")
    registry = counter.flop_registry
    aten = torch.ops.aten
    skip = set()
    for name in _SKIP:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            skip.add(op)
    if hasattr(torch.ops, "prim"):
        layout = getattr(getattr(torch.ops.prim, "layout", None), "default", None)
        if layout is not None:
            skip.add(layout)
    prim = getattr(torch.ops, "prim", None)
    prim_device = getattr(getattr(prim, "device", None), "default", None)
    hop_cls = getattr(getattr(torch, "_ops", None), "HigherOrderOperator", ())
    tensor_cls = torch.Tensor

    class CountingMode(dispatch.TorchDispatchMode):  # type: ignore[name-defined]
        supports_higher_order_operators = True

        def __init__(self, tf32_mm: bool, tf32_conv: bool) -> None:
            super().__init__()
            self.on = True
            self.tf32_mm = tf32_mm
            self.tf32_conv = tf32_conv
            # (dtype class, device type) -> FLOPs
            self.counts: dict[tuple[str, str], float] = {}
            self.threads: set[int] = set()

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            if not self.on:
                return func(*args, **kwargs)
            if func in skip:
                return NotImplemented
            if hop_cls and isinstance(func, hop_cls):
                out = func(*args, **kwargs)
                if func in registry:
                    self._count(func, registry[func], out, args, kwargs)
                return out
            packet = func._overloadpacket
            formula = registry.get(packet)
            if formula is None and func is not prim_device:
                # A composite operation reaching the mode: count what it decomposes into.
                with self:
                    r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
            out = func(*args, **kwargs)
            if formula is not None:
                self._count(packet, formula, out, args, kwargs)
            return out

        def _count(self, packet: Any, formula: Any, out: Any, args: Any, kwargs: Any) -> None:
            try:
                flops = float(formula(*args, **kwargs, out_val=out))
                t = _first_tensor(torch, args)
                if t is None or not isinstance(t, tensor_cls):
                    key = ("other", "cpu")
                else:
                    dev = t.device.type
                    conv = "conv" in str(getattr(packet, "__name__", packet))
                    key = (flop_kind(t.dtype, dev, conv, self.tf32_mm, self.tf32_conv), dev)
                self.counts[key] = self.counts.get(key, 0.0) + flops
                self.threads.add(threading.get_ident())
            except Exception:
                pass  # a formula that cannot read this call: the operation is not counted

    return CountingMode


class _Awaiting:
    """A count and the step it was made on, until the step's and its neighbours' times are in
    (set on the training thread, completed on the flusher's)."""

    __slots__ = ("after", "before", "count", "dropped", "step_s", "target")

    def __init__(self, target: int) -> None:
        self.target = target
        self.count: FlopCount | None = None
        self.dropped = False
        self.step_s: float | None = None
        self.before: float | None = None
        self.after: float | None = None


class FlopMeter:
    """One per training process: counts one step's FLOPs after warm-up and on new shapes.

    The probe calls :meth:`forward_begin` where the model's forward begins (outside backward),
    :meth:`step_end` from the optimizer's step post-hook while :attr:`counting`, and
    :meth:`resolved` / :meth:`take` from its flusher.
    """

    def __init__(
        self,
        torch: Any,
        *,
        rank: Callable[[], int],
        step: Callable[[], int],
        outside: Callable[[], bool] = lambda: False,
        device: Callable[[], str] = lambda: "cpu",
        at_step: int = COUNT_AT_STEP,
        max_counts: int = MAX_COUNTS,
        max_switches: int = MAX_SWITCHES,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.torch = torch
        self._rank = rank
        self._step = step
        self._outside = outside
        self._device = device
        self.at_step = max(0, at_step)
        self._left = max_counts
        self._switches = max_switches
        self._wall = wall
        self.counting = False  # a count is open (the hot path reads this)
        self._shape: Any = _UNSEEN  # the shape of the count sent last
        self._mode_cls: Any = None
        self._mode: Any = None
        self._tid = 0
        self._counts: dict[Any, FlopCount] = {}  # by input shape
        self._open_shape: Any = None
        self._open: _Awaiting | None = None  # the count being made
        # Counts made (or being made) whose cost the resolved steps have not given yet.
        self._awaiting: list[_Awaiting] = []
        self._lock = threading.Lock()
        self._forwards = 0
        self._samples: int | None = 0
        self._last: StepSample | None = None  # the last step resolved
        self._pending: list[FlopCount] = []
        self.latest: FlopCount | None = None
        self.skipped: str | None = None  # why this rank is never counted

    # --- on the training thread ------------------------------------------------------------
    def forward_begin(self, model: Any, shape: Any) -> None:
        """The model's forward starts (not a recompute inside backward): another micro-batch of
        the counted step, or the start of a count (after warm-up, or on a new input shape)."""
        if self.counting:
            self._forwards += 1
            if shape is not None and self._samples is not None:
                self._samples += int(shape[0])
            else:
                self._samples = None
            if self._forwards > MAX_FORWARDS:
                self._close(keep=False)
            return
        if shape == self._shape or self._left <= 0 or self._switches <= 0:
            return
        self._new_shape(model, shape)

    def _new_shape(self, model: Any, shape: Any) -> None:
        try:
            if self._step() < self.at_step or not self.torch.is_grad_enabled() or self._outside():
                return
        except Exception:
            return
        key = tuple(shape) if shape is not None else None
        known = self._counts.get(key)
        if self._shape is not _UNSEEN:
            self._switches -= 1
        if known is not None:
            # Counted before: the same count again, now (the latest is the running shape's).
            self._shape = shape
            again = replace(known, time=self._wall())
            self._counts[key] = again
            self.latest = again
            with self._lock:
                self._pending.append(again)
            return
        if self.skipped is None:
            self.skipped = _unsupported(model)
        if self.skipped is not None:
            self._left = 0
            return
        try:
            if self._mode_cls is None:
                self._mode_cls = make_counting_mode(self.torch)
            on_cuda = self._device().startswith("cuda")
            mm, conv = _tf32_allowed(self.torch) if on_cuda else (False, False)
            mode = self._mode_cls(mm, conv)
            mode.__enter__()
        except Exception:
            self.skipped = "error"
            self._left = 0
            return
        self._mode = mode
        self._tid = threading.get_ident()
        self.counting = True
        self._open_shape = key
        self._shape = shape
        self._open = _Awaiting(self._step())
        with self._lock:
            self._awaiting.append(self._open)
        self._forwards = 1
        self._samples = int(shape[0]) if shape is not None else None

    def step_end(self) -> None:
        """The optimizer step ended: the counted step's operations are all in."""
        if self.counting:
            self._close(keep=True)

    def _close(self, keep: bool) -> None:
        mode, self._mode = self._mode, None
        opened, self._open = self._open, None
        self.counting = False
        self._left -= 1
        if mode is None or opened is None:
            return
        mode.on = False  # from here on it only passes operations through
        if not self._leave(mode):
            keep = False
        if not keep:
            # The step still paid for the counting: it stays flagged, no count is sent.
            opened.dropped = True
            return
        by: dict[str, float] = {}
        per_device: dict[str, float] = {}
        for (kind, dev), n in mode.counts.items():
            by[kind] = by.get(kind, 0.0) + n
            per_device[dev] = per_device.get(dev, 0.0) + n
        device = max(per_device, key=lambda d: per_device[d]) if per_device else ""
        if device not in ("cuda", "cpu"):
            device = "cuda" if self._device().startswith("cuda") else "cpu"
        count = FlopCount(
            rank=self._rank(),
            time=self._wall(),
            step=opened.target,
            flops=sum(by.values()),
            by_dtype=dict(sorted(by.items())),
            micro_batches=self._forwards,
            samples=self._samples,
            device=device,
            cost_s=None,
        )
        self._counts[self._open_shape] = count
        opened.count = count

    def _leave(self, mode: Any) -> bool:
        """Pop the mode off this thread's dispatch stack; False where it is not on top here (a
        script's own mode entered inside the step and still open): it then stays, passing
        operations through, and the count is dropped."""
        if threading.get_ident() != self._tid:
            return False
        try:
            dispatch = importlib.import_module("torch.utils._python_dispatch")
            if dispatch._get_current_dispatch_mode() is not mode:
                return False
            mode.__exit__(None, None, None)
            return True
        except Exception:
            return False

    def abandon(self) -> None:
        """The process ends with a count open (no optimizer step closed it): drop it."""
        if self.counting:
            self._close(keep=False)

    # --- on the flusher's thread -------------------------------------------------------------
    def resolved(self, steps: list[StepSample], *, final: bool = False) -> list[StepSample]:
        """The resolved steps, the counted one flagged; completes the count's cost from its
        neighbours' step times. ``final``: the rank ends, no step comes after."""
        if not self._awaiting:
            if steps:
                self._last = steps[-1]
            return steps
        with self._lock:
            awaiting = list(self._awaiting)
        for a in awaiting:
            t = a.target
            for i, s in enumerate(steps):
                if s.step == t - 1:
                    a.before = s.step_s
                elif s.step == t:
                    if i == 0 and self._last is not None and self._last.step == t - 1:
                        a.before = self._last.step_s
                    steps[i] = replace(s, flops_counted=True)
                    a.step_s = s.step_s
                elif s.step == t + 1:
                    a.after = s.step_s
        if steps:
            self._last = steps[-1]
        finished = []
        for a in awaiting:
            if a.dropped and (a.step_s is not None or final):
                finished.append(a)
                continue
            done = a.count
            if done is None or (a.after is None and not final):
                continue
            # Its neighbours may be counted steps too: the faster one is the baseline.
            known = [x for x in (a.before, a.after) if x is not None]
            cost = None
            if a.step_s is not None and known:
                cost = max(0.0, a.step_s - min(known))
            count = replace(done, cost_s=cost)
            self._counts = {k: (count if v is done else v) for k, v in self._counts.items()}
            if self.latest is None or count.time >= self.latest.time:
                self.latest = count
            with self._lock:
                self._pending.append(count)
            finished.append(a)
        if finished:
            with self._lock:
                self._awaiting = [a for a in self._awaiting if a not in finished]
        return steps

    def take(self) -> list[FlopCount]:
        """The counts to send (the flusher's call)."""
        if not self._pending:
            return []
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def resend(self) -> None:
        """A new connection: the agent gets the latest count again."""
        with self._lock:
            if self.latest is not None and self.latest not in self._pending:
                self._pending.append(self.latest)


def _unsupported(model: Any) -> str | None:
    """Why this model's steps cannot be counted here (None: they can)."""
    try:
        for m in model.modules():
            if hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None:
                return "compiled"
    except Exception:
        return None
    if type(model).__name__ == "DataParallel" and len(getattr(model, "device_ids", None) or ()) > 1:
        return "dataparallel"
    return None
