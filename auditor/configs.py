"""What each command runs with: one frozen dataclass per command, built by :mod:`auditor.cli`
from the command line and the ``AUDITOR_*`` environment (the command line wins).

Plain data at the bottom of the layers: every layer may import it, and it imports no other
auditor module, so no layer needs the command line's parser to get what it runs with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

Overrides = dict[str, dict[str, Any]]


# Seconds between live verdicts: a fault shows a fraction of this after its evidence is in, and
# a finding held for confirmation shows a verdict later (one verdict of a two-rank job: ~15 ms).
LIVE_INTERVAL_S = 0.5


class ConfigError(ValueError):
    """A wrong option or value; the CLI prints it on one line and exits 2."""


@dataclass(frozen=True)
class ApplyPlan:
    """``auditor run --apply``: the loader levers the probe sets on named ranks when they build
    their training DataLoader, and the fixes it leaves to the user (named, never applied)."""

    # rank -> lever -> value (``num_workers``, ``pin_memory``, ``persistent_workers``,
    # ``prefetch_factor``).
    levers: dict[int, dict[str, Any]] = field(default_factory=dict)
    # rank -> the training loader's settings as the applied report saw them: how the probe tells
    # that loader when it is built (``auditor.probe.apply``). None for levers given by hand.
    match: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The reports' fixes that need a code or hardware change: (rank, lever, current, proposed).
    not_applied: tuple[tuple[int | None, str, Any, Any], ...] = ()
    # Where it came from: report paths and rankN.lever=value items, in the order given.
    sources: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunConfig:
    """``auditor run``: :func:`auditor.commands.run.run`."""

    command: tuple[str, ...]
    report: str | None = None
    record: str | None = None
    html: str | None = None
    # ``--events``: the live verdict's changes as JSON lines (auditor.report.events).
    events: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    sd_file: str | None = None
    address: str | None = None
    device_source: str = "nvml"
    # dcgm: the node's dcgm-exporter reads the GPUs; no GpuMonitor actor is started.
    gpu_source: str = "auditor"
    window: float = 10.0
    live_interval: float = LIVE_INTERVAL_S
    job: str | None = None
    grace: float = 10.0
    ray_temp_dir: str | None = None
    nice: int = 10
    set: str | None = None
    no_ray: bool = False
    quiet: bool = False
    # Where the verdict JSON goes: a file, "-" (stdout, the job's stdout then goes to stderr),
    # or None (no JSON verdict).
    json: str | None = None
    # "warning" or "critical": exit 3 when the job succeeded and the verdict has such a finding.
    fail_on: str | None = None
    # ``--apply`` as given (report paths, rankN.lever=value), and the plan it names: the loader
    # levers the probe sets on named ranks (None: the script's own loaders).
    apply: str | None = None
    apply_plan: ApplyPlan | None = None
    overrides: Overrides = field(default_factory=dict)

    @property
    def job_name(self) -> str:
        if self.job:
            return self.job
        script = next((a for a in self.command[1:] if a.endswith(".py")), self.command[0])
        return os.path.splitext(os.path.basename(script))[0]


@dataclass(frozen=True)
class FleetConfig:
    """``auditor fleet``: :func:`auditor.commands.fleet.fleet`."""

    address: str
    device_source: str = "nvml"
    # dcgm: the nodes' dcgm-exporter reads the GPUs; no GpuMonitor actors are started.
    gpu_source: str = "auditor"
    sd_file: str | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port_base: int = 0
    sample_interval: float = 1.0
    watch_interval: float = 5.0
    # None: the probe's default socket path; "none": no rank socket at all.
    rank_sink: str | None = None


@dataclass(frozen=True)
class DoctorConfig:
    """``auditor doctor``: :func:`auditor.commands.doctor.doctor`."""

    json: bool = False
    prometheus_url: str | None = None
    # ``auditor doctor -- COMMAND``: the command ``auditor run`` would start (its launcher).
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServeConfig:
    """``auditor serve``: :func:`auditor.commands.serve.serve`."""

    prometheus_url: str = "http://127.0.0.1:9090"
    host: str = "127.0.0.1"
    port: int = 9410
    interval: float = 15.0
    window: float = 60.0
    stale_after: float | None = None
    query_timeout: float = 10.0
    max_backoff: float = 60.0
    set: str | None = None
    once: bool = False
    overrides: Overrides = field(default_factory=dict)
    # auto: the auditor's monitors' series, and dcgm-exporter's for any GPU they do not export.
    gpu_source: str = "auto"


@dataclass(frozen=True)
class ReplayConfig:
    """``auditor replay``: :func:`auditor.commands.replay.replay`."""

    recording: str
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9400
    speed: float = 1.0
    loop: bool = False
    job: str | None = None
    node: str | None = None
    as_node: str | None = None
    # dcgm: the GPUs served as dcgm-exporter serves them, on dcgm_port; the node endpoint then
    # exports no auditor_gpu_* series (as `auditor run --gpu-source dcgm`).
    gpu_source: str = "auditor"
    dcgm_port: int = 9401
    dcgm_counters: str = "auditor"
    dcgm_hostname: str | None = None


@dataclass(frozen=True)
class AnalysisConfig:
    """``auditor analyze`` and ``auditor report``: :func:`auditor.commands.reports.analyze` and
    :func:`auditor.commands.reports.report`."""

    input: str
    html: str | None = None
    window: float | None = None
    set: str | None = None
    json: bool = False
    fail_on: str | None = None
    overrides: Overrides = field(default_factory=dict)


@dataclass(frozen=True)
class CompareConfig:
    """``auditor compare``: :func:`auditor.commands.reports.compare`."""

    before: str
    after: str
    json: bool = False


@dataclass(frozen=True)
class DashboardsConfig:
    """``auditor dashboards render|push``: :func:`auditor.commands.dashboards.dashboards`. The
    Grafana token is not here: it is read from ``AUDITOR_GRAFANA_TOKEN`` or the token file when
    pushing, so that it is never held in (or printed with) a config."""

    action: str  # "render" or "push"
    dashboards_root: str | None = None
    dashboards_check: bool = False
    # Settings of the generated provisioning (render): None = the defaults the committed files
    # hold (auditor.ops.render.Provisioning).
    datasource_url: str | None = None
    nodes_scrape_job: str | None = None
    serve_scrape_job: str | None = None
    grafana_url: str | None = None
    grafana_folder: str = "GPU Balance Auditor"
    grafana_token_file: str | None = None
