"""``auditor probe-path``: the folder that opts a job into the probe via PYTHONPATH."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    sub.add_parser(
        "probe-path", help="print the folder that opts a job into the probe via PYTHONPATH"
    )


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "probe-path":
        return None
    from auditor.commands.probe_path import probe_path

    return probe_path()
