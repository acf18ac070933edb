"""Options: each one a command-line flag and its ``AUDITOR_*`` environment twin.

An option table is the single source: the parser, the environment twins and the help text are
all generated from it (as torchrun does with its ``env`` action). :func:`resolve` reads the
command line first, then the twin, then the default, and types and checks the value; a wrong
value is a :class:`ConfigError` naming the flag or the variable it came from.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from auditor.configs import ConfigError, Overrides


@dataclass(frozen=True)
class Option:
    flag: str
    dest: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    is_flag: bool = False
    # Given more than once on the command line, every value applies (joined with commas, as
    # the environment twin writes several); otherwise the last one would silently win.
    repeat: bool = False

    @property
    def env(self) -> str:
        return "AUDITOR_" + self.dest.upper()

    def help_line(self) -> str:
        """The help text, ending with the default and the twin: "... (default: 10.0; env
        AUDITOR_WINDOW)". A default spelled out in the text ("(default: script name)") is moved
        there, so every option of every command ends the same way."""
        text, shown = self.help, _shown_default(self)
        spelled = _SPELLED_DEFAULT.search(text)
        if spelled:
            text, shown = text[: spelled.start()], spelled.group(1)
        # argparse %-formats help strings: a literal % must be doubled.
        return f"{text} (default: {shown}; env {self.env})".replace("%", "%%")


# A default the help text spells out in words, at its end: "... (default: the whole run)".
_SPELLED_DEFAULT = re.compile(r"\s*\(default: (.*)\)$")


def _shown_default(opt: Option) -> str:
    if opt.is_flag:
        return "on" if opt.default else "off"
    return "none" if opt.default is None else str(opt.default)


# --- value types: each takes the text and returns the value, or raises ValueError --------------


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"port out of range: {value}")
    return value


def positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError(f"must be positive: {text}")
    return value


def non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must not be negative: {text}")
    return value


def finite_positive(text: str) -> float:
    """Seconds of a recording to judge: a finite positive number."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be positive: {text}")
    return value


def niceness(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 19:
        raise ValueError(f"niceness must be 0 to 19: {value}")
    return value


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


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


def gpu_source(text: str) -> str:
    """Where GPU figures come from: ``auditor`` (the auditor's own GpuMonitor actors) or
    ``dcgm`` (the node's dcgm-exporter, scraped by Prometheus: no monitors are started)."""
    spec = text.strip().lower()
    if spec not in ("auditor", "dcgm"):
        raise ValueError(f"expected 'auditor' or 'dcgm', got {text!r}")
    return spec


def serve_gpu_source(text: str) -> str:
    """``auto`` (both: the monitors' series where they exist, dcgm-exporter's for any other GPU),
    ``auditor`` or ``dcgm``."""
    spec = text.strip().lower()
    if spec not in ("auto", "auditor", "dcgm"):
        raise ValueError(f"expected 'auto', 'auditor' or 'dcgm', got {text!r}")
    return spec


def severity(text: str) -> str:
    """``--fail-on``: the least severe finding that fails the run."""
    from auditor.report.exit_status import FAIL_ON_SEVERITIES

    value = text.strip().lower()
    if value not in FAIL_ON_SEVERITIES:
        raise ValueError(f"expected {' or '.join(FAIL_ON_SEVERITIES)}, got {text!r}")
    return value


def json_destination(text: str) -> str | None:
    """``auditor run --json``: a file, or ``-`` for stdout. The yes/no values ``AUDITOR_JSON``
    took when ``--json`` was a switch keep their meaning (yes: stdout; no: none), so an
    environment set for ``auditor analyze --json`` never makes ``auditor run`` write a file
    named ``1``."""
    value = text.strip()
    low = value.lower()
    if low in ("1", "true", "yes", "on"):
        return "-"
    if low in ("", "0", "false", "no", "off"):
        return None
    return value


def url(text: str) -> str:
    """A Prometheus base URL, checked as the query client will use it."""
    from auditor.metrics.query import check_url

    return check_url(text)


# --- options shared by several commands ----------------------------------------------------------

SET = Option(
    "--set",
    "set",
    "rule thresholds, e.g. data_starvation.min_wait_ratio=0.3 (comma separated; given several "
    "times, all apply)",
    repeat=True,
)


FAIL_ON = Option(
    "--fail-on",
    "fail_on",
    "exit 3 when the verdict has a finding this severe or worse (warning or critical) and "
    "nothing else failed (default: never)",
    severity,
)

# --- the parser and the values ------------------------------------------------------------------


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option]) -> None:
    for opt in options:
        help_text = opt.help_line()
        if opt.is_flag:
            parser.add_argument(
                opt.flag, dest=opt.dest, action="store_true", default=None, help=help_text
            )
        else:
            parser.add_argument(
                opt.flag,
                dest=opt.dest,
                default=None,
                action="append" if opt.repeat else "store",
                help=help_text,
                metavar=opt.dest.upper(),
            )


def resolve(
    ns: argparse.Namespace, options: Sequence[Option], env: Mapping[str, str]
) -> dict[str, Any]:
    """Command line first, then the environment twin, then the default; values typed and checked."""
    out: dict[str, Any] = {}
    for opt in options:
        raw = getattr(ns, opt.dest, None)
        if isinstance(raw, list):  # a repeatable option given several times: all of it
            raw = ",".join(raw)
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
            out[opt.dest] = (boolean if opt.is_flag else opt.type)(raw)
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return out


def parse_overrides(text: str | None) -> Overrides:
    """``rule.threshold=value,...`` into ``{rule: {threshold: number}}``; rule and threshold
    names are checked here, so a typo is refused before anything starts."""
    from auditor.analysis.engine import check_overrides

    out: Overrides = {}
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
