"""One module per finding kind. Each exposes ``detect(snapshot, *, prior, **thresholds)``.

Rules are pure: a snapshot in, findings out; no I/O, no clock, no globals. ``prior`` holds the
findings of the rules that ran before, so a symptom (``utilization_imbalance``) can name the
cause that explains it instead of guessing again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..findings import Finding
from ..snapshot import Snapshot
from . import (
    batch_split,
    compute_straggler,
    cpu_oversubscription,
    data_starvation,
    dataparallel_gather,
    hardware_straggler,
    idle_device,
    memory_headroom,
    memory_imbalance,
    memory_pressure,
    utilization_imbalance,
)


class Rule(Protocol):
    def __call__(
        self, snapshot: Snapshot, *, prior: Sequence[Finding] = (), **thresholds: Any
    ) -> list[Finding]: ...


# Causes first, symptoms last: utilization_imbalance links to the cause found before it.
# hardware_straggler runs before compute_straggler (a slow GPU is the more specific cause);
# dataparallel_gather before memory_imbalance (which skips the GPUs it already named);
# memory_pressure before memory_headroom (which leaves the ranks pressure blamed to it).
RULES: dict[str, Callable[..., list[Finding]]] = {
    "cpu_oversubscription": cpu_oversubscription.detect,
    "data_starvation": data_starvation.detect,
    "batch_split": batch_split.detect,
    "hardware_straggler": hardware_straggler.detect,
    "compute_straggler": compute_straggler.detect,
    "dataparallel_gather": dataparallel_gather.detect,
    "memory_imbalance": memory_imbalance.detect,
    "memory_pressure": memory_pressure.detect,
    "memory_headroom": memory_headroom.detect,
    "idle_device": idle_device.detect,
    "utilization_imbalance": utilization_imbalance.detect,
}
