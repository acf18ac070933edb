"""``auditor replay RECORDING``: a recording served as a live node endpoint."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from auditor.configs import ReplayConfig

from .options import Option, add_options, boolean, gpu_source, port, positive, resolve


def dcgm_counters(text: str) -> str:
    spec = text.strip().lower()
    if spec not in ("default", "auditor"):
        raise ValueError(f"expected 'default' or 'auditor', got {text!r}")
    return spec


REPLAY_OPTIONS: tuple[Option, ...] = (
    Option(
        "--metrics-host",
        "metrics_host",
        "address the metrics endpoint binds (0.0.0.0: every interface)",
        str,
        "127.0.0.1",
    ),
    Option("--metrics-port", "metrics_port", "port of the endpoint (0: any free)", port, 9400),
    Option("--speed", "speed", "play this many times faster than recorded", positive, 1.0),
    Option(
        "--loop",
        "loop",
        "start again at the end; counters keep growing across passes",
        boolean,
        False,
        True,
    ),
    Option("--job", "job", "training job to export as auditor_job (default: the recording's job)"),
    Option("--node", "node", "node of a multi-node recording to export (one per endpoint)"),
    Option(
        "--as-node", "as_node", "export the node under this name (several replays side by side)"
    ),
    Option(
        "--gpu-source",
        "gpu_source",
        "dcgm: serve the GPUs as dcgm-exporter does (DCGM_FI_* names, labels and units) on "
        "--dcgm-port, and no auditor_gpu_* series on the node endpoint; auditor: the node "
        "endpoint's own GPU series",
        gpu_source,
        "auditor",
    ),
    Option(
        "--dcgm-port", "dcgm_port", "port of the dcgm-exporter endpoint (0: any free)", port, 9401
    ),
    Option(
        "--dcgm-counters",
        "dcgm_counters",
        "dcgm fields served: default (dcgm-exporter's default counters) or auditor (those plus "
        "throttle reasons, maximum clocks, power limit and PCIe link: deploy/dcgm/counters.csv)",
        dcgm_counters,
        "auditor",
    ),
    Option(
        "--dcgm-hostname",
        "dcgm_hostname",
        "the Hostname label of the dcgm series (default: the exported node)",
    ),
)


def replay_config(ns: argparse.Namespace, env: Mapping[str, str]) -> ReplayConfig:
    return ReplayConfig(recording=ns.recording, **resolve(ns, REPLAY_OPTIONS, env))


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="serve a recording as a live node endpoint (demos, dashboards, tests)",
        description="Serve RECORDING's GPU, rank and host metrics in real time as a node agent "
        "would, timestamps shifted to now; runs until SIGINT/SIGTERM.",
    )
    p.add_argument("recording", metavar="RECORDING", help="an auditor recording (.jsonl)")
    add_options(p, REPLAY_OPTIONS)


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "replay":
        return None
    from auditor.commands.replay import replay

    return replay(replay_config(ns, env))
