"""The rank's memory budget, measured the way practitioners reason about it.

memory = the model's fixed part (parameters + their gradients + the optimizer's state, plus
buffers) + batch size x the activations one sample keeps for backward. This module measures each
term exactly, inside the training rank, from the tensors themselves:

* **Fixed part** (:func:`budget`): every tensor's *storage* is counted once (a key of device and
  ``untyped_storage().data_ptr()``), so tied or shared parameters and views count once, and what
  is counted is what is held (a view keeps its whole storage alive). Parameters by dtype, their
  ``.grad``, every tensor in every optimizer's ``state`` by its key (``exp_avg``, ``exp_avg_sq``,
  ``momentum_buffer``, ``step``, ...), and the modules' buffers. FSDP2 parameters and states are
  DTensors: their local shard (``to_local()``) is what this rank holds. Adam's ``step`` is a
  0-dim float32 tensor per parameter (4 bytes each): it is real memory and is counted, under its
  own kind ``step``, so "Adam keeps 2x the parameters" reads as ``exp_avg + exp_avg_sq`` and
  ``step`` stays apart. DataParallel: one process holds the fixed part on its first device and
  a replica of the parameters on each other device during the step (``per_device``); its
  replicas' forwards run on threads of their own, out of the saved-tensor hooks' reach, so a
  DataParallel model over several GPUs gets no activation sample (the rules then fall back to
  fitting memory against the batch).
* **Extra copies** (``other_module_bytes``): parameters and buffers of ``nn.Module`` instances
  that the model does not reach (an EMA or evaluation copy made with ``deepcopy``), found by one
  ``gc.get_objects()`` scan; storages the model or the optimizers hold are not counted again.
  The scan costs tens of milliseconds in a big process (44 ms over 170,000 objects in a torch
  process here), so it runs with a budget measurement only: the first, any whose fixed part
  changed, and otherwise at most once every ``scan_interval_s`` (5 minutes) of wall time,
  whatever the step rate: under 0.02% of the run.
* **Activations** (:meth:`MemoryMeter.forward_begin` / ``forward_end``): on a sampled forward
  the model's forward runs inside ``torch.autograd.graph.saved_tensors_hooks``;
  the pack hook records each saved tensor's storage (unique storages once) and returns the
  tensor unchanged. Parameters saved for backward (a weight, ``weight.t()``) are not activations:
  storages of the model's parameters, and leaves that require grad and their views, are left
  out. Divided by the batch size: activations per sample. Activation checkpointing installs its
  own hooks inside the forward; theirs take precedence for what they hold (tensors the
  checkpoint recomputes are not kept, so they are rightly not counted). What the loss computed
  outside the model's forward saves is not counted.

  Which forwards are sampled: the hooks cost a Python call per saved tensor (a sampled forward
  of a 12-layer transformer costs milliseconds: ``bench/memory_sampling.py``), and a model's
  activations per sample stay the same while its input's shape does. So the first forward is
  sampled, then every ``activations_every``-th (default 10); each sample within a twentieth
  of the one before doubles the interval, up to every ``ACTIVATIONS_EVERY_MAX``-th (640th)
  forward, and a sample that moved (a longer sequence, another model) brings it back to every
  ``activations_every``-th.

When: after an optimizer step, the first time and then every ``check_every`` steps (at most once
every ``check_interval_s``); a message goes out only when something changed (the fixed part,
the activations, a twentieth of the host's memory freed or taken).

This module runs inside training ranks: torch comes in as the module object the probe holds
(never imported here), no Ray, only the standard library besides.
"""

from __future__ import annotations

import gc
import os
import time
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from auditor.samples import MemoryBudget

# The forward's saved tensors are measured every 10th forward (a Python call per saved tensor),
# and less often, down to every 640th, while each sample holds within a twentieth of the last.
ACTIVATIONS_EVERY = 10
ACTIVATIONS_EVERY_MAX = 640
ACTIVATIONS_HOLD = 1 / 20
# The fixed part (a walk over parameters and state) and the host's memory (/proc/meminfo) are
# measured again every 50th optimizer step, but at most once every 10 s.
CHECK_EVERY = 50
CHECK_INTERVAL_S = 10.0
# The process is scanned for modules outside the model (gc.get_objects()) at most this often.
SCAN_INTERVAL_S = 300.0


