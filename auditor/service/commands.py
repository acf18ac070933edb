"""Placeholder: filled in by the owner of this layer's subcommands."""

from __future__ import annotations

import argparse


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Adds this layer's subcommands to the CLI's subparsers."""


def dispatch(ns: argparse.Namespace) -> int | None:
    """Runs ``ns.cmd`` if this module owns it; None otherwise."""
    return None
