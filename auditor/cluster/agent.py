"""The node agent: rank intake, host sampling and the node's Prometheus endpoint.

:class:`NodeAgentCore` is plain Python so it can be tested without Ray; :data:`NodeAgent` is the
same class as a Ray actor (``num_cpus=0, num_gpus=0``: it never takes a slot from training).
The driver (``auditor run``) pulls deltas with :meth:`NodeAgentCore.drain` about once a second.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from auditor.analysis.findings import Finding
from auditor.metrics.exporter import make_registry, serve, stop
from auditor.metrics.state import ExportState, RankTotals
from auditor.samples import Batch, NodeCpu, ProcessCpu
from auditor.telemetry.host import HostSampler

from .intake import RankIntake

log = logging.getLogger(__name__)


class NodeAgentCore:
    """Everything one node contributes to a job's audit."""

    def __init__(
        self,
        *,
        job: str,
        sink_path: str,
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
        sample_interval_s: float = 1.0,
        host: str | None = None,
        sampler: HostSampler | None = None,
    ) -> None:
        self.job = job
        self.node = host or socket.gethostname()
        self._sampler = sampler or HostSampler(host=self.node)
        self._intake = RankIntake(sink_path, on_workers=self._on_workers)
        self._interval = sample_interval_s
        self._metrics_host = metrics_host
        self._metrics_port = metrics_port
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
        self._intake.start()
        if self._metrics_port is not None:
            registry = make_registry(lambda: self._state)
            self._server, self._bound_port = serve(
                registry, host=self._metrics_host, port=self._metrics_port
            )
        self._thread = threading.Thread(target=self._sample_loop, name="auditor-host", daemon=True)
        self._thread.start()
        return self.address()

    def address(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "sink": self._intake.path,
            "metrics": None
            if self._bound_port is None
            else f"http://{self._metrics_host}:{self._bound_port}/metrics",
        }

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
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
        delta = self._intake.drain()
        with self._lock:
            for info in delta.infos:
                self._sampler.track(info.rank, info.pid)  # before sampling, so it counts now
            procs, node = self._sampler.sample()
            self._absorb(delta, procs, node)

    def _absorb(self, delta: Batch, procs: list[ProcessCpu], node: NodeCpu | None) -> None:
        """Update the export state and queue everything for the next drain (lock held)."""
        st = self._state
        for info in delta.infos:
            st.infos[info.rank] = info
            st.ended.discard(info.rank)
            self._sampler.track(info.rank, info.pid)
        for s in delta.steps:
            st.totals.setdefault(s.rank, RankTotals()).add(s)
        for c in procs:
            st.cpu[c.rank] = c
        st.ended.update(delta.ended)
        for r in delta.ended:
            self._sampler.forget(r)
        if node is not None:
            self._state = ExportState(
                job=st.job,
                node=st.node,
                infos=st.infos,
                totals=st.totals,
                cpu=st.cpu,
                node_cpu=node,
                ended=st.ended,
                findings=st.findings,
            )
            self._pending_nodes.append(node)
        self._pending_cpu.extend(procs)
        self._queued.append(delta)

    def drain(self) -> Batch:
        """Everything new since the last drain: rank infos, steps, process and node CPU."""
        with self._lock:
            # Pick up what arrived since the last host sample, so the driver is never a second late.
            self._absorb(self._intake.drain(), [], None)
            queued, self._queued = self._queued, []
            cpu, self._pending_cpu = self._pending_cpu, []
            nodes, self._pending_nodes = self._pending_nodes, []
        infos = {i.rank: i for b in queued for i in b.infos}
        return Batch(
            infos=tuple(infos.values()),
            steps=tuple(s for b in queued for s in b.steps),
            processes=tuple(cpu),
            nodes=tuple(nodes),
            ended=tuple(sorted({r for b in queued for r in b.ended})),
        )

    def set_findings(self, findings: list[dict[str, Any]]) -> None:
        """The driver's latest verdict, exported as ``auditor_finding`` series."""
        parsed = [Finding.from_dict(f) for f in findings]
        with self._lock:
            self._state.findings[:] = parsed

    def ping(self) -> str:
        return self.node


def ray_actor_class() -> Any:
    """The agent as a Ray actor class (imported lazily: the probe side never imports Ray)."""
    import ray

    return ray.remote(num_cpus=0, num_gpus=0, max_restarts=0)(NodeAgentCore)
