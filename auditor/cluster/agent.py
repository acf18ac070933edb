"""The node agent: rank intake, host sampling, GPU samples, and for ``auditor fleet`` the node's
Prometheus endpoint (an ``auditor run`` serves its endpoint from the driver, which judges the job:
:mod:`auditor.metrics.endpoint`).

:class:`NodeAgentCore` is plain Python so it can be tested without Ray; :func:`ray_actor_class`
makes it the ``NodeAgent`` Ray actor (``num_cpus=0, num_gpus=0``: it never takes a slot from
training). The driver (``auditor run``) pulls deltas with :meth:`NodeAgentCore.drain` about once
a second.

GPU samples flow monitor -> agent -> driver: once per sample interval the agent asks each of its
node's GPU monitors (:meth:`attach_gpus`) for their latest sample (:func:`pull_latest`, bounded by
a timeout), keeps it for the exporter and queues it for the next :meth:`drain`. A monitor that does
not answer (dead, restarting, too slow) leaves its GPU exported as ``auditor_gpu_up 0`` with the
last sample's timestamp: a GPU whose monitor is gone never reads as an idle GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from auditor.metrics.exporter import make_registry, serve, stop
from auditor.metrics.state import ExportState, GpuStatus, apply_batch
from auditor.samples import Batch, DeviceSample, NodeCpu, ProcessCpu
from auditor.telemetry.host import HostSampler

from .intake import RankIntake
from .monitor import pull_latest, ray_node_id

log = logging.getLogger(__name__)


class NodeAgentCore:
    """Everything one node contributes to a job's audit."""

    def __init__(
        self,
        *,
        job: str,
        sink_path: str | None,
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
        metrics_port_tries: int = 1,
        sample_interval_s: float = 1.0,
        gpu_timeout_s: float = 0.5,
        host: str | None = None,
        sampler: HostSampler | None = None,
        multi_job: bool = False,
    ) -> None:
        self.job = job
        self.node = host or socket.gethostname()
        self._sampler = sampler or HostSampler(host=self.node)
        # No sink path: no rank intake (GPUs and the host only). A fleet agent takes the ranks
        # of every job on its node (``multi_job``: rank numbers repeat across jobs).
        self._intake = (
            RankIntake(sink_path, on_workers=self._on_workers, multi_job=multi_job)
            if sink_path is not None
            else None
        )
        self._interval = sample_interval_s
        self._gpu_timeout = gpu_timeout_s
        self._metrics_host = metrics_host
        self._metrics_port = metrics_port
        self._metrics_port_tries = max(1, metrics_port_tries)
        self._monitors: dict[str, Any] = {}
        self._pending_devices: list[DeviceSample] = []
        self._server: Any = None
        self._bound_port: int | None = None
        self._lock = threading.Lock()
        self._pending_cpu: list[ProcessCpu] = []
        self._pending_nodes: list[NodeCpu] = []
        self._queued: list[Batch] = []
        self._state = ExportState(job=job, node=self.node)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        if self._intake is not None:
            self._intake.start()
        if self._metrics_port is not None:
            self._serve_metrics()
        self._thread = threading.Thread(target=self._sample_loop, name="auditor-host", daemon=True)
        self._thread.start()
        return self.address()

    def _serve_metrics(self) -> None:
        """Bind the endpoint: ``metrics_port`` (0: any free port), else the next ports up to
        ``metrics_port_tries`` (several agents of a test cluster share one host)."""
        assert self._metrics_port is not None
        registry = make_registry(lambda: self._state)
        tries = 1 if self._metrics_port == 0 else self._metrics_port_tries
        for i in range(tries):
            port = min(self._metrics_port + i, 65535)
            try:
                self._server, self._bound_port = serve(registry, host=self._metrics_host, port=port)
                return
            except OSError:
                if i == tries - 1:
                    raise

    def address(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "sink": self._intake.path if self._intake is not None else None,
            "metrics": None
            if self._bound_port is None
            else f"http://{self._metrics_host}:{self._bound_port}/metrics",
            "ray_node_id": ray_node_id(),
            "pid": os.getpid(),
        }

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 + self._gpu_timeout)
        if self._intake is not None:
            self._intake.stop()
        if self._server is not None:
            stop(self._server)
            self._server = None

    # --- data ------------------------------------------------------------------------------------
    def _on_workers(self, rank: int, pid: int, workers: tuple[int, ...]) -> None:
        with self._lock:
            self._sampler.set_workers(rank, pid, workers)

    def _sample_loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._sample_once()
            except Exception as exc:  # sampling must not kill the agent
                log.warning("auditor agent: host sampling failed: %s", exc)

    def _sample_once(self) -> None:
        # GPUs first and outside the lock: the pull may wait up to its timeout.
        self._pull_gpus()
        delta = self._drain_intake()
        with self._lock:
            for info in delta.infos:
                self._sampler.track(info.slot, info.pid)  # before sampling, so it counts now
            procs, node = self._sampler.sample()
            self._absorb(delta, procs, node)

    def _drain_intake(self) -> Batch:
        return self._intake.drain() if self._intake is not None else Batch()

    # --- GPUs ------------------------------------------------------------------------------------
    def attach_gpus(self, gpus: list[Any], monitors: Mapping[str, Any]) -> None:
        """This node's GPUs (identities: objects or dicts with index, uuid, model) and their
        monitors by UUID (Ray actor handles or local objects with ``latest()``). Replaces any
        earlier set; a GPU listed without a monitor is exported as down."""
        statuses: dict[str, GpuStatus] = {}
        for g in gpus:
            d = g if isinstance(g, dict) else dataclasses.asdict(g)
            uuid = str(d["uuid"])
            old = self._state.gpus.get(uuid)
            statuses[uuid] = GpuStatus(
                index=int(d["index"]),
                uuid=uuid,
                model=str(d.get("model") or ""),
                sample=old.sample if old is not None else None,
                up=False,
            )
        with self._lock:
            self._monitors = dict(monitors)
            self._state.gpus.clear()
            self._state.gpus.update(statuses)
        self._pull_gpus()  # exported at once, not a sample interval later

    def _pull_gpus(self) -> None:
        with self._lock:
            monitors = dict(self._monitors)
        if not monitors:
            return
        got = pull_latest(monitors, self._gpu_timeout)
        with self._lock:
            gpus = self._state.gpus
            for uuid, sample in got.items():
                old = gpus.get(uuid)
                if old is None:
                    continue  # detached while the pull ran
                if sample is None:
                    gpus[uuid] = dataclasses.replace(old, up=False)
                    continue
                fresh = old.sample is None or sample.time > old.sample.time
                if fresh:
                    self._pending_devices.append(sample)
                gpus[uuid] = dataclasses.replace(old, sample=sample, up=True)

    def gpus(self) -> dict[str, dict[str, Any]]:
        """Each GPU's index, up and last sample time, by UUID (for the fleet and tests)."""
        with self._lock:
            gpus = dict(self._state.gpus)
        return {
            u: {
                "index": g.index,
                "model": g.model,
                "up": g.up,
                "last_sample_time": g.sample.time if g.sample is not None else None,
            }
            for u, g in gpus.items()
        }

    def _absorb(self, delta: Batch, procs: list[ProcessCpu], node: NodeCpu | None) -> None:
        """Update the export state and queue everything for the next drain (lock held)."""
        for info in delta.infos:
            self._sampler.track(info.rank, info.pid)
        for r in delta.ended:
            self._sampler.forget(r)
        nodes = (node,) if node is not None else ()
        self._state = apply_batch(
            self._state, dataclasses.replace(delta, processes=tuple(procs), nodes=nodes)
        )
        self._pending_nodes.extend(nodes)
        self._pending_cpu.extend(procs)
        self._queued.append(delta)

    def drain(self) -> Batch:
        """Everything new since the last drain: rank infos, steps, process and node CPU, and
        the GPU samples pulled from the monitors (each sample once)."""
        with self._lock:
            # Pick up what arrived since the last host sample, so the driver is never a second late.
            self._absorb(self._drain_intake(), [], None)
            queued, self._queued = self._queued, []
            cpu, self._pending_cpu = self._pending_cpu, []
            nodes, self._pending_nodes = self._pending_nodes, []
            devices, self._pending_devices = self._pending_devices, []
        infos = {i.rank: i for b in queued for i in b.infos}
        return Batch(
            infos=tuple(infos.values()),
            steps=tuple(s for b in queued for s in b.steps),
            processes=tuple(cpu),
            nodes=tuple(nodes),
            devices=tuple(devices),
            ended=tuple(sorted({r for b in queued for r in b.ended})),
            memory=tuple(m for b in queued for m in b.memory),
            flops=tuple(f for b in queued for f in b.flops),
            died=tuple(sorted({r for b in queued for r in b.died})),
        )

    def ping(self) -> str:
        return self.node


def ray_actor_class() -> Any:
    """The agent as a Ray actor class (imported lazily: the probe side never imports Ray)."""
    import ray

    return ray.remote(num_cpus=0, num_gpus=0, max_restarts=0)(NodeAgentCore)
