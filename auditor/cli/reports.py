"""``auditor analyze``, ``auditor report`` and ``auditor compare``: recordings and reports.

auditor analyze RECORDING [--window S] [--set R.T=V,...] [--json] [--html PATH] [--fail-on SEV]
    re-run the rules on a recording (``auditor run --record``) and print the verdict; with
    --fail-on, exit 3 when the verdict has a finding that severe (as ``auditor run``)
auditor report INPUT --html PATH [--window S] [--set R.T=V,...] [--json]
    write the self-contained HTML report of a recording (or of a JSON report)
auditor compare BEFORE AFTER [--json]
    two runs side by side (each a JSON report or a recording): the measured speed-up against the
    one BEFORE's verdict predicted, and the findings that went, came or remain

Every option also reads its ``AUDITOR_*`` twin (``AUDITOR_WINDOW``, ``AUDITOR_SET``,
``AUDITOR_JSON``, ``AUDITOR_HTML``); the command line wins over the environment. What the
commands do is :mod:`auditor.commands.reports`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from auditor.configs import AnalysisConfig, CompareConfig, ConfigError

from .options import (
    FAIL_ON,
    SET,
    Option,
    add_options,
    boolean,
    finite_positive,
    parse_overrides,
    resolve,
)

COMMANDS = ("analyze", "report", "compare")

_WINDOW = Option(
    "--window",
    "window",
    "judge only the last WINDOW seconds of the recording (default: the whole run)",
    finite_positive,
)
_JSON = Option("--json", "json", "print the report as JSON on stdout", boolean, False, True)

ANALYZE_OPTIONS: tuple[Option, ...] = (
    _WINDOW,
    SET,
    _JSON,
    Option("--html", "html", "also write the HTML report here"),
    FAIL_ON,
)
REPORT_OPTIONS: tuple[Option, ...] = (
    Option("--html", "html", "write the HTML report here (required)"),
    _WINDOW,
    SET,
    _JSON,
)
COMPARE_OPTIONS: tuple[Option, ...] = (
    Option("--json", "json", "print the comparison as JSON on stdout", boolean, False, True),
)


def analyze_config(ns: argparse.Namespace, env: Mapping[str, str]) -> AnalysisConfig:
    values = resolve(ns, ANALYZE_OPTIONS, env)
    return AnalysisConfig(
        input=ns.recording, overrides=parse_overrides(values.get("set")), **values
    )


def report_config(ns: argparse.Namespace, env: Mapping[str, str]) -> AnalysisConfig:
    values = resolve(ns, REPORT_OPTIONS, env)
    if not values.get("html"):
        raise ConfigError("--html is required: where to write the HTML report")
    return AnalysisConfig(input=ns.input, overrides=parse_overrides(values.get("set")), **values)


def compare_config(ns: argparse.Namespace, env: Mapping[str, str]) -> CompareConfig:
    return CompareConfig(before=ns.before, after=ns.after, **resolve(ns, COMPARE_OPTIONS, env))


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Adds ``analyze``, ``report`` and ``compare`` to the CLI's subparsers."""
    p = sub.add_parser(
        "analyze",
        help="re-run the rules on a recording and print the verdict",
        usage="auditor analyze RECORDING [--window S] [--set R.T=V,...] [--json] [--html PATH] "
        "[--fail-on SEVERITY]",
        description="Re-run the rules on a recording made with 'auditor run --record' and print "
        "the same verdict the live run prints. Unreadable lines are named and skipped.",
        epilog="Exit status: 0; 1 when the recording holds no sample; 3 when --fail-on found a "
        "finding that severe; 2 for a usage error or an unusable input.",
    )
    p.add_argument(
        "recording", metavar="RECORDING", help="a recording (auditor.recording/v2 or v1)"
    )
    add_options(p, ANALYZE_OPTIONS)

    p = sub.add_parser(
        "report",
        help="write the self-contained HTML report of a recording or a JSON report",
        usage="auditor report INPUT --html PATH [--window S] [--set R.T=V,...] [--json]",
        description="Write one self-contained HTML file (it opens offline) with the verdict, "
        "per-rank fixes and plots. INPUT is a recording or a JSON report; a JSON report has "
        "no samples over time, so its page shows the verdict and the step breakdown only.",
    )
    p.add_argument("input", metavar="INPUT", help="a recording or a JSON report")
    add_options(p, REPORT_OPTIONS)

    p = sub.add_parser(
        "compare",
        help="compare two runs: measured against predicted speed-up, findings gone or new",
        usage="auditor compare BEFORE AFTER [--json]",
        description="Compare two runs, each a JSON report or a recording: per-rank step time "
        "and phase shares, findings that went, came or remain, and the measured speed-up "
        "against the one BEFORE's findings predicted.",
    )
    p.add_argument("before", metavar="BEFORE", help="JSON report or recording of the first run")
    p.add_argument("after", metavar="AFTER", help="JSON report or recording of the second run")
    add_options(p, COMPARE_OPTIONS)


def dispatch(
    ns: argparse.Namespace,
    command: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int | None:
    """Runs ``ns.cmd`` if it is one of this module's commands; None otherwise. ``env`` holds
    the ``AUDITOR_*`` twins (default: this process's environment)."""
    cmd = getattr(ns, "cmd", None)
    if cmd not in COMMANDS:
        return None
    from auditor.commands.reports import InputError, analyze, compare, report

    out = out or sys.stdout
    err = err or sys.stderr
    env = os.environ if env is None else env
    try:
        if cmd == "analyze":
            return analyze(analyze_config(ns, env), out=out, err=err)
        if cmd == "report":
            return report(report_config(ns, env), out=out, err=err)
        return compare(compare_config(ns, env), out=out, err=err)
    except (InputError, ConfigError) as exc:
        print(f"auditor: error: {exc}", file=err)
        return 2
    except BrokenPipeError:
        # The reader went away (``auditor analyze R | head``): nothing more to say.
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
