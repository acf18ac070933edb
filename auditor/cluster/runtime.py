"""Ray for ``auditor run``: an existing cluster (``--address``, ``RAY_ADDRESS``, or the one ``ray
start`` recorded: :func:`auditor.cluster.address.resolve_cluster` decides), else an embedded
local Ray.

The node agent runs as a Ray actor pinned to the driver's node (node affinity, ``num_cpus=0``),
with one ``GpuMonitor`` actor per GPU of that node (see :mod:`auditor.cluster.monitor`): the GPUs
are discovered here, in the driver, with the run's device source (``--device-source``; ``nvml``
on a machine without NVIDIA driver finds none and starts no monitor). If the embedded Ray cannot
start, the same agent and monitors run inside the auditor's own process (``InProcessAgent``) so
the job is still audited; the report notes it. A cluster that was named and cannot be joined is
an error, never that fallback: its user expects the agent on that cluster.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from auditor.samples import Batch

from .address import RayCluster, host_port, tcp_reachable
from .agent import NodeAgentCore, ray_actor_class
from .launcher import LaunchError
from .monitor import GpuMonitorCore, discover_devices, start_monitor

log = logging.getLogger(__name__)


class AgentHandle(Protocol):
    def drain(self) -> Batch: ...

    def gpus(self) -> dict[str, dict[str, Any]]: ...

    def address(self) -> dict[str, Any]: ...

    def stop(self) -> None: ...


def _discover(spec: str, node: str) -> list[Any]:
    """This node's GPUs for ``spec``; none (logged) when the source cannot be read."""
    try:
        gpus, note = discover_devices(spec, node)
    except Exception as exc:
        log.warning("auditor: device source %r unusable: %s", spec, exc)
        return []
    if note:
        log.info("auditor: %s", note)
    return list(gpus)


class InProcessAgent:
    """The node agent in this process: for ``--no-ray`` and as the fallback when Ray fails.

    Its GPU monitors are :class:`GpuMonitorCore` threads in this process too."""

    def __init__(self, *, device_source: str = "nvml", **agent_kwargs: Any) -> None:
        self.core = NodeAgentCore(**agent_kwargs)
        self._address = self.core.start()
        self.monitors: dict[str, GpuMonitorCore] = {}
        gpus = _discover(device_source, self.core.node)
        for g in gpus:
            try:
                self.monitors[g.uuid] = GpuMonitorCore(
                    source_spec=device_source, node=self.core.node, uuid=g.uuid
                )
            except Exception as exc:
                log.warning("auditor: no monitor for GPU %s: %s", g.uuid, exc)
        if gpus:
            self.core.attach_gpus(gpus, self.monitors)

    def drain(self) -> Batch:
        return self.core.drain()

    def gpus(self) -> dict[str, dict[str, Any]]:
        return self.core.gpus()

    def address(self) -> dict[str, Any]:
        return self._address

    def stop(self) -> None:
        self.core.stop()
        for monitor in self.monitors.values():
            monitor.stop()


