"""The fleet: a NodeAgent and one GpuMonitor per GPU on every alive node of a Ray cluster.

``auditor fleet --address ADDR`` runs a :class:`Fleet` until SIGINT/SIGTERM. For each alive Ray
node it starts, pinned to that node with hard node affinity:

* a ``NodeAgent`` actor (:class:`~auditor.cluster.agent.NodeAgentCore`, no rank intake) serving
  the node's Prometheus endpoint (host CPU, and the GPUs below);
* one ``GpuMonitor`` actor per GPU the node's device source reports (a tiny pinned task asks the
  source on the node itself), each bound to its GPU by NVML UUID and handed to the agent, which
  pulls their samples once per sample interval.

A watcher re-reads ``ray.nodes()`` every ``watch_interval_s``: a node that joins gets its agent
and monitors, a node that died is dropped, an agent that died is started again (its monitors are
kept). Ray itself restarts a dead monitor (``max_restarts=-1``); meanwhile its agent exports the
GPU as ``auditor_gpu_up 0`` with the last sample's timestamp.

Every change of the endpoint list rewrites a Prometheus file-service-discovery JSON
(``[{"targets": ["host:port"], "labels": {}}]``, written to a temporary file and renamed over the
old one, so Prometheus never reads half a file). The entries carry no target labels: the series
carry ``node`` and ``auditor_job`` themselves, and under a default scrape config (honor_labels
false) a target label of the same name would rename the series' own to ``exported_node`` /
``exported_auditor_job`` (or overwrite an empty one, an unowned GPU's ``auditor_job``). A down
endpoint is named by ``instance``; AuditorExporterDown finds its node in its last series.

**Which name a Ray node has, and so which device samples it gets.** A node's auditor name is the
value of its custom resource ``auditor_node:<name>`` when it has one (``ray start
--resources='{"auditor_node:node-a": 1}'``; in tests ``Cluster.add_node(resources=...)``), else its
hostname. The device source is one spec for the whole fleet: ``nvml`` reads each node's own GPUs;
``recorded:/path/file.jsonl`` replays, on each node, the device samples whose ``node`` field is
that node's name (so the file must be readable on every node; a node the recording does not
mention gets no GPUs). Two alive nodes with the same name (several nodes on one host without the
resource) get their Ray node ID's first 8 characters appended to keep their series apart.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from auditor.files import write_text_atomic

from .monitor import discover_devices, start_monitor

log = logging.getLogger(__name__)

NODE_RESOURCE_PREFIX = "auditor_node:"
# How many ports above --metrics-port-base an agent tries (several nodes may share one host).
PORT_TRIES = 64


def _is_wildcard(host: str) -> bool:
    """An address that binds every interface (the unspecified IPv4 or IPv6 address, or none)."""
    bare = host.strip().strip("[]")
    if not bare:
        return True
    try:
        return ipaddress.ip_address(bare).is_unspecified
    except ValueError:
        return False  # a host name


# --- Prometheus file service discovery (shared with `auditor run --sd-file`) ---------------------
def sd_target(metrics_url: str, bind_host: str, reachable_host: str) -> str:
    """The ``host:port`` Prometheus scrapes for an endpoint served at ``metrics_url`` and bound to
    ``bind_host``: the bound address itself, unless it is a wildcard (every interface), then
    ``reachable_host`` (the node's IP or name). IPv6 addresses are bracketed."""
    hostport = metrics_url.split("://", 1)[-1].split("/", 1)[0]
    port = hostport.rsplit(":", 1)[1]
    host = reachable_host if _is_wildcard(bind_host) else bind_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def sd_entry(target: str) -> dict[str, Any]:
    """One file_sd entry: the ``host:port`` to scrape, without target labels. ``auditor_job``
    and ``node`` come with every series; a target label of either name would, under a default
    scrape (honor_labels false), rename the series' own to ``exported_*``."""
    return {"targets": [target], "labels": {}}


def sd_text(entries: Sequence[Mapping[str, Any]]) -> str:
    """A file_sd JSON document: ``[{"targets": ["host:port"], "labels": {...}}, ...]``."""
    return json.dumps(list(entries), indent=2) + "\n"


def write_sd_file(path: str, entries: Sequence[Mapping[str, Any]]) -> str:
    """Write the file_sd JSON atomically (Prometheus never reads half a file); returns the text."""
    text = sd_text(entries)
    write_text_atomic(path, text)
    return text


def remove_sd_file(path: str) -> None:
    """Remove an SD file so Prometheus stops scraping what it listed; absent already is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def primary_address() -> str:
    """This machine's address as other hosts see it, for an endpoint bound to every interface:
    the source IP of the default route (a UDP ``connect`` sends nothing, the way Ray finds a
    node's IP), else the hostname when there is no route or only loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never contacted
            ip = str(probe.getsockname()[0])
    except OSError:
        ip = ""
    if ip and not ipaddress.ip_address(ip).is_loopback and not _is_wildcard(ip):
        return ip
    return socket.gethostname()


def node_name(entry: Mapping[str, Any]) -> str:
    """A Ray node's auditor name: its ``auditor_node:<name>`` resource, else its hostname."""
    resources = entry.get("Resources") or {}
    for key in sorted(resources):
        if key.startswith(NODE_RESOURCE_PREFIX) and len(key) > len(NODE_RESOURCE_PREFIX):
            return key[len(NODE_RESOURCE_PREFIX) :]
    return str(entry.get("NodeManagerHostname") or entry.get("NodeID", "")[:12])


def alive_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()`` entries of the nodes alive now."""
    import ray

    return [dict(n) for n in ray.nodes() if n.get("Alive")]


def this_node_name() -> str:
    """The auditor name of the Ray node this driver runs on."""
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    for entry in ray.nodes():
        if entry.get("NodeID") == node_id:
            return node_name(entry)
    import socket

    return socket.gethostname()


def _discover_task(spec: str, node: str) -> tuple[list[dict[str, Any]], str | None]:
    """Runs on the node: its GPUs as the device source sees them there."""
    gpus, note = discover_devices(spec, node)
    return [{"index": g.index, "uuid": g.uuid, "model": g.model} for g in gpus], note


@dataclass
class NodeDeployment:
    """What the fleet runs on one Ray node."""

    node_id: str
    name: str
    ip: str
    agent: Any
    monitors: dict[str, Any] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    metrics_url: str | None = None
    target: str | None = None
    note: str | None = None


class Fleet:
    """Agents and GPU monitors on every alive node of the Ray cluster this process is connected
    to (``ray.init`` first). :meth:`start` deploys and starts the watcher; :meth:`stop` removes
    every actor it started and empties the service-discovery file."""

    def __init__(
        self,
        *,
        device_source: str = "nvml",
        sd_file: str | None = None,
        metrics_host: str = "127.0.0.1",
        metrics_port_base: int = 0,
        sample_interval_s: float = 1.0,
        monitor_interval_s: float | None = None,
        gpu_timeout_s: float = 0.5,
        watch_interval_s: float = 5.0,
        call_timeout_s: float = 60.0,
        name_actors: bool = True,
        rank_sink: str | None = None,
    ) -> None:
        import ray

        self._ray = ray
        # Where each node's agent takes the ranks of every job opted in without `auditor run`
        # (the probe's default socket path); None: GPUs and the host only.
        self.rank_sink = rank_sink
        self.device_source = device_source
        self.sd_file = sd_file
        self.metrics_host = metrics_host
        self.metrics_port_base = metrics_port_base
        self.sample_interval_s = sample_interval_s
        self.monitor_interval_s = monitor_interval_s or sample_interval_s
        self.gpu_timeout_s = gpu_timeout_s
        self.watch_interval_s = watch_interval_s
        self.call_timeout_s = call_timeout_s
        self.name_actors = name_actors
        self._deployments: dict[str, NodeDeployment] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sd_written: str | None = None
        self._discover = ray.remote(num_cpus=0, num_gpus=0, max_retries=0)(_discover_task)
        from .agent import ray_actor_class

        self._agent_cls = ray_actor_class()

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Fleet:
        self.reconcile()
        self._thread = threading.Thread(target=self._watch, name="auditor-fleet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching, stop and kill every agent and monitor, empty the SD file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.call_timeout_s)
            self._thread = None
        with self._lock:
            deployments = list(self._deployments.values())
            self._deployments.clear()
            stops = []
            for d in deployments:
                try:
                    stops.append(d.agent.stop.remote())
                except Exception:
                    pass
            if stops:
                try:
                    self._ray.wait(stops, num_returns=len(stops), timeout=10)
                except Exception:
                    pass
            for d in deployments:
                self._kill(d, monitors=True)
            self._write_sd()

    def _watch(self) -> None:
        while not self._stop.wait(self.watch_interval_s):
            try:
                self.reconcile()
            except Exception as exc:  # the watcher keeps going: the next round may succeed
                log.warning("auditor fleet: reconcile failed: %s", exc)

    # --- state ---------------------------------------------------------------------------------
    def deployments(self) -> dict[str, NodeDeployment]:
        """What runs on each node, by Ray node ID."""
        with self._lock:
            return dict(self._deployments)

    def targets(self) -> list[dict[str, Any]]:
        """The Prometheus file-SD entries: one per node with an endpoint, sorted by node name."""
        with self._lock:
            ds = sorted(self._deployments.values(), key=lambda d: (d.name, d.node_id))
        return [sd_entry(d.target) for d in ds if d.target]

    # --- reconciling ---------------------------------------------------------------------------
    def reconcile(self) -> dict[str, list[str]]:
        """Bring the actors in line with the alive nodes; returns the node names added, dropped
        and whose agent was started again."""
        with self._lock:
            nodes = {n["NodeID"]: n for n in alive_nodes()}
            changes: dict[str, list[str]] = {"added": [], "dropped": [], "restarted": []}
            for node_id in list(self._deployments):
                if node_id not in nodes:
                    d = self._deployments.pop(node_id)
                    self._kill(d, monitors=True)
                    changes["dropped"].append(d.name)
            for node_id in self._dead_agents():
                d = self._deployments[node_id]
                self._restart_agent(d)
                changes["restarted"].append(d.name)
            new = [n for node_id, n in nodes.items() if node_id not in self._deployments]
            for d in self._deploy(new):
                self._deployments[d.node_id] = d
                changes["added"].append(d.name)
            if any(changes.values()) or self._sd_written is None:
                self._write_sd()
            for what, names in changes.items():
                if names:
                    log.info("auditor fleet: %s %s", what, ", ".join(sorted(names)))
            return changes

    def _unique_name(self, entry: Mapping[str, Any], taken: set[str]) -> str:
        name = node_name(entry)
        if name in taken:
            name = f"{name}-{str(entry['NodeID'])[:8]}"
        return name

    def _agent_options(self, node_id: str) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts: dict[str, Any] = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        }
        if self.name_actors:
            opts["name"] = f"auditor-fleet-agent-{node_id}"
        return opts

    def _new_agent(self, node_id: str, name: str) -> Any:
        return self._agent_cls.options(**self._agent_options(node_id)).remote(
            job="",
            sink_path=self.rank_sink,
            multi_job=True,
            host=name,
            metrics_host=self.metrics_host,
            metrics_port=self.metrics_port_base,
            metrics_port_tries=PORT_TRIES,
            sample_interval_s=self.sample_interval_s,
            gpu_timeout_s=self.gpu_timeout_s,
        )

    def _deploy(self, entries: list[dict[str, Any]]) -> list[NodeDeployment]:
        """Agents, discovery and monitors for new nodes, all nodes in parallel."""
        if not entries:
            return []
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        taken = {d.name for d in self._deployments.values()}
        pending: list[tuple[NodeDeployment, Any, Any]] = []
        for entry in sorted(entries, key=node_name):
            node_id = str(entry["NodeID"])
            name = self._unique_name(entry, taken)
            taken.add(name)
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            discover_ref = self._discover.options(scheduling_strategy=strategy).remote(
                self.device_source, name
            )
            agent = self._new_agent(node_id, name)
            d = NodeDeployment(
                node_id=node_id, name=name, ip=str(entry.get("NodeManagerAddress", "")), agent=agent
            )
            pending.append((d, discover_ref, agent.start.remote()))
        out: list[NodeDeployment] = []
        for d, discover_ref, start_ref in pending:
            try:
                d.gpus, d.note = ray.get(discover_ref, timeout=self.call_timeout_s)
                if d.note:
                    log.info("auditor fleet: %s", d.note)
                for g in d.gpus:
                    d.monitors[g["uuid"]] = self._new_monitor(d, g["uuid"])
                self._set_address(d, ray.get(start_ref, timeout=self.call_timeout_s))
                ray.get(d.agent.attach_gpus.remote(d.gpus, d.monitors), timeout=self.call_timeout_s)
            except Exception as exc:
                # The node may have died meanwhile: leave it out, the next round tries again.
                log.warning("auditor fleet: could not deploy on node %s: %s", d.name, exc)
                self._kill(d, monitors=True)
                continue
            out.append(d)
        return out

    def _new_monitor(self, d: NodeDeployment, uuid: str) -> Any:
        name = f"auditor-fleet-gpu-{uuid}" if self.name_actors else None
        return start_monitor(
            d.node_id,
            source_spec=self.device_source,
            node=d.name,
            uuid=uuid,
            interval_s=self.monitor_interval_s,
            name=name,
        )

    def _set_address(self, d: NodeDeployment, address: Mapping[str, Any]) -> None:
        url = address.get("metrics")
        d.metrics_url = str(url) if url else None
        d.target = sd_target(str(url), self.metrics_host, d.ip) if url else None

    def _dead_agents(self) -> list[str]:
        """Nodes whose agent died (a ping that fails with an actor error; slow is not dead)."""
        ray = self._ray
        pings = {}
        for node_id, d in self._deployments.items():
            try:
                pings[node_id] = d.agent.ping.remote()
            except Exception:
                pass
        if not pings:
            return []
        ready, _ = ray.wait(list(pings.values()), num_returns=len(pings), timeout=10)
        done = set(ready)
        dead = []
        for node_id, ref in pings.items():
            if ref not in done:
                continue
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError:
                dead.append(node_id)
            except Exception:
                pass
        return dead

    def _restart_agent(self, d: NodeDeployment) -> None:
        ray = self._ray
        try:
            ray.kill(d.agent, no_restart=True)
        except Exception:
            pass
        try:
            d.agent = self._new_agent(d.node_id, d.name)
            self._set_address(d, ray.get(d.agent.start.remote(), timeout=self.call_timeout_s))
            ray.get(d.agent.attach_gpus.remote(d.gpus, d.monitors), timeout=self.call_timeout_s)
        except Exception as exc:
            log.warning("auditor fleet: could not restart the agent on %s: %s", d.name, exc)
            d.target = d.metrics_url = None

    def _kill(self, d: NodeDeployment, *, monitors: bool) -> None:
        handles = [d.agent, *(d.monitors.values() if monitors else ())]
        for h in handles:
            try:
                self._ray.kill(h, no_restart=True)
            except Exception:
                pass

    # --- service discovery -----------------------------------------------------------------------
    def _write_sd(self) -> None:
        """Rewrite the SD file when its content changed (temporary file + rename: atomic)."""
        if not self.sd_file:
            self._sd_written = ""
            return
        entries = self.targets()
        if sd_text(entries) == self._sd_written:
            return
        self._sd_written = write_sd_file(self.sd_file, entries)
