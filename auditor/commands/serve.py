"""``auditor serve``: the analysis service (:mod:`auditor.service`), run until stopped.

auditor serve [--prometheus-url URL] [--host 127.0.0.1] [--port 9410] [--interval 15]
              [--window 60] [--set R.T=V,...] [--once]

Runs until SIGINT or SIGTERM. A Prometheus that is down at start is not an error: the service
keeps retrying with backoff and says so (a service must survive its dependencies starting after
it). ``--once`` is for scripts and debugging: one evaluation, JSON on stdout, exit 1 if it failed.
The CLI (:mod:`auditor.cli.serve`) builds the :class:`ServeConfig` and calls :func:`serve`.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from types import FrameType
from typing import TextIO

from auditor.configs import ConfigError, ServeConfig
from auditor.metrics.query import PrometheusClient
from auditor.service.http import ServiceServer
from auditor.service.service import AuditService


def make_service(cfg: ServeConfig) -> AuditService:
    return AuditService(
        PrometheusClient(cfg.prometheus_url, timeout_s=cfg.query_timeout),
        window_s=cfg.window,
        interval_s=cfg.interval,
        stale_after_s=cfg.stale_after,
        max_backoff_s=cfg.max_backoff,
        overrides=cfg.overrides,
        gpu_source=cfg.gpu_source,
    )


def serve(cfg: ServeConfig, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    service = make_service(cfg)
    logger = logging.getLogger("auditor.serve")
    if cfg.once:
        # The outcome is printed below; the service's "retrying with backoff" warning would be
        # a second, wrong line (nothing retries). A bug's traceback (ERROR) still shows.
        level = logger.level
        logger.setLevel(logging.ERROR)
        try:
            published = service.evaluate()
        finally:
            logger.setLevel(level)
        health = published.health
        if health.last_success is None:
            print(f"auditor: error: {health.last_error}", file=err)
            return 1
        jobs = [r.to_dict() for _, r in sorted(published.results.items())]
        json.dump({"evaluated_at": health.last_success, "jobs": jobs}, out, indent=1)
        out.write("\n")
        return 0

    try:
        server = ServiceServer(
            lambda: service.published,
            host=cfg.host,
            port=cfg.port,
            clock=time.time,
            stale_after_s=max(3 * cfg.interval, 60.0),
        )
    except OSError as exc:
        raise ConfigError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}") from None
    # Configured only once the port is ours, and put back on the way out.
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("auditor serve: %(levelname)s %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    stop = threading.Event()

    def handle(sig: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    server.start()
    logger.info(
        "auditing jobs from %s every %g s over %g s windows; serving %s/metrics and "
        "%s/api/v1/findings",
        cfg.prometheus_url,
        cfg.interval,
        cfg.window,
        server.url,
        server.url,
    )
    try:
        service.run(stop)
    finally:
        server.stop()
        for sig, previous in old.items():
            signal.signal(sig, previous)
        logger.info("stopped")  # before the handler goes: afterwards nothing would print it
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
    return 0
