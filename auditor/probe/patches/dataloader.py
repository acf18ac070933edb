"""DataLoader patch: the data wait, the batch size, and which loader trains.

``_BaseDataLoaderIter.__next__`` (every loader, single- or multi-process) for the data wait and
the batch size; ``DataLoader.__iter__`` to read the loader's settings and its worker PIDs once per
epoch. The rank reports the training loader's: the first loader with a backward or an optimizer
step between two of its batches (an evaluation loop has none, and its loader often has other
workers: Lightning's ``val_dataloader``, the Trainer's periodic evaluation). Until one has
trained, the loader iterated last.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from time import thread_time
from typing import TYPE_CHECKING, Any

from auditor.samples import LoaderConfig

if TYPE_CHECKING:
    from ..hooks import Probe


def batch_size_of(batch: Any, _depth: int = 0) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor (tuples, lists, dicts)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if _depth > 3:
        return None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_size_of(item, _depth + 1)
            if n is not None:
                return n
    elif isinstance(batch, dict):
        for item in batch.values():
            n = batch_size_of(item, _depth + 1)
            if n is not None:
                return n
    return None


def hook_dataloader(probe: Probe, torch: Any) -> None:
    dl = importlib.import_module("torch.utils.data.dataloader")
    base_iter = dl._BaseDataLoaderIter
    orig_next = base_iter.__next__
    orig_iter = dl.DataLoader.__iter__
    clock = probe.clock

    @functools.wraps(orig_next)
    def __next__(self: Any) -> Any:
        if not probe.enabled or not (probe.active or probe.activate()):
            return orig_next(self)
        if clock.in_phase is None:
            probe._fwd_depth = 0  # a batch between steps: no module call is open
        began = clock.data_begin()
        cpu = thread_time()
        batch = None
        try:
            batch = orig_next(self)
        finally:
            # Also when the loader raises (StopIteration at the end of an epoch, a worker's
            # error): the data phase ends here, or the collectives after it (a metric sync
            # between epochs) would read as part of the loader and go untimed.
            # The main thread's CPU while it waited: the loading's cost with num_workers=0
            # (I/O waits cost none), about zero with workers.
            cpu = thread_time() - cpu
            clock.data_end(began, batch_size_of(batch), cpu)
        probe.open_h2d()
        seen = getattr(self, "_auditor_loader", None)
        if seen is not None:
            _loader_batch(probe, seen)
        return batch

    @functools.wraps(orig_iter)
    def __iter__(self: Any) -> Any:
        it = orig_iter(self)
        if probe.enabled:
            try:
                workers = getattr(it, "_workers", None) or ()
                seen = _SeenLoader(
                    weakref.ref(self),
                    _loader_config(self),
                    tuple(int(w.pid) for w in workers if w.pid),
                )
                # A persistent loader hands out the same iterator each epoch: this epoch's.
                it._auditor_loader = seen
                train = probe.train_loader() if probe.train_loader is not None else None
                if train is None or train is self:
                    probe.loader, probe.worker_pids = seen.config, seen.worker_pids
            except Exception:
                pass
        return it

    base_iter.__next__ = __next__
    dl.DataLoader.__iter__ = __iter__


class _SeenLoader:
    """One epoch of a DataLoader: its settings, its workers and where its last batch was."""

    __slots__ = ("config", "loader", "updates", "worker_pids")

    def __init__(
        self, loader: weakref.ref[Any], config: LoaderConfig, worker_pids: tuple[int, ...]
    ) -> None:
        self.loader = loader
        self.config = config
        self.worker_pids = worker_pids
        self.updates: int | None = None  # the clock's backward/optimizer count at its last batch


# Steps the training loader may go without a batch before another loader that trains takes its
# place (a job that moves on to a new loader); two loaders feeding every step keep the first.
_TRAIN_LOADER_IDLE_STEPS = 2


def _loader_batch(probe: Probe, seen: _SeenLoader) -> None:
    """A batch from ``seen``'s loader: it trains when a backward or an optimizer step came
    between its previous batch and this one. The rank then reports its settings and workers."""
    clock = probe.clock
    before, seen.updates = seen.updates, clock.updates
    train = probe.train_loader() if probe.train_loader is not None else None
    loader = seen.loader()
    if loader is None:
        return
    if train is loader:
        probe.train_loader_step = clock.steps
        if probe.loader is not seen.config:  # a new epoch's workers
            probe.loader, probe.worker_pids = seen.config, seen.worker_pids
        return
    if before is None or before == clock.updates:
        return  # no training between its batches: an evaluation loop, or its first batch
    if train is not None and clock.steps - probe.train_loader_step <= _TRAIN_LOADER_IDLE_STEPS:
        return
    probe.train_loader = seen.loader
    probe.train_loader_step = clock.steps
    probe.loader, probe.worker_pids = seen.config, seen.worker_pids


def _loader_config(loader: Any) -> LoaderConfig:
    sampler = getattr(loader, "sampler", None)
    prefetch = getattr(loader, "prefetch_factor", None)
    return LoaderConfig(
        num_workers=int(loader.num_workers),
        pin_memory=bool(loader.pin_memory),
        prefetch_factor=int(prefetch) if prefetch is not None else None,
        persistent_workers=bool(loader.persistent_workers),
        batch_size=loader.batch_size,
        drop_last=bool(loader.drop_last),
        sampler=type(sampler).__name__ if sampler is not None else "",
        dataset=type(loader.dataset).__name__,
    )