def _local(t: Any) -> Any:
    """A DTensor's local shard (what this rank holds); any other tensor itself."""
    to_local = getattr(t, "to_local", None)
    if to_local is not None and callable(to_local):
        try:
            return to_local()
        except Exception:
            return t
    return t


def _storage_key(t: Any) -> tuple[str, int, int] | None:
    """(device, data pointer, bytes) of a tensor's storage; None for empty or meta tensors."""
    try:
        s = t.untyped_storage()
        ptr = int(s.data_ptr())
        if ptr == 0:
            return None
        return (str(t.device), ptr, int(s.nbytes()))
    except Exception:
        return None


class _Counter:
    """Bytes of unique storages, by label; a storage seen once is never counted again."""

    def __init__(self, seen: set[tuple[str, int]] | None = None) -> None:
        self.seen: set[tuple[str, int]] = seen if seen is not None else set()
        self.by: dict[str, int] = {}
        self.by_device: dict[str, int] = {}

    def add(self, t: Any, label: str) -> int:
        key = _storage_key(_local(t))
        if key is None:
            return 0
        dev, ptr, nbytes = key
        if (dev, ptr) in self.seen:
            return 0
        self.seen.add((dev, ptr))
        self.by[label] = self.by.get(label, 0) + nbytes
        self.by_device[dev] = self.by_device.get(dev, 0) + nbytes
        return nbytes

    @property
    def total(self) -> int:
        return sum(self.by.values())


def _dtype_name(t: Any) -> str:
    return str(getattr(t, "dtype", "")).replace("torch.", "")


def _params(model: Any) -> list[Any]:
    try:
        return list(model.parameters())
    except Exception:
        return []


def _buffers(model: Any) -> list[Any]:
    try:
        return list(model.buffers())
    except Exception:
        return []


def fixed_part(model: Any, optimizers: Iterable[Any]) -> dict[str, Any]:
    """Parameters (by dtype), gradients, optimizer state (by kind) and buffers, in bytes.

    Every storage counts once across all four (a parameter that is also an optimizer's state
    tensor is a parameter). Returns the ``MemoryBudget`` fields it measures.
    """
    seen: set[tuple[str, int]] = set()
    params = _Counter(seen)
    count = 0
    numel = 0
    sharded = False
    plist = _params(model)
    for p in plist:
        if hasattr(p, "to_local"):
            sharded = True
        local = _local(p)
        count += 1
        numel += int(local.numel())
        params.add(p, _dtype_name(local))
    grads = _Counter(seen)
    for p in plist:
        g = getattr(p, "grad", None)
        if g is not None:
            grads.add(g, "grad")
    state = _Counter(seen)
    names: list[str] = []
    for opt in optimizers:
        names.append(type(opt).__name__)
        for per_param in list(getattr(opt, "state", {}).values()):
            if not isinstance(per_param, dict):
                continue
            for kind, v in per_param.items():
                if hasattr(v, "untyped_storage"):
                    state.add(v, str(kind))
    bufs = _Counter(seen)
    for b in _buffers(model):
        bufs.add(b, "buffer")
    per_device: dict[str, int] = {}
    for c in (params, grads, state, bufs):
        for dev, n in c.by_device.items():
            per_device[dev] = per_device.get(dev, 0) + n
    replicas = _dataparallel_replicas(model)
    for dev in replicas:
        # DataParallel broadcasts the parameters to every other device for each step.
        per_device[dev] = per_device.get(dev, 0) + params.total
    return {
        "param_count": count,
        "param_numel": numel,
        "param_bytes": params.total,
        "param_bytes_by_dtype": dict(sorted(params.by.items())),
        "grad_bytes": grads.total,
        "optimizer_bytes": state.total,
        "optimizer_bytes_by_kind": dict(sorted(state.by.items())),
        "optimizer": "+".join(names),
        "buffer_bytes": bufs.total,
        "per_device": dict(sorted(per_device.items())),
        "sharded": sharded,
        "replicas": len(replicas),
        "_seen": seen,
    }


