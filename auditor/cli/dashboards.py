"""``auditor dashboards render|push``: the generated operator files, and their upload.

auditor dashboards render [--root DIR] [--check] [--datasource-url URL]
                         [--nodes-scrape-job NAME] [--serve-scrape-job NAME]
    write the generated dashboards, their provisioning and the Prometheus rules under DIR (the
    current directory by default); with --check write nothing, list the files that are missing or
    out of date and exit 1 if there are any (0 if none). The data source URL and the scrape job
    names are written into the provisioning and the rules (--check compares with the render
    of the same settings: the defaults are what the repository commits)
auditor dashboards push --grafana-url URL [--folder NAME] [--grafana-token-file PATH]
    upload the dashboards into a Grafana folder (created if missing), overwriting older versions;
    the token comes from AUDITOR_GRAFANA_TOKEN or from the token file, never from the command line

Every option also reads its ``AUDITOR_*`` twin. Exit status: 0 done; 1 stale files (--check) or
Grafana failed (unreachable, 401/403, error answers); 2 a usage error or no token.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from auditor.configs import ConfigError, DashboardsConfig

from .options import Option, add_options, resolve

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
    Option(
        "--datasource-url",
        "datasource_url",
        "URL of the Prometheus the provisioned Grafana data source reads "
        "(default: http://prometheus:9090, the compose stack's)",
    ),
    Option(
        "--nodes-scrape-job",
        "nodes_scrape_job",
        "Prometheus scrape job of the node endpoints, watched by AuditorExporterDown "
        "(default: auditor-nodes)",
    ),
    Option(
        "--serve-scrape-job",
        "serve_scrape_job",
        "Prometheus scrape job of auditor serve, watched by AuditorExporterDown "
        "(default: auditor-serve)",
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


def render_config(ns: argparse.Namespace, env: Mapping[str, str]) -> DashboardsConfig:
    return DashboardsConfig(action="render", **resolve(ns, RENDER_OPTIONS, env))


def push_config(ns: argparse.Namespace, env: Mapping[str, str]) -> DashboardsConfig:
    if getattr(ns, "grafana_token_argv", None) is not None:
        raise ConfigError(
            "--grafana-token is not accepted: a command line is visible to every user of the "
            "machine; set AUDITOR_GRAFANA_TOKEN or use --grafana-token-file PATH"
        )
    return DashboardsConfig(action="push", **resolve(ns, PUSH_OPTIONS, env))


def dashboards_config(ns: argparse.Namespace, env: Mapping[str, str]) -> DashboardsConfig:
    action = getattr(ns, "dashboards_cmd", None)
    if action == "render":
        return render_config(ns, env)
    if action == "push":
        return push_config(ns, env)
    raise ConfigError("auditor dashboards needs an action: render or push")


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


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "dashboards":
        return None
    from auditor.commands.dashboards import dashboards

    return dashboards(dashboards_config(ns, env), env=env)
