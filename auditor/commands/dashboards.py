"""The operator-files commands: ``auditor dashboards render`` and ``auditor dashboards push``
(the CLI, :mod:`auditor.cli.dashboards`, builds the :class:`DashboardsConfig`).

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

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from auditor.configs import ConfigError, DashboardsConfig


def dashboards(
    cfg: DashboardsConfig,
    *,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """``auditor dashboards render|push``. ``env`` is where ``AUDITOR_GRAFANA_TOKEN`` is read
    from when pushing (default: this process's environment)."""
    if cfg.action == "render":
        return render_files(cfg, out=out, err=err)
    if cfg.action == "push":
        return push_dashboards(cfg, os.environ if env is None else env, out=out, err=err)
    raise ConfigError("auditor dashboards needs an action: render or push")


def render_files(
    cfg: DashboardsConfig, *, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    from auditor.ops.render import artifacts, provisioning, render, stale

    out = out or sys.stdout
    err = err or sys.stderr
    root = Path(cfg.dashboards_root or ".")
    if not root.is_dir():
        raise ConfigError(f"--root: not a directory: {root}")
    try:
        settings = provisioning(
            datasource_url=cfg.datasource_url,
            nodes_scrape_job=cfg.nodes_scrape_job,
            serve_scrape_job=cfg.serve_scrape_job,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.dashboards_check:
        old = stale(root, settings)
        for rel in old:
            print(rel, file=out)
        if old:
            print(
                f"auditor: {len(old)} generated file(s) out of date; run 'auditor dashboards "
                "render'",
                file=err,
            )
            return 1
        print(f"auditor: {len(artifacts(settings))} generated files up to date", file=err)
        return 0
    written = render(root, settings)
    for rel in written:
        print(f"wrote {rel}", file=out)
    print(
        f"auditor: {len(written)} file(s) written, "
        f"{len(artifacts(settings)) - len(written)} unchanged",
        file=err,
    )
    return 0


def push_dashboards(
    cfg: DashboardsConfig,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    from auditor.ops.push import PushError, TokenError, push, read_token
    from auditor.ops.render import dashboards

    out = out or sys.stdout
    err = err or sys.stderr
    url = cfg.grafana_url
    if not url:
        raise ConfigError("--grafana-url is required, e.g. --grafana-url http://127.0.0.1:3000")
    try:
        token = read_token(cfg.grafana_token_file, env)
    except TokenError as exc:
        raise ConfigError(str(exc)) from None
    folder = cfg.grafana_folder or "GPU Balance Auditor"
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