def _dataparallel_replicas(model: Any) -> list[str]:
    """The devices other than the first that a DataParallel model replicates onto."""
    if type(model).__name__ != "DataParallel":
        return []
    ids = list(getattr(model, "device_ids", None) or [])
    return [f"cuda:{int(i)}" for i in ids[1:]]


def other_module_bytes(torch: Any, model: Any, seen: set[tuple[str, int]]) -> int:
    """Bytes of parameters and buffers of modules the model does not reach (an EMA or eval
    copy), storages in ``seen`` (the model's and the optimizers') excluded."""
    module_cls = torch.nn.Module
    try:
        mine = {id(m) for m in model.modules()}
    except Exception:
        mine = set()
    counter = _Counter(set(seen))
    with warnings.catch_warnings():
        # Some objects warn when touched (deprecated script modules): not the script's doing.
        warnings.simplefilter("ignore")
        _scan(module_cls, mine, counter)
    return counter.total


def _scan(module_cls: Any, mine: set[int], counter: _Counter) -> None:
    for obj in gc.get_objects():
        try:
            # type(), not isinstance(): some module-like objects warn when asked their class.
            if not issubclass(type(obj), module_cls) or id(obj) in mine:
                continue
            # Only the module's own tensors: its children are objects of their own in the scan.
            for t in list(obj._parameters.values()) + list(obj._buffers.values()):
                if t is not None:
                    counter.add(t, "other")
        except Exception:
            continue


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                parts = rest.split()
                if parts and name in ("MemTotal", "MemAvailable"):
                    out[name] = int(parts[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


class MemoryMeter:
    """One per training process: measures the budget and samples the activations.

    The probe calls :meth:`forward_begin` / :meth:`forward_end` around the model's forward,
    :meth:`after_step` from the optimizer's step post-hook and :meth:`take` from its flusher.
    """

    def __init__(
        self,
        torch: Any,
        *,
        rank: Callable[[], int],
        device: Callable[[], str] = lambda: "cpu",
        activations_every: int = ACTIVATIONS_EVERY,
        check_every: int = CHECK_EVERY,
        check_interval_s: float = CHECK_INTERVAL_S,
        scan_interval_s: float = SCAN_INTERVAL_S,
        scan: bool = True,
    ) -> None:
        self.torch = torch
        self._rank = rank
        self._device = device
        self.activations_every = max(1, activations_every)
        self.check_every = max(1, check_every)
        self.check_interval_s = check_interval_s
        self.scan_interval_s = scan_interval_s
        self.scan = scan
        self.model: Any = None
        self._optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        # The optimizer seen last (weakly): the set is asked only when another one steps.
        self._last_optimizer: weakref.ref[Any] | None = None
        self._steps = 0  # optimizer steps seen
        self._forwards = 0  # top-level forwards of the model seen
        # The forward sampled next (the first is), and the interval after the last sample.
        self._next_sample = 1
        self._sampled_at = 0
        self._interval = self.activations_every
        self.samples = 0  # forwards whose activations were measured
        self._last_check = -1
        self._last_check_t = 0.0
        # The optimizer step at which the next check is due (the first step's at once), and the
        # activation sample compared last: a step between the two costs two comparisons.
        self._next_check = 0
        self._act_checked: tuple[int, int, int] | None = None
        self._host: dict[str, int] = {}
        self._act_queued: tuple[int | None, int | None] = (None, None)
        self._last_scan: float | None = None  # monotonic time of the last scan
        self._other = 0
        self._fixed: dict[str, Any] | None = None
        # The saved-tensor hooks of the forward being sampled, None between samples: the probe's
        # forward hook calls ``forward_end`` only while one is open.
        self.sampling: Any = None
        self._unsampled: bool | None = None
        self._saved: dict[tuple[str, int], int] = {}
        self._exclude: set[tuple[str, int]] = set()
        self._batch: int | None = None
        self._act: tuple[int, int, int] | None = None  # (bytes, batch, step)
        self._pending: MemoryBudget | None = None
        self._sent: tuple[Any, ...] | None = None
        self.latest: MemoryBudget | None = None

    # --- activations ---------------------------------------------------------------------------
    def forward_begin(self, model: Any, batch_size: int | None) -> None:
        """The model's forward starts; on a measured step, saved tensors are recorded.

        Forwards without autograd (evaluation under ``no_grad``) save nothing and are not
        counted; a compiled model is never sampled (``torch.compile`` and saved-tensor hooks do
        not mix: the hooks would cost a recompilation, or an error, in the script's model)."""
        try:
            if not self.torch.is_grad_enabled():
                return
        except Exception:
            return
        self._forwards += 1
        if self.sampling is not None or self._forwards < self._next_sample:
            return
        # The next one at this interval; a sample that holds stretches it (forward_end).
        self._sampled_at = self._forwards
        self._next_sample = self._forwards + self._interval
        if self._unsampled is None or model is not self.model:
            # DataParallel runs each replica's forward on a thread of its own, where hooks
            # entered on this thread do not reach: not sampled rather than undercounted.
            self._unsampled = _compiled(model) or len(_dataparallel_replicas(model)) > 0
        if self._unsampled:
            return
        try:
            self.model = model
            self._saved = {}
            self._exclude = set()
            for p in _params(model):
                key = _storage_key(_local(p))
                if key is not None:
                    self._exclude.add(key[:2])
            self._batch = batch_size
            hooks = self.torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
            hooks.__enter__()
            self.sampling = hooks
        except Exception:
            self.sampling = None

    def forward_end(self) -> None:
        hooks, self.sampling = self.sampling, None
        if hooks is None:
            return
        try:
            hooks.__exit__(None, None, None)
        except Exception:
            return
        total = sum(self._saved.values())
        self._saved = {}
        if self._batch and total:
            self._schedule(total / self._batch)
            self._act = (total, int(self._batch), self._steps)

    def _schedule(self, per_sample: float) -> None:
        """A sample of ``per_sample`` activation bytes was taken: the next one comes at twice
        the interval if it held within a twentieth of the last one, else at the base interval."""
        self.samples += 1
        before = self._act[0] / self._act[1] if self._act is not None else None
        if before is not None and abs(per_sample - before) <= ACTIVATIONS_HOLD * before:
            self._interval = min(
                2 * self._interval, max(ACTIVATIONS_EVERY_MAX, self.activations_every)
            )
        else:
            self._interval = self.activations_every
        self._next_sample = self._sampled_at + self._interval

    def _pack(self, t: Any) -> Any:
        try:
            if t.is_leaf and t.requires_grad:
                return t  # a parameter (or an input the script wants gradients for)
            base = t._base
            if base is not None and base.is_leaf and base.requires_grad:
                return t  # a view of one (weight.t())
            key = _storage_key(t)
            if key is not None and key[:2] not in self._exclude:
                self._saved[key[:2]] = key[2]
        except Exception:
            pass
        return t

    # --- the fixed part ------------------------------------------------------------------------
    def after_step(self, model: Any, optimizer: Any) -> None:
        """An optimizer step ended: measure the fixed part the first time, then every
        ``check_every`` steps but at most once every ``check_interval_s``; queue a budget
        message when anything changed (a new activation sample is compared first, cheaply)."""
        self._steps += 1
        last = self._last_optimizer
        if optimizer is not None and (last is None or last() is not optimizer):
            if optimizer not in self._optimizers:
                self._optimizers.add(optimizer)
            self._last_optimizer = weakref.ref(optimizer)
        if model is not None:
            self.model = model
        elif self.model is None:
            return
        if self._steps >= self._next_check:
            self._next_check = self._steps + self.check_every
            if self._last_check < 0 or (
                time.monotonic() - self._last_check_t >= self.check_interval_s
            ):
                self.measure()
                return
        act = self._act
        if act is not self._act_checked:
            self._act_checked = act
            if act is not None and act[:2] != self._act_queued:
                self._queue()

    def measure(self) -> MemoryBudget | None:
        """Measure the fixed part and the host's memory now (and scan for extra copies when
        that is due)."""
        if self.model is None:
            return None
        try:
            fixed = fixed_part(self.model, list(self._optimizers))
        except Exception:
            return None
        seen = fixed.pop("_seen")
        changed = self._fixed is None or _signature(fixed) != _signature(self._fixed)
        self._fixed = fixed
        self._last_check = self._steps
        now = self._last_check_t = time.monotonic()
        if self.scan and (
            changed or self._last_scan is None or now - self._last_scan >= self.scan_interval_s
        ):
            self._last_scan = now
            try:
                self._other = other_module_bytes(self.torch, self.model, seen)
            except Exception:
                self._other = 0
        self._host = _meminfo()
        return self._queue()

    def _queue(self) -> MemoryBudget | None:
        """Build the budget; mark it to send when it differs from the last one sent."""
        if self._fixed is None:
            return None
        act_bytes, act_batch, act_step = self._act if self._act else (None, None, None)
        self._act_queued = (act_bytes, act_batch)
        total = self._host.get("MemTotal")
        avail = self._host.get("MemAvailable")
        device_total, outside, peak = self._device_memory()
        # What a new message is sent for: not the time, nor small moves of free memory.
        key = (
            _signature(self._fixed),
            self._other,
            act_bytes,
            act_batch,
            device_total,
            _coarse(outside, device_total),
            _coarse(peak, device_total),
            _coarse(avail, total),
        )
        budget = MemoryBudget(
            rank=self._rank(),
            time=time.time(),
            step=self._steps,
            device=self._device(),
            **self._fixed,
            other_module_bytes=self._other,
            activation_bytes=act_bytes,
            activation_batch=act_batch,
            activation_step=act_step,
            activations_every=self.activations_every,
            device_total_bytes=device_total,
            device_outside_bytes=outside,
            device_peak_bytes=peak,
            host_total_bytes=total,
            host_available_bytes=avail,
            local_ranks=_local_ranks(),
        )
        self.latest = budget
        if key != self._sent:
            self._sent = key
            self._pending = budget
        return budget

    def _device_memory(self) -> tuple[int | None, int | None, int | None]:
        """The GPU's total, what it holds outside this process's caching allocator, and the
        allocator's peak reserved bytes (None on CPU, or where torch cannot say). The peak is
        never reset: that would change what the script itself reads."""
        dev = self._device()
        if not dev.startswith("cuda"):
            return None, None, None
        try:
            c = self.torch.cuda
            index = int(dev.split(":", 1)[1]) if ":" in dev else c.current_device()
            total = int(c.get_device_properties(index).total_memory)
        except Exception:
            return None, None, None
        outside = peak = None
        try:
            free, whole = c.mem_get_info(index)
            outside = max(0, int(whole) - int(free) - int(c.memory_reserved(index)))
        except Exception:
            pass
        try:
            peak = int(c.max_memory_reserved(index)) or None
        except Exception:
            pass
        return total, outside, peak

    def take(self) -> MemoryBudget | None:
        """The budget to send, if it changed since the last one (the flusher's call)."""
        out, self._pending = self._pending, None
        return out

    def resend(self) -> None:
        """A new connection: the agent gets the latest budget again."""
        if self.latest is not None:
            self._pending = self.latest


def _coarse(n: int | None, whole: int | None) -> int | None:
    """``n`` in twentieths of ``whole``: what a budget is resent for (not every small move)."""
    return round(20 * n / whole) if n is not None and whole else None


def _signature(fixed: dict[str, Any]) -> tuple[Any, ...]:
    return (
        fixed["param_count"],
        fixed["param_bytes"],
        fixed["grad_bytes"],
        fixed["optimizer_bytes"],
        fixed["buffer_bytes"],
    )


def _compiled(model: Any) -> bool:
    """The model or one of its modules went through ``torch.compile``."""
    try:
        return any(
            hasattr(m, "_orig_mod") or getattr(m, "_compiled_call_impl", None) is not None
            for m in model.modules()
        )
    except Exception:
        return True  # unsure: leave it alone


def _unpack(t: Any) -> Any:
    return t


def _local_ranks() -> int:
    """Ranks on this host (torchrun's ``LOCAL_WORLD_SIZE``): they share its memory."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1
