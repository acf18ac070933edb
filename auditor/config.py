"""Typed, frozen configuration built from argv; every option also an ``AUDITOR_*`` variable.

The option table below is the single source: the parser, the environment twins and the help
text are all generated from it (as torchrun does with its ``env`` action).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A wrong option or value; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True)
class Option:
    flag: str
    dest: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    is_flag: bool = False

    @property
    def env(self) -> str:
        return "AUDITOR_" + self.dest.upper()


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"port out of range: {value}")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"must be positive: {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must not be negative: {text}")
    return value


def device_source(text: str) -> str:
    """``nvml`` or ``recorded:<path>`` (the file must exist here; with ``auditor fleet`` it must
    also exist at that path on every node)."""
    spec = text.strip()
    if spec == "nvml":
        return spec
    if spec.startswith("recorded:"):
        path = spec[len("recorded:") :].strip()
        if not path:
            raise ValueError("recorded: needs a file, e.g. recorded:/data/gpus.jsonl")
        if not os.path.isfile(path):
            raise ValueError(f"recording not found: {path}")
        return "recorded:" + os.path.abspath(path)
    raise ValueError(f"expected 'nvml' or 'recorded:<path>', got {text!r}")


def _niceness(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 19:
        raise ValueError(f"niceness must be 0 to 19: {value}")
    return value


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


RUN_OPTIONS: tuple[Option, ...] = (
    Option("--report", "report", "write the JSON report here (also when the job fails)"),
    Option("--record", "record", "write every sample seen to this recording (JSON lines)"),
    Option("--html", "html", "write a self-contained HTML report here"),
    Option(
        "--metrics-port",
        "metrics_port",
        "serve Prometheus metrics on this port (0: any free)",
        _port,
    ),
    Option(
        "--metrics-host", "metrics_host", "address the metrics endpoint binds", str, "127.0.0.1"
    ),
    Option(
        "--sd-file",
        "sd_file",
        "while the job runs, list its metrics endpoint in this Prometheus file_sd JSON (removed "
        "when the run ends); without --metrics-port it implies --metrics-port 0 (any free port)",
    ),
    Option("--address", "address", "join this Ray cluster instead of starting a local one"),
    Option(
        "--device-source",
        "device_source",
        "where GPU samples come from: nvml, or recorded:PATH (a recording to replay)",
        device_source,
        "nvml",
    ),
    Option("--window", "window", "seconds of samples each live verdict looks at", _positive, 10.0),
    Option(
        "--live-interval",
        "live_interval",
        "seconds between live table refreshes (0: off)",
        _non_negative,
        1.0,
    ),
    Option("--job", "job", "job name used in metrics and the report (default: script name)"),
    Option(
        "--grace",
        "grace",
        "seconds between SIGTERM and SIGKILL when stopping the job",
        _positive,
        10.0,
    ),
    Option("--ray-temp-dir", "ray_temp_dir", "temp dir of the embedded Ray (default: Ray's)"),
    Option(
        "--nice",
        "nice",
        "niceness the auditor's own processes take once the job has started (this process and "
        "the Ray it starts), so that they never compete with the job for its cores (0: as "
        "started)",
        _niceness,
        10,
    ),
    Option(
        "--set", "set", "rule thresholds, e.g. data_starvation.min_wait_ratio=0.3 (comma separated)"
    ),
    Option(
        "--no-ray",
        "no_ray",
        "run the node agent inside this process instead of a Ray actor",
        _bool,
        False,
        True,
    ),
    Option("--quiet", "quiet", "no live table; only the verdict", _bool, False, True),
    Option("--json", "json", "print the verdict as JSON on stdout", _bool, False, True),
)


@dataclass(frozen=True)
class RunConfig:
    command: tuple[str, ...]
    report: str | None = None
    record: str | None = None
    html: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    sd_file: str | None = None
    address: str | None = None
    device_source: str = "nvml"
    window: float = 10.0
    live_interval: float = 1.0
    job: str | None = None
    grace: float = 10.0
    ray_temp_dir: str | None = None
    nice: int = 10
    set: str | None = None
    no_ray: bool = False
    quiet: bool = False
    json: bool = False
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def job_name(self) -> str:
        if self.job:
            return self.job
        script = next((a for a in self.command[1:] if a.endswith(".py")), self.command[0])
        return os.path.splitext(os.path.basename(script))[0]


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
        _port,
        0,
    ),
    Option(
        "--sample-interval",
        "sample_interval",
        "seconds between GPU and host samples",
        _positive,
        1.0,
    ),
    Option(
        "--watch-interval",
        "watch_interval",
        "seconds between checks for nodes that joined or left",
        _positive,
        5.0,
    ),
    Option(
        "--rank-sink",
        "rank_sink",
        "socket each node's agent takes ranks on, from every job opted in with AUDITOR_PROBE=1 "
        "(default: the probe's default path; none: GPUs and the host only)",
    ),
)

DOCTOR_OPTIONS: tuple[Option, ...] = (
    Option("--json", "json", "print the checks as JSON", _bool, False, True),
    Option(
        "--prometheus-url",
        "prometheus_url",
        "also check this Prometheus server (e.g. http://127.0.0.1:9090)",
    ),
)


def _url(text: str) -> str:
    from auditor.metrics.query import check_url

    return check_url(text)


SERVE_OPTIONS: tuple[Option, ...] = (
    Option(
        "--prometheus-url",
        "prometheus_url",
        "the Prometheus server that scrapes the auditor's node endpoints",
        _url,
        "http://127.0.0.1:9090",
    ),
    Option("--host", "host", "address the service's HTTP endpoint binds", str, "127.0.0.1"),
    Option("--port", "port", "port of the service's HTTP endpoint (0: any free)", _port, 9410),
    Option("--interval", "interval", "seconds between evaluations", _positive, 15.0),
    Option("--window", "window", "seconds of samples each evaluation judges", _positive, 60.0),
    Option(
        "--stale-after",
        "stale_after",
        "a job whose ranks' endpoints were last seen longer ago than this is not running "
        "(default: max(30, window/2))",
        _positive,
    ),
    Option(
        "--query-timeout",
        "query_timeout",
        "seconds each Prometheus query may take",
        _positive,
        10.0,
    ),
    Option(
        "--max-backoff",
        "max_backoff",
        "longest wait between retries while Prometheus is unreachable (seconds)",
        _positive,
        60.0,
    ),
    Option(
        "--set", "set", "rule thresholds, e.g. data_starvation.min_wait_ratio=0.3 (comma separated)"
    ),
    Option(
        "--once",
        "once",
        "evaluate once, print the jobs and findings as JSON on stdout and exit "
        "(1 if Prometheus cannot be queried)",
        _bool,
        False,
        True,
    ),
)


@dataclass(frozen=True)
class ServeConfig:
    prometheus_url: str = "http://127.0.0.1:9090"
    host: str = "127.0.0.1"
    port: int = 9410
    interval: float = 15.0
    window: float = 60.0
    stale_after: float | None = None
    query_timeout: float = 10.0
    max_backoff: float = 60.0
    set: str | None = None
    once: bool = False
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)


def serve_config(ns: argparse.Namespace, env: Mapping[str, str]) -> ServeConfig:
    values = resolve(ns, SERVE_OPTIONS, env)
    return ServeConfig(overrides=parse_overrides(values.get("set")), **values)


@dataclass(frozen=True)
class FleetConfig:
    address: str
    device_source: str = "nvml"
    sd_file: str | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port_base: int = 0
    sample_interval: float = 1.0
    watch_interval: float = 5.0
    rank_sink: str | None = None

    @property
    def rank_sink_path(self) -> str | None:
        """The rank socket path, or None when turned off."""
        from auditor.probe.hooks import default_sink_path

        if self.rank_sink is None:
            return default_sink_path()
        return None if self.rank_sink.strip().lower() == "none" else self.rank_sink


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for opt in options:
        help_text = f"{opt.help} [{opt.env}]"
        if opt.is_flag:
            parser.add_argument(
                opt.flag, dest=opt.dest, action="store_true", default=None, help=help_text
            )
        else:
            parser.add_argument(
                opt.flag, dest=opt.dest, default=None, help=help_text, metavar=opt.dest.upper()
            )


def resolve(
    ns: argparse.Namespace, options: Sequence[Option], env: Mapping[str, str]
) -> dict[str, Any]:
    """Command line first, then the environment twin, then the default; values typed and checked."""
    out: dict[str, Any] = {}
    for opt in options:
        raw = getattr(ns, opt.dest, None)
        source = opt.flag
        if raw is None and opt.env in env:
            raw, source = env[opt.env], opt.env
        if raw is None:
            out[opt.dest] = opt.default
            continue
        if opt.is_flag and raw is True:
            out[opt.dest] = True
            continue
        try:
            out[opt.dest] = (_bool if opt.is_flag else opt.type)(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return out


def parse_overrides(text: str | None) -> dict[str, dict[str, Any]]:
    """``rule.threshold=value,...`` into ``{rule: {threshold: number}}``; rule and threshold
    names are checked here, so a typo is refused before anything starts."""
    from auditor.analysis.engine import check_overrides

    out: dict[str, dict[str, Any]] = {}
    if not text:
        return out
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        rule, dot, name = key.strip().partition(".")
        if not sep or not dot or not rule or not name:
            raise ConfigError(f"--set: expected rule.threshold=value, got {item!r}")
        try:
            number: Any = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise ConfigError(f"--set: {key} needs a number, got {value!r}") from None
        out.setdefault(rule, {})[name] = number
    try:
        check_overrides(out)
    except ValueError as exc:
        raise ConfigError(f"--set: {exc}") from None
    return out


def run_config(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> RunConfig:
    values = resolve(ns, RUN_OPTIONS, env)
    overrides = parse_overrides(values.get("set"))
    if values.get("sd_file") and values.get("metrics_port") is None:
        values["metrics_port"] = 0  # an SD file needs an endpoint to list: any free port
    return RunConfig(command=tuple(command), overrides=overrides, **values)


def fleet_config(ns: argparse.Namespace, env: Mapping[str, str]) -> FleetConfig:
    values = resolve(ns, FLEET_OPTIONS, env)
    if not values.get("address"):
        raise ConfigError("--address is required: the Ray cluster to run the fleet on")
    return FleetConfig(**values)
