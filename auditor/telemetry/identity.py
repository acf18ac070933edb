"""The identity of a GPU, apart from the sources that find it: :mod:`.nvml` names its GPUs this
way and :mod:`.sources` picks NVML lazily, so neither imports the other's module for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceIdentity:
    """A physical GPU as the node sees it: NVML index, UUID (the stable name), model."""

    index: int
    uuid: str
    model: str = ""