class RayAgent:
    """The node agent as a Ray actor on this node; starts or joins Ray."""

    def __init__(
        self,
        *,
        address: str | None,
        temp_dir: str | None,
        device_source: str = "nvml",
        call_timeout_s: float = 30.0,
        **agent_kwargs: Any,
    ) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self._ray = ray
        self._timeout = call_timeout_s
        self._owns_ray = False
        if not ray.is_initialized():
            if address:
                # Only what joining takes: resources belong to the cluster's nodes.
                ray.init(
                    address=address,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    namespace="auditor",
                )
            else:
                # A private single-node Ray for this run. Ray's gRPC servers listen on every
                # interface whatever the node address, so Ray's own token auth (on by default
                # since 2.60) is left as the user has it: the auditor never turns it off.
                # "local", never None: RAY_ADDRESS (or a recorded cluster) must not turn
                # this start into a join.
                ray.init(
                    address="local",
                    num_cpus=1,
                    num_gpus=0,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level=logging.ERROR,
                    _temp_dir=temp_dir,
                    _node_ip_address="127.0.0.1",
                    namespace="auditor",
                )
                self._owns_ray = True
        from .fleet import this_node_name

        node_id = ray.get_runtime_context().get_node_id()
        if agent_kwargs.get("host"):
            # A node named by the user (AUDITOR_NODE): the Ray node of that auditor name or
            # Ray node name. Two nodes on one machine share a hostname; the driver may have
            # attached to either raylet, the agent must run on the one named.
            node_id = ray_node_named(str(agent_kwargs["host"])) or node_id
        else:
            # The node's auditor name (its auditor_node:<name> resource, else the hostname):
            # the node label, and the node whose samples a recorded device source replays.
            agent_kwargs["host"] = this_node_name()
        self.ray_node_id = node_id
        node = str(agent_kwargs["host"])
        actor_cls = ray_actor_class()
        self._actor = actor_cls.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(**agent_kwargs)
        self.monitors: dict[str, Any] = {}
        gpus = _discover(device_source, node)
        for g in gpus:
            self.monitors[g.uuid] = start_monitor(
                node_id,
                source_spec=device_source,
                node=node,
                uuid=g.uuid,
                # Named in this run's own Ray only (a shared cluster may hold another run's):
                # whoever joins it can ask a monitor for its info() by its GPU.
                name=monitor_name(g.uuid) if self._owns_ray else None,
            )
        self._address = ray.get(self._actor.start.remote(), timeout=self._timeout)
        if gpus:
            ray.get(self._actor.attach_gpus.remote(gpus, self.monitors), timeout=self._timeout)

    def drain(self) -> Batch:
        result: Batch = self._ray.get(self._actor.drain.remote(), timeout=self._timeout)
        return result

    def gpus(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = self._ray.get(
            self._actor.gpus.remote(), timeout=self._timeout
        )
        return result

    def address(self) -> dict[str, Any]:
        return self._address

    def stop(self) -> None:
        ray = self._ray
        try:
            ray.get(self._actor.stop.remote(), timeout=5)
        except Exception:
            pass
        for handle in [self._actor, *self.monitors.values()]:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                pass
        if ray.is_initialized():
            if self._owns_ray:
                _end_autoscaler_monitor(ray)
            ray.shutdown()


def monitor_name(uuid: str) -> str:
    """The name of GPU ``uuid``'s monitor actor in an embedded Ray (namespace ``auditor``)."""
    return f"auditor-gpu-{uuid}"


def _end_autoscaler_monitor(ray: Any) -> None:
    """End the autoscaler monitor of the Ray this run started, before ``ray.shutdown``.

    ``ray.shutdown`` ends the node's processes one at a time, the GCS before the autoscaler
    monitor; the monitor's SIGTERM handler then tries to report its own death to the GCS that is
    already gone, and Ray waits its full second of grace before killing it: a second on every
    run's exit. A single-node Ray without an autoscaling config has nothing for the monitor to
    do, so it is ended at once here. Only a process below this one whose ``--gcs-address`` is
    this Ray's: never a cluster given with ``--address``."""
    try:
        import psutil

        gcs = str(ray.get_runtime_context().gcs_address)
        for proc in psutil.Process().children(recursive=True):
            try:
                cmd = proc.cmdline()
            except psutil.Error:
                continue
            if any(a.endswith("autoscaler/_private/monitor.py") for a in cmd) and (
                f"--gcs-address={gcs}" in cmd
            ):
                proc.kill()
                proc.wait(timeout=1)
    except Exception:  # ray.shutdown ends it anyway, only slower
        pass


def ray_node_named(name: str) -> str | None:
    """The id of the alive Ray node whose auditor name (``auditor_node:<name>`` resource) or
    Ray node name is ``name``; None when there is none."""
    import ray

    from .fleet import node_name

    for entry in ray.nodes():
        if entry.get("Alive") and name in (node_name(entry), entry.get("NodeName")):
            return str(entry["NodeID"])
    return None


def check_cluster(cluster: RayCluster, *, timeout_s: float = 3.0) -> None:
    """Refuse a named cluster that does not answer, before the job starts: ``ray.init`` would
    otherwise retry for minutes while the job runs unaudited."""
    hp = host_port(cluster.address)
    if hp is None:
        raise LaunchError(
            f"{cluster.source}: expected HOST:PORT of a Ray cluster, got {cluster.address!r}"
        )
    ok, detail = tcp_reachable(hp[0].strip("[]"), hp[1], timeout_s)
    if not ok:
        raise LaunchError(
            f"cannot reach the Ray cluster at {cluster.address} (from {cluster.source}): "
            f"{detail}; {_instead(cluster)}"
        )


def _instead(cluster: RayCluster) -> str:
    """What to do instead, for where the address came from."""
    if cluster.source == "--address":
        return "check the address"
    if cluster.source == "RAY_ADDRESS":
        return "fix RAY_ADDRESS, or set RAY_ADDRESS=local for a new local Ray"
    return "'ray stop' forgets it, or set RAY_ADDRESS=local for a new local Ray"


def start_agent(
    *,
    use_ray: bool,
    address: str | None,
    temp_dir: str | None,
    device_source: str = "nvml",
    **agent_kwargs: Any,
) -> tuple[AgentHandle, str | None]:
    """The agent (and GPU monitors) for this run, and a note when it had to fall back to
    running in-process."""
    if not use_ray:
        return InProcessAgent(device_source=device_source, **agent_kwargs), None
    try:
        agent = RayAgent(
            address=address, temp_dir=temp_dir, device_source=device_source, **agent_kwargs
        )
        return agent, None
    except Exception as exc:
        if address:
            raise
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except Exception:
            pass
        note = f"Ray could not start ({type(exc).__name__}: {exc}); the node agent ran in-process"
        return InProcessAgent(device_source=device_source, **agent_kwargs), note
