"""The operator-files commands: ``auditor dashboards render`` and ``auditor dashboards push``.

auditor dashboards render [--root DIR] [--check]
    write the generated dashboards, their provisioning and the Prometheus rules under DIR (the
    current directory by default); with --check write nothing, list the files that are missing or
    out of date and exit 1 if there are any (0 if none)
auditor dashboards push --grafana-url URL [--folder NAME] [--grafana-token-file PATH]
    upload the dashboards into a Grafana folder (created if missing), overwriting older versions;
    the token comes from AUDITOR_GRAFANA_TOKEN or from the token file, never from the command line

Every option also reads its ``AUDITOR_*`` twin. Exit status: 0 done; 1 stale files (--check) or
Grafana failed (unreachable, 401/403, error answers); 2 a usage error or no token.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from auditor.config import ConfigError, Option, add_options, resolve

RENDER_OPTIONS: tuple[Option, ...] = (
    Option(
        "--root",
        "dashboards_root",
        "repository root the files are written under (default: the current directory)",
    ),
    Option(
        "--check",
        "dashboards_check",
        "write nothing; list the generated files that are missing or out of date, exit 1 if any",
        str,
        False,
        True,
    ),
)

PUSH_OPTIONS: tuple[Option, ...] = (
    Option("--grafana-url", "grafana_url", "the Grafana to upload to, e.g. http://127.0.0.1:3000"),
    Option(
        "--folder",
        "grafana_folder",
        "Grafana folder for the dashboards (created if missing)",
        str,
        "GPU Balance Auditor",
    ),
    Option(
        "--grafana-token-file",
        "grafana_token_file",
        "file holding the Grafana service-account token (otherwise AUDITOR_GRAFANA_TOKEN)",
    ),
)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Adds ``dashboards render`` and ``dashboards push`` to the CLI's subparsers."""
    dashboards = sub.add_parser(
        "dashboards",
        help="regenerate the Grafana dashboards and Prometheus rules, or upload the dashboards",
        description="Grafana dashboards and Prometheus rules generated from code.",
    )
    inner = dashboards.add_subparsers(
        dest="dashboards_cmd", metavar="ACTION", parser_class=type(dashboards)
    )
    render = inner.add_parser(
        "render",
        help="write dashboards/, its provisioning and deploy/prometheus/rules/",
        description="Write the generated dashboards, provisioning files and Prometheus rules; "
        "with --check, only list the ones that are out of date (exit 1 if any).",
    )
    add_options(render, RENDER_OPTIONS)
    # No abbreviations: "--grafana-token SECRET" must be refused, not taken as an abbreviation
    # of --grafana-token-file (and the secret then named as a missing file).
    push = inner.add_parser(
        "push",
        allow_abbrev=False,
        help="upload the dashboards to a Grafana",
        description="Upload the dashboards into a Grafana folder, overwriting older versions. "
        "The token comes from AUDITOR_GRAFANA_TOKEN or --grafana-token-file, never from the "
        "command line.",
    )
    add_options(push, PUSH_OPTIONS)
    # Caught so that it is refused with a message that does not repeat the value (argparse's
    # "unrecognized arguments" would print the token back).
    push.add_argument("--grafana-token", dest="grafana_token_argv", help=argparse.SUPPRESS)


def dispatch(ns: argparse.Namespace) -> int | None:
    """Runs ``ns.cmd`` if this module owns it; None otherwise."""
    if ns.cmd != "dashboards":
        return None
    action = getattr(ns, "dashboards_cmd", None)
    if action == "render":
        return run_render(resolve(ns, RENDER_OPTIONS, os.environ))
    if action == "push":
        if getattr(ns, "grafana_token_argv", None) is not None:
            raise ConfigError(
                "--grafana-token is not accepted: a command line is visible to every user of the "
                "machine; set AUDITOR_GRAFANA_TOKEN or use --grafana-token-file PATH"
            )
        return run_push(resolve(ns, PUSH_OPTIONS, os.environ), os.environ)
    raise ConfigError("auditor dashboards needs an action: render or push")


def run_render(
    values: Mapping[str, Any], *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    from auditor.ops.render import artifacts, render, stale

    out = out or sys.stdout
    err = err or sys.stderr
    root = Path(values.get("dashboards_root") or ".")
    if not root.is_dir():
        raise ConfigError(f"--root: not a directory: {root}")
    if values.get("dashboards_check"):
        old = stale(root)
        for rel in old:
            print(rel, file=out)
        if old:
            print(
                f"auditor: {len(old)} generated file(s) out of date; run 'auditor dashboards "
                "render'",
                file=err,
            )
            return 1
        print(f"auditor: {len(artifacts())} generated files up to date", file=err)
        return 0
    written = render(root)
    for rel in written:
        print(f"wrote {rel}", file=out)
    print(
        f"auditor: {len(written)} file(s) written, {len(artifacts()) - len(written)} unchanged",
        file=err,
    )
    return 0


def run_push(
    values: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    from auditor.ops.push import PushError, TokenError, push, read_token
    from auditor.ops.render import dashboards

    out = out or sys.stdout
    err = err or sys.stderr
    url = values.get("grafana_url")
    if not url:
        raise ConfigError("--grafana-url is required, e.g. --grafana-url http://127.0.0.1:3000")
    try:
        token = read_token(values.get("grafana_token_file"), env)
    except TokenError as exc:
        raise ConfigError(str(exc)) from None
    folder = values.get("grafana_folder") or "GPU Balance Auditor"
    try:
        pushed = push(url, token, [d.to_dict() for d in dashboards()], folder=folder)
    except PushError as exc:
        print(f"auditor: error: {exc}", file=err)
        return 1
    # Grafana answers with the path from its root (sub-path included): join to the origin only.
    parts = urlsplit(url)
    base = f"{parts.scheme}://{parts.netloc}"
    for item in pushed:
        version = f" version {item.version}" if item.version is not None else ""
        print(
            f"pushed {item.uid} ({item.title}) to {folder!r}: {base}{item.url}{version}", file=out
        )
    return 0
