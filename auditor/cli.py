"""``auditor``: the command line. ``main(argv) -> int``; errors are one clear line and exit 2.

auditor run [options] -- COMMAND...     audit a training job (normally torchrun ... train.py)
auditor fleet --address ADDR [options]  agents and GPU monitors on every node of a Ray cluster
auditor doctor [--json]                 check what this machine can measure
auditor probe-path                      the folder to put on PYTHONPATH to opt a job in
auditor analyze RECORDING               the verdict of a recorded run (--json, --html)
auditor report RECORDING --html PATH    a self-contained HTML report of a recording or report
auditor compare BEFORE AFTER            two runs side by side: findings gone, measured speed-up
auditor serve --prometheus-url URL      audit every running job from Prometheus, export findings
auditor dashboards render|push          regenerate the Grafana dashboards and rules; upload them
auditor replay RECORDING                serve a recording as a live node endpoint (demos, tests)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import NoReturn, TextIO

from . import __version__
from .config import (
    DOCTOR_OPTIONS,
    FLEET_OPTIONS,
    RUN_OPTIONS,
    ConfigError,
    FleetConfig,
    add_options,
    fleet_config,
    resolve,
    run_config,
)
from .metrics import commands as metrics_commands
from .ops import commands as ops_commands
from .report import commands as report_commands
from .service import commands as service_commands

# Subcommands owned by their layers: each module adds its parsers and dispatches its own names
# (returning None for a name it does not own).
COMMAND_MODULES = (report_commands, service_commands, ops_commands, metrics_commands)


class UsageError(Exception):
    """Bad command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="auditor", description="Audit multi-GPU PyTorch training while it runs.")
    parser.add_argument("--version", action="version", version=f"auditor {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser(
        "run",
        help="run a training command under the auditor",
        usage="auditor run [options] -- COMMAND [ARGS...]",
        description="Run COMMAND (e.g. torchrun --nproc_per_node=2 train.py) with the probe in "
        "every rank; print a live per-rank table and a verdict with per-rank fixes.",
    )
    add_options(run, RUN_OPTIONS)
    fleet = sub.add_parser(
        "fleet",
        help="run a node agent and GPU monitors on every node of a Ray cluster",
        description="Start a NodeAgent (Prometheus endpoint) and one GpuMonitor per GPU on every "
        "alive node of the Ray cluster at --address, follow nodes joining and leaving, keep a "
        "Prometheus file-SD list of the endpoints; runs until SIGINT/SIGTERM, then removes them.",
    )
    add_options(fleet, FLEET_OPTIONS)
    doctor = sub.add_parser(
        "doctor",
        help="check NVML, Ray, Prometheus and the probe on this machine",
        description="Check what the auditor can measure here and say what is missing.",
    )
    add_options(doctor, DOCTOR_OPTIONS)
    sub.add_parser(
        "probe-path", help="print the folder that opts a job into the probe via PYTHONPATH"
    )
    for module in COMMAND_MODULES:
        module.add_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    # The user's command is taken whole, after "--", so its flags are never ours.
    command: list[str] = []
    if "--" in args:
        i = args.index("--")
        args, command = args[:i], args[i + 1 :]
    try:
        ns = build_parser().parse_args(args)
        if ns.cmd is None:
            raise UsageError(
                "missing command: try 'auditor run -- torchrun train.py' or 'auditor --help'"
            )
        if ns.cmd == "fleet":
            if command:
                raise UsageError("auditor fleet takes no command after --")
            return run_fleet(fleet_config(ns, os.environ))
        if ns.cmd == "doctor":
            if command:
                raise UsageError("auditor doctor takes no command after --")
            values = resolve(ns, DOCTOR_OPTIONS, os.environ)
            from .doctor import main as doctor_main

            return doctor_main(
                json_output=bool(values["json"]), prometheus_url=values["prometheus_url"]
            )
        if ns.cmd == "probe-path":
            from .session import BOOT_DIR

            print(BOOT_DIR)
            return 0
        if ns.cmd == "run":
            cfg = run_config(ns, command, os.environ)
            from .cluster.launcher import LaunchError
            from .session import run

            try:
                return run(cfg)
            except LaunchError as exc:
                raise UsageError(str(exc)) from None
        for module in COMMAND_MODULES:
            code = module.dispatch(ns)
            if code is not None:
                return code
        raise UsageError(f"unknown command: {ns.cmd}")
    except (UsageError, ConfigError) as exc:
        print(f"auditor: error: {exc}", file=sys.stderr)
        return 2


def run_fleet(cfg: FleetConfig, *, out: TextIO | None = None) -> int:
    """``auditor fleet``: deploy on every node, follow the cluster until SIGINT/SIGTERM, then
    remove every actor and empty the SD file."""
    out = out or sys.stderr
    import ray

    from .cluster.fleet import Fleet

    logging.basicConfig(level=logging.INFO, format="auditor: %(message)s")
    ray.init(
        address=cfg.address,
        namespace="auditor",
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    done = threading.Event()
    received: list[int] = []

    def handle(sig: int, frame: FrameType | None) -> None:
        received.append(sig)
        done.set()

    # After ray.init, which installs a SIGTERM handler of its own.
    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    fleet = Fleet(
        device_source=cfg.device_source,
        sd_file=cfg.sd_file,
        metrics_host=cfg.metrics_host,
        metrics_port_base=cfg.metrics_port_base,
        sample_interval_s=cfg.sample_interval,
        watch_interval_s=cfg.watch_interval,
        rank_sink=cfg.rank_sink_path,
    )
    try:
        fleet.start()
        for d in sorted(fleet.deployments().values(), key=lambda d: d.name):
            print(
                f"auditor: {d.name}: {len(d.monitors)} GPU monitor(s), metrics {d.metrics_url}",
                file=out,
                flush=True,
            )
        if cfg.sd_file:
            print(f"auditor: service discovery file {cfg.sd_file}", file=out, flush=True)
        if cfg.rank_sink_path:
            print(
                f"auditor: ranks of jobs run with AUDITOR_PROBE=1 report to {cfg.rank_sink_path} "
                "on each node",
                file=out,
                flush=True,
            )
        print("auditor: fleet running; Ctrl-C to stop", file=out, flush=True)
        while not done.wait(1.0):
            pass
    finally:
        fleet.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        ray.shutdown()
    print(f"auditor: fleet stopped ({len(received)} signal(s))", file=out, flush=True)
    return 0


def main_entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    main_entry()
