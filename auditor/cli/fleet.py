"""``auditor fleet --address ADDR``: node agents and GPU monitors on every node of a Ray cluster."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from auditor.configs import ConfigError, FleetConfig

from .options import Option, add_options, device_source, gpu_source, port, positive, resolve
from .usage import UsageError

FLEET_OPTIONS: tuple[Option, ...] = (
    Option("--address", "address", "the Ray cluster to run on (e.g. 10.0.0.1:6379, or auto)"),
    Option(
        "--device-source",
        "device_source",
        "where GPU samples come from on every node: nvml, or recorded:PATH (a recording whose "
        "node fields name the Ray nodes' auditor_node:<name> resources)",
        device_source,
        "nvml",
    ),
    Option(
        "--gpu-source",
        "gpu_source",
        "GPU figures from: auditor (a GpuMonitor actor per GPU, NVML) or dcgm (the node's "
        "dcgm-exporter, scraped by Prometheus: no monitors; ranks still report their GPU "
        "UUIDs, the join)",
        gpu_source,
        "auditor",
    ),
    Option(
        "--sd-file",
        "sd_file",
        "write the Prometheus file-service-discovery JSON of every node's endpoint here",
    ),
    Option(
        "--metrics-host",
        "metrics_host",
        "address each node's metrics endpoint binds (0.0.0.0: every interface, SD lists node IPs)",
        str,
        "127.0.0.1",
    ),
    Option(
        "--metrics-port-base",
        "metrics_port_base",
        "first port each node's endpoint tries (0: any free port)",
        port,
        0,
    ),
    Option(
        "--sample-interval",
        "sample_interval",
        "seconds between GPU and host samples",
        positive,
        1.0,
    ),
    Option(
        "--watch-interval",
        "watch_interval",
        "seconds between checks for nodes that joined or left",
        positive,
        5.0,
    ),
    Option(
        "--rank-sink",
        "rank_sink",
        "socket each node's agent takes ranks on, from every job opted in with AUDITOR_PROBE=1 "
        "(default: the probe's default path; none: GPUs and the host only)",
    ),
)


def fleet_config(ns: argparse.Namespace, env: Mapping[str, str]) -> FleetConfig:
    values = resolve(ns, FLEET_OPTIONS, env)
    if not values.get("address"):
        raise ConfigError("--address is required: the Ray cluster to run the fleet on")
    return FleetConfig(**values)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet",
        help="run a node agent and GPU monitors on every node of a Ray cluster",
        description="Start a NodeAgent (Prometheus endpoint) and one GpuMonitor per GPU on every "
        "alive node of the Ray cluster at --address, follow nodes joining and leaving, keep a "
        "Prometheus file-SD list of the endpoints; runs until SIGINT/SIGTERM, then removes them.",
    )
    add_options(p, FLEET_OPTIONS)


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "fleet":
        return None
    if command:
        raise UsageError("auditor fleet takes no command after --")
    from auditor.commands.fleet import fleet

    return fleet(fleet_config(ns, env))
