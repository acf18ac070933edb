"""The GPU monitor: one per physical GPU, bound to it by NVML UUID, sampling in a thread.

:class:`GpuMonitorCore` is plain Python (tests and ``--no-ray`` use it as is);
:func:`ray_actor_class` makes it the ``GpuMonitor`` Ray actor and :func:`start_monitor` places one
on a given Ray node. Placement, and why it looks the way it does:

* ``num_gpus=0, num_cpus=0``: the monitor reads NVML, it never computes, so it takes no GPU and
  no CPU slot away from training.
* Pinned to its node with ``NodeAffinitySchedulingStrategy(node_id, soft=False)``, and to its GPU
  by the UUID it is built with. A fractional GPU request (``num_gpus=0.01``) would *not* pin it:
  Ray packs fractional requests onto the first GPU that fits (GPU 0), so every monitor of a node
  would claim GPU 0 while each of them reads a different GPU. Only the UUID says which GPU.
* ``max_restarts=-1``: Ray restarts a dead monitor, calling the constructor again with the same
  arguments, so the constructor itself starts sampling. Calls made while it is down fail or time
  out; the node agent then exports the GPU as ``auditor_gpu_up 0`` with its last sample's time.

The node agent pulls :meth:`GpuMonitorCore.latest` once per sample interval
(:func:`pull_latest`): the sample stays in the monitor until then, nothing is pushed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from auditor.samples import DeviceSample
from auditor.telemetry.sources import DeviceIdentity, DeviceSource, make_source

log = logging.getLogger(__name__)

# Ray actor options of every GpuMonitor (see the module docstring).
MONITOR_OPTIONS: dict[str, Any] = {"num_cpus": 0, "num_gpus": 0, "max_restarts": -1}


class GpuMonitorCore:
    """Samples one GPU every ``interval_s`` seconds; :meth:`latest` is the newest sample.

    ``source_spec`` (``nvml`` or ``recorded:<path>``) is turned into a source here, on the node
    the monitor runs on; tests may pass ``source`` instead. The first sample is taken at once.
    """

    def __init__(
        self,
        *,
        source_spec: str = "nvml",
        node: str,
        uuid: str,
        interval_s: float = 1.0,
        source: DeviceSource | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.uuid = uuid
        self.spec = source_spec
        self._interval = interval_s
        self._clock = clock
        self._source: DeviceSource = (
            source if source is not None else make_source(source_spec, node)
        )
        self._lock = threading.Lock()
        self._latest: DeviceSample | None = None
        self._samples = 0
        self._errors = 0
        self._last_error: str | None = None
        self._started = clock()
        self._loop_started = time.monotonic()
        self._cpu_s = 0.0  # the sampling thread's own CPU time, as of its last loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="auditor-gpu", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self.sample_once()
            self._cpu_s = time.thread_time()  # this thread's CPU: the sampling's cost, cheaply
            if self._stop.wait(self._interval):
                return

    def sample_once(self) -> DeviceSample | None:
        """One read of the GPU; a failed read keeps the previous sample (its time shows its age)."""
        try:
            sample = self._source.sample(self.uuid)
        except Exception as exc:  # a failing read must not end the sampling
            with self._lock:
                self._errors += 1
                first = self._last_error is None
                self._last_error = f"{type(exc).__name__}: {exc}"
            if first:
                log.warning("auditor gpu monitor %s: sampling failed: %s", self.uuid, exc)
            return None
        with self._lock:
            self._latest = sample
            self._samples += 1
        return sample

    def latest(self) -> DeviceSample | None:
        """The newest sample (None until the first read succeeded)."""
        with self._lock:
            return self._latest

    def info(self) -> dict[str, Any]:
        """Who and where this monitor is (``ray_node_id`` is None outside Ray)."""
        with self._lock:
            latest = self._latest
            samples, errors, last_error = self._samples, self._errors, self._last_error
        return {
            "node": self.node,
            "uuid": self.uuid,
            "index": latest.index if latest is not None else None,
            "model": latest.model if latest is not None else "",
            "source": self.spec,
            "interval_s": self._interval,
            "pid": os.getpid(),
            "ray_node_id": ray_node_id(),
            "started": self._started,
            "samples": samples,
            "errors": errors,
            "last_error": last_error,
            # The sampling thread's CPU seconds per wall second since it started (its cost).
            "sampling_cpu_s": round(self._cpu_s, 6),
            "sampling_cpu_per_s": round(
                self._cpu_s / max(time.monotonic() - self._loop_started, 1e-9), 6
            ),
        }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        close = getattr(self._source, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                pass


def ray_node_id() -> str | None:
    """The Ray node this process runs on, when it runs inside Ray."""
    ray = sys.modules.get("ray")  # not imported: not inside Ray (and no need to import it)
    if ray is None:
        return None
    try:
        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except Exception:
        pass
    return None


NO_DEVICES = "none"  # the device source that monitors no GPU (dcgm-exporter reads them)


def discover_devices(spec: str, node: str) -> tuple[list[DeviceIdentity], str | None]:
    """The GPUs ``spec`` finds on this node, and a note when it could not look.

    No NVML here (no driver, no GPU) is not an error: the node has no GPUs to monitor.
    ``none`` (``--gpu-source dcgm``: dcgm-exporter reads the GPUs) finds none, without looking.
    """
    if spec == NO_DEVICES:
        return [], None
    try:
        source = make_source(spec, node)
    except ValueError:
        raise  # a bad spec is the user's error, said at once
    except Exception as exc:
        return [], f"no GPU discovery on {node}: {type(exc).__name__}: {exc}"
    try:
        return list(source.devices()), None
    except Exception as exc:
        return [], f"no GPUs found on {node}: {exc}"
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                pass


def pull_latest(monitors: Mapping[str, Any], timeout_s: float) -> dict[str, DeviceSample | None]:
    """The latest sample of each monitor by UUID; None where it failed, timed out or has none.

    A monitor is either a Ray actor handle (``latest.remote()``; all are asked at once and waited
    for together, at most ``timeout_s`` in all) or a local object with ``latest()``.
    """
    out: dict[str, DeviceSample | None] = {}
    refs: dict[str, Any] = {}
    for uuid, monitor in monitors.items():
        method = monitor.latest
        if hasattr(method, "remote"):
            try:
                refs[uuid] = method.remote()
            except Exception:
                out[uuid] = None
        else:
            try:
                out[uuid] = method()
            except Exception:
                out[uuid] = None
    if refs:
        import ray

        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        for uuid, ref in refs.items():
            if ref not in done:
                out[uuid] = None
                continue
            try:
                got = ray.get(ref, timeout=0)
                out[uuid] = got if isinstance(got, DeviceSample) else None
            except Exception:  # RayActorError: died or restarting
                out[uuid] = None
    return out


def ray_actor_class() -> Any:
    """The monitor as a Ray actor class (Ray imported lazily)."""
    import ray

    return ray.remote(**MONITOR_OPTIONS)(GpuMonitorCore)


_ACTOR_CLASS: Any = None


def start_monitor(
    node_id: str,
    *,
    source_spec: str,
    node: str,
    uuid: str,
    interval_s: float = 1.0,
    name: str | None = None,
) -> Any:
    """A GpuMonitor actor for GPU ``uuid`` on Ray node ``node_id`` (hard node affinity); ``name``
    makes it a named actor (a second one for the same GPU then fails to start)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        _ACTOR_CLASS = ray_actor_class()
    opts: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    }
    if name:
        opts["name"] = name
    return _ACTOR_CLASS.options(**opts).remote(
        source_spec=source_spec, node=node, uuid=uuid, interval_s=interval_s
    )
