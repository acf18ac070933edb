"""``auditor``: the command line. ``main(argv) -> int``; errors are one clear line and exit 2.

auditor run [options] -- COMMAND...     audit a training job (normally torchrun ... train.py)
auditor probe-path                      the folder to put on PYTHONPATH to opt a job in
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from . import __version__
from .config import RUN_OPTIONS, ConfigError, add_options, run_config


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
    sub.add_parser(
        "probe-path", help="print the folder that opts a job into the probe via PYTHONPATH"
    )
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
        raise UsageError(f"unknown command: {ns.cmd}")
    except (UsageError, ConfigError) as exc:
        print(f"auditor: error: {exc}", file=sys.stderr)
        return 2


def main_entry() -> NoReturn:
    sys.exit(main())


if __name__ == "__main__":
    main_entry()
