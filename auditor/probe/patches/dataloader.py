"""DataLoader patch: the data wait, the batch size, and which loader trains.

``_BaseDataLoaderIter.__next__`` (every loader, single- or multi-process) for the data wait and
the batch size; ``DataLoader.__iter__`` to read the loader's settings and its worker PIDs once per
epoch, and, where a new iterator starts the training loader's workers (every epoch without
``persistent_workers``), to time the start: its creation as named work (``loader_start``), and
with its first batch's wait and the old workers' shutdown (in the epoch's last ``__next__``) on
the step (``StepSample.loader_start_s``). The rank reports the
training loader's: the first loader with a backward or an optimizer step between two of its
batches (an evaluation loop has none, and its loader often has other workers: Lightning's
``val_dataloader``, the Trainer's periodic evaluation). Until one has trained, the loader
iterated last.

``DataLoader.__init__`` only where ``auditor run --apply`` planned loader levers for some rank
(:mod:`auditor.probe.apply`): a loader built on a named rank that matches the report's training
loader is built again with the levers set, through DataLoader's own ``__init__`` (so its own
checks hold); the rank reports what it moved and what it kept. Iterating a loader costs nothing
more.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import weakref
from dataclasses import asdict
from time import perf_counter, thread_time
from typing import TYPE_CHECKING, Any

from auditor.samples import LoaderConfig

from ..apply import REFUSED, RankPlan, changes, read_plan
from ..batches import batch_size_of
from ..clock import LOADER_START

if TYPE_CHECKING:
    from ..probe import Probe


def hook_dataloader(probe: Probe, torch: Any) -> None:
    dl = importlib.import_module("torch.utils.data.dataloader")
    base_iter = dl._BaseDataLoaderIter
    orig_next = base_iter.__next__
    orig_iter = dl.DataLoader.__iter__
    clock = probe.clock
    phases = clock.open_phases

    @functools.wraps(orig_next)
    def __next__(self: Any) -> Any:
        if not probe.active and not (probe.enabled and probe.activate()):
            return orig_next(self)
        if not phases:
            probe._fwd_depth = 0  # a batch between steps: no module call is open
        began = clock.data_begin()
        # The main thread's CPU while it waited: the loading's cost with num_workers=0 (I/O
        # waits cost none), about zero with workers. A read is a system call: on the steps the
        # clock says (``StepClock.cpu_due``), not on every batch of a fast loader.
        read_cpu = clock.cpu_due
        cpu = thread_time() if read_cpu else 0.0
        batch = None
        try:
            batch = orig_next(self)
        except StopIteration:
            # The epoch's end: a loader that does not keep its workers shuts them down in this
            # call, a cost of starting them anew at the next epoch.
            if _stops_workers(self, probe):
                clock.loader_stopping()
            raise
        finally:
            # Also when the loader raises (StopIteration at the end of an epoch, a worker's
            # error): the data phase ends here, or the collectives after it (a metric sync
            # between epochs) would read as part of the loader and go untimed.
            clock.data_end(began, batch_size_of(batch), thread_time() - cpu if read_cpu else None)
        probe.h2d_wait -= 1
        if probe.h2d_wait <= 0:
            probe.open_h2d()
        seen = getattr(self, "_auditor_loader", None)
        if seen is not None:
            if seen.loader is probe.train_loader and seen.config is probe.loader:
                # The training loader's batch, known without a call (CPython keeps one weak
                # reference without a callback per object: every epoch's is the same).
                seen.updates = clock.updates
                probe.train_loader_step = clock.steps
            else:
                _loader_batch(probe, seen)
        return batch

    @functools.wraps(orig_iter)
    def __iter__(self: Any) -> Any:
        # A new iterator with workers starts them (persistent ones only at the first epoch):
        # once training runs, its creation is booked as named work, ``loader_start`` (loading,
        # not the rank's own work), and the start as a whole on the step (clock.loader_started).
        try:
            starting = clock.running and _starts_workers(self) and _trains(probe, self)
        except Exception:
            starting = False
        if starting:
            began = perf_counter()
            clock.outside_begin(LOADER_START)
            try:
                it = orig_iter(self)
            finally:
                clock.outside_end()
            clock.loader_started(perf_counter() - began)
        else:
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
    try:
        _hook_apply(probe, dl)
    except Exception as exc:  # the data wait is still timed; the loaders stay as the script says
        if os.environ.get("AUDITOR_DEBUG"):
            print(f"auditor probe: --apply not installed: {exc!r}", file=sys.stderr)


def _starts_workers(loader: Any) -> bool:
    """Iterating ``loader`` now starts worker processes: it has workers, and does not keep them
    or has none kept yet (DataLoader keeps a persistent loader's iterator in ``_iterator``)."""
    try:
        if not loader.num_workers:
            return False
        return not loader.persistent_workers or getattr(loader, "_iterator", None) is None
    except AttributeError:
        return False


def _stops_workers(it: Any, probe: Probe) -> bool:
    """The exhausted iterator ``it`` of the training loader shut its workers down."""
    try:
        if not getattr(it, "_workers", None) or getattr(it, "_persistent_workers", True):
            return False
        seen = getattr(it, "_auditor_loader", None)
        loader = seen.loader() if seen is not None else None
        return loader is not None and _trains(probe, loader)
    except Exception:
        return False


def _trains(probe: Probe, loader: Any) -> bool:
    """``loader`` is the training loader (or none is known yet), outside an evaluation."""
    if not probe.active or probe.clock.evaluating:
        return False
    train = probe.train_loader() if probe.train_loader is not None else None
    return train is None or train is loader


def _hook_apply(probe: Probe, dl: Any) -> None:
    """``auditor run --apply``: DataLoader.__init__ sets the planned levers on the named ranks'
    training loaders (module doc). Not patched at all without a plan."""
    plan = read_plan(os.environ)
    if not plan:
        return
    orig_init = dl.DataLoader.__init__
    signature = inspect.signature(orig_init)

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)  # as the script said: its errors are its own
        if not probe.enabled:
            return
        mine = plan.get(probe.rank())
        if mine is not None:
            try:
                _apply(probe, mine, orig_init, signature, self, args, kwargs)
            except Exception:
                pass  # never break the job: the loader stays as built

    dl.DataLoader.__init__ = __init__


def _apply(
    probe: Probe,
    plan: RankPlan,
    orig_init: Any,
    signature: inspect.Signature,
    loader: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Build ``loader`` again with the plan's levers, where it is the training loader."""
    config = asdict(_loader_config(loader))
    if not plan.matches(config):
        return
    iterable = getattr(loader, "_dataset_kind", 0) == 1  # torch's _DatasetKind.Iterable
    moves, kept = changes(plan, config, iterable=iterable)
    if moves:
        bound = signature.bind(loader, *args, **kwargs)
        for lever, (_, to) in moves.items():
            bound.arguments[lever] = to
        try:
            _reinit(loader, orig_init, bound.args, bound.kwargs)
        except Exception:
            _reinit(loader, orig_init, (loader, *args), kwargs)  # back to the script's own
            kept.update(dict.fromkeys((x for x in moves if x in plan.levers), REFUSED))
            moves = {}
    for lever, move in moves.items():
        probe.applied.setdefault(lever, move)
    for lever, reason in kept.items():
        probe.apply_kept.setdefault(lever, reason)


def _reinit(loader: Any, orig_init: Any, args: Any, kwargs: Any) -> None:
    # DataLoader refuses some attributes once initialised (batch_size, sampler, ...): built anew.
    object.__setattr__(loader, "_DataLoader__initialized", False)
    orig_init(*args, **kwargs)


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
