"""``auditor fleet``: deploy on every node, follow the cluster until SIGINT/SIGTERM, then remove
every actor and empty the SD file. The CLI builds the :class:`FleetConfig`."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import TextIO

from auditor.configs import FleetConfig


def rank_sink_path(cfg: FleetConfig) -> str | None:
    """The rank socket path each node's agent listens on, or None when turned off."""
    from auditor.probe.probe import default_sink_path

    if cfg.rank_sink is None:
        return default_sink_path()
    return None if cfg.rank_sink.strip().lower() == "none" else cfg.rank_sink


def fleet(cfg: FleetConfig, *, out: TextIO | None = None) -> int:
    """``auditor fleet``: deploy on every node, follow the cluster until SIGINT/SIGTERM, then
    remove every actor and empty the SD file."""
    out = out or sys.stderr
    import ray

    from auditor.cluster.fleet import Fleet
    from auditor.cluster.monitor import NO_DEVICES

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

    rank_sink = rank_sink_path(cfg)
    # After ray.init, which installs a SIGTERM handler of its own.
    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    deployed = Fleet(
        device_source=NO_DEVICES if cfg.gpu_source == "dcgm" else cfg.device_source,
        sd_file=cfg.sd_file,
        metrics_host=cfg.metrics_host,
        metrics_port_base=cfg.metrics_port_base,
        sample_interval_s=cfg.sample_interval,
        watch_interval_s=cfg.watch_interval,
        rank_sink=rank_sink,
    )
    try:
        deployed.start()
        for d in sorted(deployed.deployments().values(), key=lambda d: d.name):
            print(
                f"auditor: {d.name}: {len(d.monitors)} GPU monitor(s), metrics {d.metrics_url}",
                file=out,
                flush=True,
            )
        if cfg.sd_file:
            print(f"auditor: service discovery file {cfg.sd_file}", file=out, flush=True)
        if rank_sink:
            print(
                f"auditor: ranks of jobs run with AUDITOR_PROBE=1 report to {rank_sink} "
                "on each node",
                file=out,
                flush=True,
            )
        print("auditor: fleet running; Ctrl-C to stop", file=out, flush=True)
        while not done.wait(1.0):
            pass
    finally:
        deployed.stop()
        for sig, handler in old.items():
            signal.signal(sig, handler)
        ray.shutdown()
    print(f"auditor: fleet stopped ({len(received)} signal(s))", file=out, flush=True)
    return 0
