"""One module per finding kind. Each exposes ``detect(snapshot, **thresholds)``.

Rules are pure: a snapshot in, findings out; no I/O, no clock, no globals, no other rule's
module or findings. Where another rule's conclusion matters, the engine's cause-linking step
(:mod:`auditor.analysis.causes`) hands it over as a keyword input; the order here is immaterial.
"""

from __future__ import annotations

from collections.abc import Callable
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
    def __call__(self, snapshot: Snapshot, **thresholds: Any) -> list[Finding]: ...


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
