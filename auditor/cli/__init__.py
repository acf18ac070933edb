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

This package owns every parser and every option's ``AUDITOR_*`` twin: one module per command
(or group of commands) holds its option table, its parser and the function that builds its
frozen config (:mod:`auditor.configs`) from argv and the environment; the command itself is a
plain function in :mod:`auditor.commands` that takes that config.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from auditor import __version__
from auditor.configs import ConfigError

from . import dashboards, doctor, fleet, probe_path, replay, reports, run, serve
from .usage import Parser, UsageError

# In the order ``auditor --help`` lists them. Each module adds its parsers and dispatches its own
# names (returning None for a name it does not own).
COMMAND_MODULES = (run, fleet, doctor, probe_path, reports, serve, dashboards, replay)

__all__ = ["UsageError", "build_parser", "main", "main_entry"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="auditor", description="Audit multi-GPU PyTorch training while it runs.")
    parser.add_argument("--version", action="version", version=f"auditor {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=Parser)
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
        for module in COMMAND_MODULES:
            code = module.dispatch(ns, command, os.environ)
            if code is not None:
                return code
        raise UsageError(f"unknown command: {ns.cmd}")
    except (UsageError, ConfigError) as exc:
        print(f"auditor: error: {exc}", file=sys.stderr)
        return 2


def main_entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    main_entry()
