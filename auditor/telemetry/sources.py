"""Device sources: where GPU samples come from.

Everything above telemetry takes a :class:`DeviceSource` as a parameter: the live path passes
:class:`~auditor.telemetry.nvml.NvmlSource`, tests and replays pass
:class:`RecordedDeviceSource`. Nothing patches NVML.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, runtime_checkable

from auditor.samples import DeviceSample
from auditor.telemetry.identity import DeviceIdentity
from auditor.telemetry.recorded import Recording, read_recording

log = logging.getLogger(__name__)

RECORDED_PREFIX = "recorded:"


@runtime_checkable
class DeviceSource(Protocol):
    """A node's GPUs: which there are, and one consistent read of one of them.

    ``sample`` of a GPU that fell off the bus returns ``DeviceSample(lost=True)`` (other fields
    None) from then on; it never raises for a lost GPU. It raises ``KeyError`` for a UUID the
    source does not know.
    """

    def devices(self) -> list[DeviceIdentity]: ...

    def sample(self, uuid: str) -> DeviceSample: ...


class RecordedDeviceSource:
    """Replays the device samples a recording holds for one node, in real time.

    The replay starts when the source is built: ``sample(uuid)`` returns the recorded sample of
    that GPU at the same offset from the recording's first device sample (over all nodes, so the
    sources of several nodes stay aligned) as ``clock() - start``, that is the latest sample at
    or before that offset (the GPU's first sample before it appears), with ``time`` rewritten to
    ``clock()``.

    With ``loop=True`` the recording repeats with a period of its span plus one sampling step
    (the median gap between distinct sample times), so its last and first samples do not land
    on the same instant; without it the last sample is held. A GPU that the replay has passed a
    ``lost=True`` sample of stays lost, across loops too, as a real lost GPU does.
    """

    def __init__(
        self,
        recording: Recording | str | os.PathLike[str],
        node: str,
        *,
        clock: Callable[[], float] = time.time,
        loop: bool = True,
    ) -> None:
        rec = recording if isinstance(recording, Recording) else read_recording(recording)
        self.node = node
        self._clock = clock
        self._loop = loop
        all_devices = rec.batch.devices
        times = sorted({d.time for d in all_devices})
        self._t0 = times[0] if times else 0.0
        gaps = [b - a for a, b in itertools.pairwise(times) if b > a]
        step = statistics.median(gaps) if gaps else 1.0
        self._period = (times[-1] - self._t0 + step) if times else step

        per_uuid: dict[str, list[DeviceSample]] = {}
        for d in sorted(all_devices, key=lambda d: d.time):
            if d.node == node:
                per_uuid.setdefault(d.uuid, []).append(d)
        if all_devices and not per_uuid:
            nodes = sorted({d.node for d in all_devices})
            log.warning("recording has no device samples for node %r (nodes: %s)", node, nodes)
        self._samples = per_uuid
        self._offsets = {u: [d.time - self._t0 for d in ds] for u, ds in per_uuid.items()}
        self._first_lost: dict[str, float] = {}
        for u, ds in per_uuid.items():
            lost = [d.time - self._t0 for d in ds if d.lost]
            if lost:
                self._first_lost[u] = lost[0]
        self._identities = sorted(
            (
                DeviceIdentity(
                    index=ds[0].index,
                    uuid=u,
                    model=next((d.model for d in ds if d.model), ""),
                )
                for u, ds in per_uuid.items()
            ),
            key=lambda i: (i.index, i.uuid),
        )
        self._start = clock()

    def devices(self) -> list[DeviceIdentity]:
        return list(self._identities)

    def sample(self, uuid: str) -> DeviceSample:
        samples = self._samples.get(uuid)
        if samples is None:
            raise KeyError(f"no recorded GPU {uuid!r} on node {self.node!r}")
        now = self._clock()
        elapsed = max(0.0, now - self._start)
        first_lost = self._first_lost.get(uuid)
        if first_lost is not None and elapsed >= first_lost:
            ident = samples[0]
            model = next((d.model for d in samples if d.model), "")
            return DeviceSample(
                node=self.node, index=ident.index, uuid=uuid, time=now, model=model, lost=True
            )
        offset = elapsed % self._period if self._loop else elapsed
        i = bisect.bisect_right(self._offsets[uuid], offset) - 1
        return replace(samples[max(i, 0)], time=now)

    def close(self) -> None:
        """Nothing to release; here so callers can close any source."""


def make_source(spec: str, node: str) -> DeviceSource:
    """A device source from its spec: ``nvml`` or ``recorded:<path to recording.jsonl>``."""
    text = spec.strip()
    if text == "nvml":
        from auditor.telemetry.nvml import NvmlSource

        return NvmlSource(node)
    if text.startswith(RECORDED_PREFIX):
        path = text[len(RECORDED_PREFIX) :].strip()
        if not path:
            raise ValueError(
                f"device source {spec!r} names no file: expected 'recorded:<path to "
                "recording.jsonl>'"
            )
        return RecordedDeviceSource(path, node)
    raise ValueError(
        f"unknown device source {spec!r}: expected 'nvml' or 'recorded:<path to recording.jsonl>'"
    )
