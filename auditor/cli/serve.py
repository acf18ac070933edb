"""``auditor serve``: audit every running job from Prometheus and export the findings."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence

from auditor.configs import ServeConfig

from .options import (
    SET,
    Option,
    add_options,
    boolean,
    parse_overrides,
    port,
    positive,
    resolve,
    serve_gpu_source,
    url,
)
from .usage import UsageError

# What the [serve] extra installs: a training environment has neither (pyproject.toml).
SERVE_EXTRA = ("orjson", "numpy")

SERVE_OPTIONS: tuple[Option, ...] = (
    Option(
        "--prometheus-url",
        "prometheus_url",
        "the Prometheus server that scrapes the auditor's node endpoints",
        url,
        "http://127.0.0.1:9090",
    ),
    Option("--host", "host", "address the service's HTTP endpoint binds", str, "127.0.0.1"),
    Option("--port", "port", "port of the service's HTTP endpoint (0: any free)", port, 9410),
    Option("--interval", "interval", "seconds between evaluations", positive, 15.0),
    Option("--window", "window", "seconds of samples each evaluation judges", positive, 60.0),
    Option(
        "--gpu-source",
        "gpu_source",
        "GPU series to judge: auto (the auditor's monitors where they export a GPU, "
        "dcgm-exporter's DCGM_FI_* series for any other, joined to ranks by GPU UUID), "
        "auditor, or dcgm",
        serve_gpu_source,
        "auto",
    ),
    Option(
        "--stale-after",
        "stale_after",
        "a job whose ranks' endpoints were last seen longer ago than this is not running "
        "(default: max(30, window/2))",
        positive,
    ),
    Option(
        "--query-timeout",
        "query_timeout",
        "seconds each Prometheus query may take",
        positive,
        10.0,
    ),
    Option(
        "--max-backoff",
        "max_backoff",
        "longest wait between retries while Prometheus is unreachable (seconds)",
        positive,
        60.0,
    ),
    SET,
    Option(
        "--once",
        "once",
        "evaluate once, print the jobs and findings as JSON on stdout and exit "
        "(1 if Prometheus cannot be queried)",
        boolean,
        False,
        True,
    ),
)


def require_serve_extra() -> None:
    """A one-line error, not an ImportError's traceback, where the [serve] extra is missing.

    Checked before the options are read: --prometheus-url is checked by the query client, which
    imports them."""
    missing: list[str] = []
    for name in SERVE_EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(
            f"auditor serve needs {' and '.join(missing)}, which this environment lacks: "
            "pip install gpu-balance-auditor[serve]"
        )


def serve_config(ns: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    values = resolve(ns, SERVE_OPTIONS, env)
    return ServeConfig(overrides=parse_overrides(values.get("set")), **values)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="audit every running job from Prometheus and export the findings",
        description="Query Prometheus for the auditor's node metrics, rebuild every running job's "
        "snapshot over --window, run the same rules as 'auditor run' every --interval, and serve "
        "the findings on /metrics and as JSON on /api/v1/findings.",
    )
    add_options(p, SERVE_OPTIONS)


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "serve":
        return None
    require_serve_extra()
    from auditor.commands.serve import serve

    return serve(serve_config(ns, env))
