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
    Option(
        "--metrics-port",
        "metrics_port",
        "serve Prometheus metrics on this port (0: any free)",
        _port,
    ),
    Option(
        "--metrics-host", "metrics_host", "address the metrics endpoint binds", str, "127.0.0.1"
    ),
    Option("--address", "address", "join this Ray cluster instead of starting a local one"),
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
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    address: str | None = None
    window: float = 10.0
    live_interval: float = 1.0
    job: str | None = None
    grace: float = 10.0
    ray_temp_dir: str | None = None
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
    """``rule.threshold=value,...`` into ``{rule: {threshold: number}}``."""
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
    return out


def run_config(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> RunConfig:
    values = resolve(ns, RUN_OPTIONS, env)
    overrides = parse_overrides(values.get("set"))
    return RunConfig(command=tuple(command), overrides=overrides, **values)
