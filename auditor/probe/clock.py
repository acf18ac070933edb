"""The step clock: turns hook events inside a training loop into per-step phase timings.

A step is one iteration of the training loop that ends in an optimizer step: it starts when the
loop asks the DataLoader for a batch and ends when it asks for the next one after
``optimizer.step()`` (gradient accumulation folds several batches into one step: the step counts
them, ``StepSample.micro_batches``, and sums their sizes, ``batch_size``; a counter on the hot
path). Loops without a DataLoader close a step at each optimizer step.

Exclusive phases. Frameworks nest the phases in each other: Lightning runs forward and backward
inside ``optimizer.step(closure)``, Hugging Face's Trainer gathers a token count across ranks
before the forward, FSDP all-gathers inside forward and reduce-scatters inside backward,
activation checkpointing re-runs forward inside backward. The clock keeps a stack of the open
phases and charges time to the innermost one only: opening a phase closes the enclosing phase's
current segment, closing it starts a new segment of the enclosing phase. So every instant of a
step is booked to at most one phase and the phases add up to at most the step; the rest (the
loop's own Python, logging, framework bookkeeping) is ``StepSample.other_s``. Two exceptions:

* a forward that starts inside backward is activation checkpointing's recompute: it stays
  backward (it is backward's cost), so it opens no phase of its own;
* the DDP gradient all-reduce is not a call on the training thread but a window seen by the
  communication hook (last bucket ready -> last all-reduce done); that wait, on the host clock,
  is carved out of backward when the step is resolved.

Named work outside the training phases (``StepSample.outside``). The probe opens an *outside*
region around work it can name: ``checkpoint`` (``torch.save``, ``torch.distributed.checkpoint``'s
``save``/``async_save``) and ``evaluation`` (from ``model.eval()`` to ``model.train()`` on the
training model). An outside region is a counted phase on the same stack, so it is exclusive with
the training phases like any other: the innermost takes the time. Inside it the training phases
open uncounted (an evaluation's forward and its loader's waits are the evaluation's cost: not
forward, not the training step's data wait, and its batches are not the step's), except
collectives: a wait is a wait wherever it happens (a metric all-reduce inside an evaluation, the
plan exchange of a distributed checkpoint). Work named inside a phase (a framework callback that
saves inside ``optimizer.step``) is the named work, not the phase: the innermost wins. Named
time is thus part of the step's ``other_s`` (never of its phases) and is never counted twice;
nested regions (a ``torch.save`` inside an evaluation) book to the innermost.

Data wait is on the host clock (a device timer says nothing about a host-side wait); where the
loop asks for a batch inside another phase (a ``dataloader_iter`` training step inside the
optimizer's closure) the enclosing phase is split around it all the same.

On the device the host runs ahead of the GPU: it asks for the next batch while the kernels of
the step it just launched still run. A host-clock data wait then overlaps device work, and a
host-clock DDP window (last bucket launched -> all-reduce done) holds the rank's own queued
compute (gloo and NCCL alike wait for the gradients on the device). So with a device timer
every figure of a step is read on the device's timeline, between marks recorded on the stream:
the step from its first mark to the next step's, the data wait from a mark before the loader is
asked to one after it (the time the device had nothing left to run: zero while queued work
covers the wait), and the DDP wait from the last bucket's launch to the end of backward (the
device waits there for the all-reduce). Phases, data wait and collective wait then partition
the step on one clock and never overlap.

Hot path: every event only reads a clock and appends to a list. Durations are resolved later,
off the training thread, by :meth:`StepClock.resolve` (called from the sink's flush thread). That
matters on GPUs: there the phase marks are CUDA events recorded on the current stream and read
once the device has passed them, so nothing on the hot path synchronises. Adjacent segments share
their boundary mark, so a nested phase costs one mark per boundary, and of a backward's DDP
buckets only the last records one. On the host a mark is ``time.perf_counter`` itself. Every
duration is resolved to the nanosecond, the host clock's own resolution: the figures are the
same, and their JSON on the flush thread is about half as dear.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from auditor.samples import StepSample

from .pending import NO_MEMORY, PendingStep, Span, new_step
from .timers import CpuTimer, Timer

PHASE_H2D, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_COLLECTIVE, PHASE_DATA = range(6)
# Named work outside the training phases (its name on the stack entry and the span).
PHASE_OUTSIDE = 6
# The named work that ends where training resumes (see ``StepClock.outside_begin``).
EVALUATION = "evaluation"
# Creating an iterator that starts the loader's workers (``StepClock.loader_started``).
LOADER_START = "loader_start"
_N_TIMED = 5  # phases whose spans the timer measures (data wait is on the host clock)
# The phase stack's entry of each counted phase without a name: pushed as is (no tuple built),
# and known by identity where it is the only phase open (``StepClock._pop``).
_COUNTED = tuple((phase, True, None) for phase in range(PHASE_OUTSIDE + 1))
_H2D, _FORWARD, _BACKWARD, _OPTIMIZER = (
    _COUNTED[p] for p in (PHASE_H2D, PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER)
)
# The loader's CPU time (``StepSample.data_cpu_s``, a system call around each batch) is read on
# every step after one that waited this long for data, and on every DATA_CPU_EVERY-th step
# otherwise: where the wait is short the loading costs the step little, and a fast loop is not
# taxed for a figure nobody needs on each step.
DATA_CPU_MIN_WAIT_S = 0.001
DATA_CPU_EVERY = 16
# The name the DDP gradient all-reduce wait has in ``StepSample.collective_ops``.
DDP_ALLREDUCE = "ddp_allreduce"


class StepClock:
    """Accumulates phase spans for the current step; closes steps into :class:`PendingStep`.

    Events are called on the training thread only (the hooks check), except the DDP bucket
    callbacks, which only touch their own counters.
    """

    def __init__(
        self,
        rank: Callable[[], int],
        timer: Timer | None = None,
        *,
        memory: Callable[[], tuple[int | None, int | None, int | None]] | None = None,
        max_pending: int = 10_000,
        wall: Callable[[], float] = time.time,
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._rank = rank
        self.timer: Timer = timer or CpuTimer()
        self._dev = self.timer.device
        self._mark = self.timer.mark
        # Device timer: the current step's first mark (the previous step's last), and the open
        # data wait's first mark.
        self._start_mark: Any = None
        self._data_open: Any = None
        self._memory = memory
        self._wall = wall
        self._now = now
        self.pending: deque[PendingStep] = deque(maxlen=max_pending)
        self.dropped = 0
        self.steps = 0
        # Backward and optimizer calls so far: a loader whose batches have one between them
        # trains (an evaluation loop's batches have none; see the probe's DataLoader hook).
        self.updates = 0
        self.saw_loader = False
        # The loader's CPU time is read this step (DATA_CPU_MIN_WAIT_S).
        self.cpu_due = True
        # Set by the probe when the DDP gradient all-reduce cannot be timed (a builtin C++ comm
        # hook): the step's collective wait is then not measured at all, rather than partial.
        self.collective_unmeasured = False
        # Open phases, innermost last: [phase, counted, name]. Only the innermost counted one
        # has an open segment, which started at ``_seg``. ``open_phases`` is the same list, for
        # the hooks to read (changed in place only, never replaced).
        self._stack: list[tuple[int, bool, str | None]] = []
        self.open_phases = self._stack
        self._top = -1  # index of the innermost counted entry, -1: none
        self._seg: Any = None
        self.backward_depth = 0  # counted backward phases open
        # Inside a DDP communication hook: collectives called there are the gradient all-reduce,
        # timed by the hook's own window (never twice).
        self.hook_depth = 0
        # Open outside regions (named work): the training phases inside them are not counted.
        self._outside_depth = 0
        # A backward or an optimizer step ended an evaluation: the script trains in eval mode
        # (frozen batch norm, no dropout); no evaluation is named until the model trains again.
        self.trains_in_eval = False
        # Inside the loader's ``__next__`` (its own collectives are part of the data wait), and
        # inside an evaluation loop's (none of the step's).
        self._in_data = False
        self._data_outside = False
        # The loader's iterator started new workers: the next batch's wait is theirs to start.
        self._fresh_loader = False
        self._reset_marks()
        self._reset(None)

    def use(
        self,
        timer: Timer,
        *,
        memory: Callable[[], tuple[int | None, int | None, int | None]] | None = None,
    ) -> None:
        """Switch the phase timer (before the first step: marks of two timers never mix)."""
        self.timer = timer
        self._dev = timer.device
        self._mark = timer.mark
        self._memory = memory
        self._reset_marks()

    def _reset(self, start: float | None) -> None:
        """A new step's tallies (once a step: only what a step adds to)."""
        self._start = start
        self._data_wait = 0.0
        self._data_cpu: float | None = None  # None: no loader CPU time read this step
        self._loader_start = 0.0
        self._batch = 0
        self._batches = 0  # batches of known size (their sizes sum to ``_batch``)
        self._spans: list[Span] = []
        self._opt_done = False
        self._cw_launch = 0.0
        self._cw_done = 0.0
        self._cw_seen = False
        self._coll_seen = False
        self._coll_bytes: dict[str, int] = {}
        if self._dev:
            self._reset_marks()

    def _reset_marks(self) -> None:
        """A new step's device marks (a host timer's steps keep these empty)."""
        self._data_marks: list[tuple[Any, Any]] = []
        self._cw_mark: Any = None
        self._bwd_end: Any = None
        self._spare: list[Any] = []

    # --- the phase stack -----------------------------------------------------------------------
    def _open(self, phase: int, name: str | None = None, counted: bool = True) -> None:
        stack = self._stack
        if not counted:
            stack.append((phase, False, name))
            return
        m = self._mark()
        top = self._top
        if top >= 0:
            outer = stack[top]
            if outer[0] != PHASE_DATA:
                self._spans.append((outer[0], self._seg, m, outer[2]))
        self._top = len(stack)
        stack.append(_COUNTED[phase] if name is None else (phase, True, name))
        self._seg = m
        if phase == PHASE_BACKWARD:
            self.backward_depth += 1

    def _push(self, entry: tuple[int, bool, str | None]) -> None:
        """Open a ``_COUNTED`` phase where none is open: what :meth:`_open` then does, for
        less (the common case of every step's phases, and a hook's cost is its lines)."""
        self._seg = self._mark()
        self._top = 0
        self._stack.append(entry)
        if entry is _BACKWARD:
            self.backward_depth += 1

    def _pop(self, entry: tuple[int, bool, str | None]) -> bool:
        """Close a ``_COUNTED`` phase where it is the only one open: what :meth:`_close_phase`
        then does, for less; False (nothing done) where it is not."""
        stack = self._stack
        if len(stack) != 1 or stack[0] is not entry:
            return False
        m = self._mark()
        self._spans.append((entry[0], self._seg, m, None))
        self._seg = m
        stack.pop()
        self._top = -1
        return True

    def _close_phase(self, phase: int) -> bool:
        """Close the innermost open ``phase`` (and anything left open inside it); False if it
        was not open."""
        stack = self._stack
        i = len(stack) - 1
        if i == 0 and self._top == 0 and stack[0][0] == phase:
            # The common case, the only open phase ends (what the general path below does).
            m = self._mark()
            if phase != PHASE_DATA:
                self._spans.append((phase, self._seg, m, stack[0][2]))
            self._seg = m
            if phase == PHASE_BACKWARD:
                self._bwd_end = m
                self.backward_depth -= 1
            elif phase == PHASE_OUTSIDE:
                self._outside_depth -= 1
            stack.clear()
            self._top = -1
            return True
        while i >= 0 and stack[i][0] != phase:
            i -= 1
        if i < 0:
            return False
        top = self._top
        if top >= i:  # the innermost counted phase is at or inside it: end its segment here
            m = self._mark()
            inner = stack[top]
            if inner[0] != PHASE_DATA:
                self._spans.append((inner[0], self._seg, m, inner[2]))
            self._seg = m
            if phase == PHASE_BACKWARD:
                self._bwd_end = m
            for entry in stack[i:]:
                if entry[1] and entry[0] == PHASE_BACKWARD:
                    self.backward_depth -= 1
                elif entry[0] == PHASE_OUTSIDE:
                    self._outside_depth -= 1
            del stack[i:]
            # The enclosing counted phase (if any) goes on from here.
            top = i - 1
            while top >= 0 and not stack[top][1]:
                top -= 1
            self._top = top
        else:  # only uncounted entries (a recompute's forward) from it up: nothing was booked
            del stack[i:]
        return True

    # --- events, called on the training thread -------------------------------------------------
    def _begin(self) -> None:
        """The first event of the very first step."""
        self._start = self._now()
        if self._dev and self._start_mark is None:
            self._start_mark = self._mark()

    def data_begin(self) -> float:
        t = self._now()
        closed = self._opt_done
        if closed:
            self._close(t)
        if self._start is None:
            self._start = t
        if self._outside_depth:
            # An evaluation loop's loader: its wait is the evaluation's, not the step's data.
            self._data_outside = True
            return t
        if self._dev:
            # Right after a close, the step's boundary mark is this wait's first mark too.
            m = self._start_mark if closed and self._start_mark is not None else self._mark()
            self._data_open = m
            if self._start_mark is None:
                self._start_mark = m
        if self._stack:  # asked for a batch inside another phase: split it around the wait
            self._open(PHASE_DATA)
        self._in_data = True
        return t

    def data_end(self, began: float, batch_size: int | None, cpu_s: float | None = None) -> None:
        self.saw_loader = True
        if self._data_outside:
            self._data_outside = False
            self._fresh_loader = False
            return
        self._in_data = False
        waited = self._now() - began
        self._data_wait += waited
        if self._fresh_loader:
            self._fresh_loader = False
            self._loader_start += waited
        if self._data_open is not None:
            self._data_marks.append((self._data_open, self._mark()))
            self._data_open = None
        if cpu_s is not None:
            self._data_cpu = cpu_s if self._data_cpu is None else self._data_cpu + cpu_s
        if batch_size is not None:
            self._batch += batch_size
            self._batches += 1
        if self._stack and self._stack[-1][0] == PHASE_DATA:
            self._close_phase(PHASE_DATA)

    @property
    def running(self) -> bool:
        """The first step has begun (before it, the run starts up)."""
        return self._start is not None

    def loader_stopping(self) -> None:
        """The training loader's iterator ends its epoch and shuts its workers down (a loader
        without ``persistent_workers``): this wait is part of their start anew (the next epoch's
        ``loader_started``)."""
        if self._start is not None:
            self._fresh_loader = True

    def loader_started(self, seconds: float) -> None:
        """The training loader's iterator started new workers (an epoch of a loader without
        ``persistent_workers``), which took ``seconds`` (booked by the caller as named work,
        :data:`LOADER_START`); the next batch's wait is spent on their start too. The step
        reports both (``StepSample.loader_start_s``)."""
        if self._start is None:
            return  # before the first step: the run's start-up, not a step's
        self._loader_start += seconds
        self._fresh_loader = True

    # A phase opened where none is open (the stack is empty: so not inside backward, nor inside
    # named work) takes the short way (``_push``/``_pop``); the rest, ``_open``/``_close_phase``.
    def h2d_begin(self) -> None:
        """The loop copies its batch to the device (``Tensor.to`` and kin, batch in hand)."""
        if self._start is None:
            self._begin()
        if self._stack:
            self._open(PHASE_H2D, counted=not self._outside_depth)
        else:
            self._push(_H2D)

    def h2d_end(self) -> None:
        if not self._pop(_H2D):
            self._close_phase(PHASE_H2D)

    def forward_begin(self) -> None:
        if self._start is None:
            self._begin()
        if self._stack:
            # A forward inside backward is activation checkpointing's recompute: backward's.
            self._open(PHASE_FORWARD, counted=self.backward_depth == 0 and not self._outside_depth)
        else:
            self._push(_FORWARD)

    def forward_end(self) -> None:
        if not self._pop(_FORWARD):
            self._close_phase(PHASE_FORWARD)

    def backward_begin(self) -> None:
        self._update_begin(_BACKWARD)

    def backward_end(self) -> None:
        if self._pop(_BACKWARD):
            self._bwd_end = self._seg
            self.backward_depth -= 1
        else:
            self._close_phase(PHASE_BACKWARD)

    def optimizer_begin(self) -> None:
        self._update_begin(_OPTIMIZER)

    def _update_begin(self, entry: tuple[int, bool, str | None]) -> None:
        """A backward or an optimizer step begins (``updates``: a loader whose batches have one
        between them trains); inside an evaluation, it ends the evaluation."""
        if self._start is None:
            self._begin()
        self.updates += 1
        if self._stack:
            if self._outside_depth:
                self._training_resumes()
            self._open(entry[0], counted=not self._outside_depth)
        else:
            self._push(entry)

    def optimizer_end(self) -> None:
        if not self._pop(_OPTIMIZER):
            self._close_phase(PHASE_OPTIMIZER)
            if any(e[0] == PHASE_OPTIMIZER for e in self._stack):
                return  # an optimizer stepping inside another (a wrapper's inner optimizer)
        self._opt_done = True
        if not self.saw_loader:
            self._close(self._now())

    def collective_begin(self, name: str, nbytes: int | None = None) -> None:
        """A collective call (or a wait on an async one's ``Work``) starts: the rank waits.
        ``nbytes``: the bytes it carries (None: not known, e.g. pickled objects)."""
        if self._start is None:
            self._begin()
        self._coll_seen = True
        # A collective inside the loader's own ``__next__`` is part of the data wait already.
        self._open(PHASE_COLLECTIVE, name, counted=not self._in_data)
        if nbytes and not self._in_data:
            self._coll_bytes[name] = self._coll_bytes.get(name, 0) + nbytes

    def collective_end(self) -> None:
        self._close_phase(PHASE_COLLECTIVE)

    def outside_begin(self, name: str) -> None:
        """Named work outside the training phases starts (a checkpoint save, an evaluation).
        An evaluation that turns out to train (a backward or an optimizer step inside it) ends
        there: the model trains in eval mode."""
        if self._start is None:
            self._begin()
        self._outside_depth += 1
        self._open(PHASE_OUTSIDE, name)

    def outside_end(self) -> None:
        self._close_phase(PHASE_OUTSIDE)

    @property
    def evaluating(self) -> bool:
        """An evaluation region is open."""
        return any(e[0] == PHASE_OUTSIDE and e[2] == EVALUATION for e in self._stack)

    def _training_resumes(self) -> None:
        """A backward or an optimizer step inside an evaluation: it was no evaluation (a script
        that trains with the model in eval mode); it ends here, and the training phases count."""
        inner = next((e for e in reversed(self._stack) if e[0] == PHASE_OUTSIDE), None)
        if inner is not None and inner[2] == EVALUATION:
            self._close_phase(PHASE_OUTSIDE)
            self.trains_in_eval = True

    @property
    def outside(self) -> bool:
        """Inside named outside work."""
        return self._outside_depth > 0

    def bucket_launched(self, nbytes: int | None = None, *, last: bool = True) -> float:
        """A gradient bucket is ready on this rank and its all-reduce starts (comm hook);
        ``nbytes``: the bucket's size. ``last``: False where the bucket is known not to be the
        backward's last (DDP's ``GradBucket.is_last()``; DDP launches its buckets in index
        order): the device wait is read from the last launch only, so no other bucket records
        a mark."""
        t = self._now()
        if nbytes:
            self._coll_bytes[DDP_ALLREDUCE] = self._coll_bytes.get(DDP_ALLREDUCE, 0) + nbytes
        self._cw_launch = max(self._cw_launch, t)
        self._cw_seen = True
        if self._dev and last:
            # Recorded on the stream the gradients were computed on: passed once they exist.
            if self._cw_mark is not None:
                self._spare.append(self._cw_mark)
            self._cw_mark = self._mark()
        return t

    def bucket_done(self) -> None:
        """An all-reduce completed (future callback; may run on the backend's thread)."""
        self._cw_done = max(self._cw_done, self._now())

    def flush_open(self) -> None:
        """At exit: close a step that finished its optimizer step but saw no next batch."""
        if self._opt_done:
            self._close(self._now())

    # --- closing and resolving ---------------------------------------------------------------
    def _close(self, t: float) -> None:
        start = self._start if self._start is not None else t
        top = self._top
        m = None
        if top >= 0:
            # A phase open across the boundary: end its segment here, go on in the next step.
            m = self._mark()
            entry = self._stack[top]
            if entry[0] != PHASE_DATA:
                self._spans.append((entry[0], self._seg, m, entry[2]))
            self._seg = m
        start_mark = end_mark = ddp_marks = None
        if self._dev:
            start_mark = self._start_mark
            end_mark = m if m is not None else self._mark()
            if start_mark is None:  # no event opened the step: it starts where it ends
                start_mark = end_mark
            self._start_mark = end_mark
            if self._cw_seen and self._cw_mark is not None and self._bwd_end is not None:
                ddp_marks = (self._cw_mark, self._bwd_end)
            elif self._cw_mark is not None:
                self._spare.append(self._cw_mark)
        # The wait of this rank at the gradient all-reduce: from its last bucket being ready to
        # the last all-reduce finishing. The rank the others wait for sees almost none.
        ddp = max(0.0, self._cw_done - self._cw_launch) if self._cw_seen else None
        pending = self.pending
        if len(pending) == pending.maxlen:
            self.dropped += 1
        batches = self._batches
        self.cpu_due = self._data_wait >= DATA_CPU_MIN_WAIT_S or not self.steps % DATA_CPU_EVERY
        pending.append(
            new_step(
                PendingStep,
                (
                    self.steps,
                    self._wall(),
                    max(0.0, t - start),
                    self._data_wait,
                    self._batch if batches else None,
                    self._data_cpu,
                    ddp,
                    self._coll_seen,
                    self._spans,
                    self._coll_bytes,
                    self._memory() if self._memory else NO_MEMORY,
                    batches or 1,
                    start_mark,
                    end_mark,
                    self._data_marks,
                    ddp_marks,
                    self._spare,
                    self._loader_start,
                ),
            )
        )
        self.steps += 1
        self._reset(t)

    def resolve(self, rss_bytes: int | None = None) -> list[StepSample]:
        """Steps whose marks the device has passed, oldest first; called off the hot path."""
        out: list[StepSample] = []
        rank = self._rank()
        timer = self.timer
        pending = self.pending
        if not self._dev:
            # Host marks: ready when made, nothing to give back (``CpuTimer``).
            while pending:
                out.append(self._sample(rank, pending.popleft(), rss_bytes))
            return out
        while self.pending:
            p = self.pending[0]
            # Every mark, not only the last: marks on different streams complete out of order.
            used = p.marks()
            if not all(timer.ready(m) for m in used):
                break  # the device has not passed this step yet: read it next time
            self.pending.popleft()
            out.append(self._sample(rank, p, rss_bytes))
            # Each mark once; the step's last mark may start the next step's first segment (a
            # phase open across the boundary) and is the next step's first mark: those go back
            # with the next step.
            marks: dict[int, Any] = {id(m): m for m in (*used, *p.spare_marks)}
            if p.spans:
                marks.pop(id(p.spans[-1][2]), None)
            if p.end_mark is not None:
                marks.pop(id(p.end_mark), None)
            timer.release(marks.values())
        return out

    def _sample(self, rank: int, p: PendingStep, rss_bytes: int | None) -> StepSample:
        elapsed = self.timer.elapsed
        phases = [0.0] * _N_TIMED
        ops: dict[str, float] = {}
        outside: dict[str, float] = {}
        for phase, a, b, name in p.spans:
            d = elapsed(a, b)
            if phase == PHASE_OUTSIDE:
                key = name or "outside"
                outside[key] = outside.get(key, 0.0) + d
                continue
            phases[phase] += d
            if phase == PHASE_COLLECTIVE:
                key = name or "collective"
                ops[key] = ops.get(key, 0.0) + d
        backward = phases[PHASE_BACKWARD]
        step_s, data_wait_s, ddp_wait_s = p.step_s, p.data_wait_s, p.ddp_wait_s
        if p.start_mark is not None:  # a device timer: every figure on the device's timeline
            step_s = elapsed(p.start_mark, p.end_mark)
            data_wait_s = sum(elapsed(a, b) for a, b in p.data_marks)
            if p.ddp_marks is not None and ddp_wait_s is not None:
                ddp_wait_s = elapsed(*p.ddp_marks)
        if ddp_wait_s is not None:
            # The DDP wait happens inside backward (the reducer waits for its buckets there).
            ops[DDP_ALLREDUCE] = ops.get(DDP_ALLREDUCE, 0.0) + ddp_wait_s
            backward = max(0.0, backward - ddp_wait_s)
        measured = (ddp_wait_s is not None or p.collectives_seen) and not (
            self.collective_unmeasured
        )
        alloc, reserved, peak = p.memory
        if ops:
            ops = {k: _ns(v) for k, v in ops.items()}
        data_cpu_s = p.data_cpu_s
        # Each to the nanosecond (``_ns``), in one pass.
        step_s, data_wait_s, h2d, forward, backward, optimizer = [
            round(v * 1e9) / 1e9
            for v in (
                step_s,
                data_wait_s,
                phases[PHASE_H2D],
                phases[PHASE_FORWARD],
                backward,
                phases[PHASE_OPTIMIZER],
            )
        ]
        return StepSample(
            rank=rank,
            step=p.step,
            time=p.wall_time,
            step_s=step_s,
            data_wait_s=data_wait_s,
            h2d_s=h2d,
            forward_s=forward,
            backward_s=backward,
            optimizer_s=optimizer,
            collective_wait_s=_ns(sum(ops.values())) if measured else None,
            batch_size=p.batch_size,
            rss_bytes=rss_bytes,
            mem_allocated_bytes=alloc,
            mem_reserved_bytes=reserved,
            mem_peak_bytes=peak,
            data_cpu_s=_ns(data_cpu_s) if data_cpu_s is not None else None,
            collective_ops=ops if measured else None,
            collective_bytes=(p.coll_bytes or None) if measured else None,
            micro_batches=p.micro_batches,
            outside={k: _ns(v) for k, v in outside.items()} if outside else None,
            loader_start_s=_ns(p.loader_start_s) if p.loader_start_s else None,
        )


def _ns(seconds: float) -> float:
    """A duration to the nanosecond, the host clock's resolution (a CUDA event's is about half
    a microsecond): the same figure, with no digit below the nanosecond where a difference of
    two clock readings carries 17 significant ones. ``repr`` of such a float, which the JSON of
    every field of every step pays on the flush thread, costs about half."""
    return round(seconds * 1e9) / 1e9
