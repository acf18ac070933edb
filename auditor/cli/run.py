"""``auditor run [options] -- COMMAND...``: a training job under the auditor."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence

from auditor.configs import LIVE_INTERVAL_S, RunConfig

from .applying import parse_apply
from .options import (
    FAIL_ON,
    SET,
    Option,
    add_options,
    boolean,
    device_source,
    gpu_source,
    json_destination,
    niceness,
    non_negative,
    parse_overrides,
    port,
    positive,
    resolve,
)
from .usage import UsageError

RUN_OPTIONS: tuple[Option, ...] = (
    Option("--report", "report", "write the JSON report here (also when the job fails)"),
    Option("--record", "record", "write every sample seen to this recording (JSON lines)"),
    Option("--html", "html", "write a self-contained HTML report here"),
    Option(
        "--events",
        "events",
        "write the live verdict to this file as JSON lines while the job runs: one line per "
        "change (each finding as it first appears or leaves, with its typed fixes), flushed "
        "at once; the final verdict is the last line",
    ),
    Option(
        "--metrics-port",
        "metrics_port",
        "serve Prometheus metrics on this port (0: any free)",
        port,
    ),
    Option(
        "--metrics-host", "metrics_host", "address the metrics endpoint binds", str, "127.0.0.1"
    ),
    Option(
        "--sd-file",
        "sd_file",
        "while the job runs, list its metrics endpoint in this Prometheus file_sd JSON (removed "
        "when the run ends); without --metrics-port it implies --metrics-port 0 (any free port)",
    ),
    Option(
        "--address",
        "address",
        "the Ray cluster to join (default: RAY_ADDRESS, else the cluster 'ray start' recorded "
        "on this machine, else an embedded local Ray; 'local': a new local Ray)",
    ),
    Option(
        "--device-source",
        "device_source",
        "where GPU samples come from: nvml, or recorded:PATH (a recording to replay)",
        device_source,
        "nvml",
    ),
    Option(
        "--gpu-source",
        "gpu_source",
        "GPU figures from: auditor (a GpuMonitor actor per GPU, NVML) or dcgm (the node's "
        "dcgm-exporter, scraped by Prometheus: no monitors; ranks still report their GPU "
        "UUIDs, the join)",
        gpu_source,
        "auditor",
    ),
    Option("--window", "window", "seconds of samples each live verdict looks at", positive, 10.0),
    Option(
        "--live-interval",
        "live_interval",
        f"seconds between live verdicts and table refreshes (0: no table; verdicts every "
        f"{LIVE_INTERVAL_S:g} s)",
        non_negative,
        LIVE_INTERVAL_S,
    ),
    Option("--job", "job", "job name used in metrics and the report (default: script name)"),
    Option(
        "--grace",
        "grace",
        "seconds between SIGTERM and SIGKILL when stopping the job",
        positive,
        10.0,
    ),
    Option("--ray-temp-dir", "ray_temp_dir", "temp dir of the embedded Ray (default: Ray's)"),
    Option(
        "--nice",
        "nice",
        "niceness the auditor's own processes take once the job has started (this process and "
        "the Ray it starts), so that they never compete with the job for its cores (0: as "
        "started)",
        niceness,
        10,
    ),
    SET,
    Option(
        "--no-ray",
        "no_ray",
        "run the node agent inside this process instead of a Ray actor",
        boolean,
        False,
        True,
    ),
    Option("--quiet", "quiet", "no live table; only the verdict", boolean, False, True),
    Option(
        "--json",
        "json",
        "write the verdict as JSON to this file, or to stdout with '-': stdout then carries "
        "only the JSON, and the job's own stdout goes to stderr",
        json_destination,
    ),
    FAIL_ON,
    Option(
        "--apply",
        "apply",
        "try a report's advice without editing the script: the loader levers of REPORT.json's "
        "fixes (num_workers, pin_memory, persistent_workers, prefetch_factor), or one given as "
        "rankN.lever=value, set on the named ranks' training DataLoader when it is built; "
        "fixes that need a code change are named, not applied (comma separated; given several "
        "times, all apply)",
        repeat=True,
    ),
)


def run_config(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> RunConfig:
    values = resolve(ns, RUN_OPTIONS, env)
    overrides = parse_overrides(values.get("set"))
    plan = parse_apply(
        values.get("apply"),
        command,
        source="--apply" if getattr(ns, "apply", None) else "AUDITOR_APPLY",
    )
    if values.get("sd_file") and values.get("metrics_port") is None:
        values["metrics_port"] = 0  # an SD file needs an endpoint to list: any free port
    return RunConfig(command=tuple(command), overrides=overrides, apply_plan=plan, **values)


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training command under the auditor",
        usage="auditor run [options] -- COMMAND [ARGS...]",
        description="Run COMMAND (e.g. torchrun --nproc_per_node=2 train.py) with the probe in "
        "every rank; print a live per-rank table and a verdict with per-rank fixes.",
        epilog="Exit status: the job's own (128+N if signal N killed it); 3 when the job "
        "exited 0 and --fail-on found a finding that severe; 127 when COMMAND is not found, "
        "126 when it cannot be executed; 2 for a usage error.",
    )
    add_options(p, RUN_OPTIONS)


def dispatch(ns: argparse.Namespace, command: Sequence[str], env: Mapping[str, str]) -> int | None:
    if ns.cmd != "run":
        return None
    cfg = run_config(ns, command, env)
    from auditor.cluster.launcher import LaunchError
    from auditor.commands.run import run

    try:
        return run(cfg)
    except LaunchError as exc:
        if exc.exit_code == 2:
            raise UsageError(str(exc)) from None
        # Not a usage error: the shell's codes for a command that is missing (127) or cannot
        # be executed (126), so a script can tell them from a job that exited 2.
        print(f"auditor: error: {exc}", file=sys.stderr)
        return exc.exit_code
