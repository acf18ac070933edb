"""Attaching the probe to an unmodified training script, from inside its process.

:func:`attach` makes the rank's :class:`~auditor.probe.probe.Probe` and installs the torch
patches it installs (``auditor.probe.patches``, one module per patch: data loading, forward,
backward, optimizer, DDP comm hook, DataParallel, collectives, host-to-device copies, the
DeepSpeed engine's backward and step, and the named work outside the phases: checkpoint saves,
evaluation).

Everything is wrapped in ``try``: if a hook cannot attach, the job runs untouched and the phase
is reported as not measured.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .patches.backward import hook_backward
from .patches.checkpoint import hook_checkpoint
from .patches.collectives import hook_collectives
from .patches.dataloader import hook_dataloader
from .patches.dataparallel import hook_dataparallel
from .patches.ddp import hook_ddp
from .patches.deepspeed import hook_deepspeed
from .patches.evaluation import hook_evaluation
from .patches.forward import hook_forward
from .patches.h2d import hook_h2d
from .patches.optimizer import hook_optimizer
from .probe import Probe

_PROBE: Probe | None = None


def current() -> Probe | None:
    return _PROBE


def attach(torch: Any, *, sink_path: str | None = None, job: str = "") -> Probe | None:
    """Install every hook into ``torch`` once per process; returns the probe (or None)."""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    probe = Probe(torch, sink_path=sink_path, job=job)
    _PROBE = probe
    for name, fn in (
        ("data", hook_dataloader),
        ("h2d", hook_h2d),
        ("collectives", hook_collectives),
        ("forward", hook_forward),
        ("backward", hook_backward),
        ("optimizer", hook_optimizer),
        ("collective_wait", hook_ddp),
        ("dataparallel", hook_dataparallel),
        ("checkpoint", hook_checkpoint),
        ("evaluation", hook_evaluation),
        ("deepspeed", hook_deepspeed),
    ):
        try:
            fn(probe, torch)
        except Exception as exc:  # never break the job: report the phase as not measured
            probe.mark_unmeasured("collective_wait" if name == "collectives" else name)
            if os.environ.get("AUDITOR_DEBUG"):
                print(f"auditor probe: could not hook {name}: {exc!r}", file=sys.stderr)
    os.register_at_fork(after_in_child=probe.after_fork_in_child)
    return probe
