"""``auditor doctor``: what this machine offers the auditor, in plain words.

Checks, each cheap and without side effects: NVML (bindings, library, driver, GPUs with model,
UUID and memory), Ray (installed version; the cluster ``auditor run`` would join, decided by the
function ``run`` calls, and whether it answers on its GCS port; never starts or joins a
cluster), the launcher and scheduler it runs under and what ``auditor run`` takes from them for
rank, node and job identity (:mod:`auditor.launch_env`; a command after ``--`` is the one
``auditor run`` would start), the auditor metrics endpoints given (HTTP GET), and Prometheus
when a URL is configured (``GET /-/ready``).

A machine without a GPU is a normal answer, not an error: the report says so and the exit
status is 0. Exit status 1 only when the report itself could not be made.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from auditor import __version__
from auditor.cluster.address import AddressError, host_port, resolve_cluster, tcp_reachable
from auditor.configs import DoctorConfig
from auditor.launch_env import LAUNCHERS, identify, read_pod_labels
from auditor.telemetry.nvml import Nvml, NvmlSource, NvmlUnavailableError

SCHEMA = "auditor.doctor/v1"
METRIC_PREFIX = "auditor_"
DEFAULT_TIMEOUT_S = 2.0
_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# -- NVML ---------------------------------------------------------------------------------------


def check_nvml(nvml: Nvml | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """NVML status and the GPUs it sees (empty where there is no driver or GPU)."""
    bindings = _dist_version("nvidia-ml-py")
    info: dict[str, Any] = {
        "ok": False,
        "reason": "",
        "bindings": f"nvidia-ml-py {bindings}" if bindings else None,
        "driver_version": None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "device_count": None,
        "missing": {},
        "notes": [],
    }
    if _dist_version("pynvml") is not None:
        info["notes"].append(
            "the deprecated 'pynvml' PyPI package is installed next to nvidia-ml-py; "
            "it can shadow the maintained bindings (pip uninstall pynvml)"
        )
    source = NvmlSource(socket.gethostname(), nvml=nvml)
    gpus: list[dict[str, Any]] = []
    try:
        info.update(source.driver_info())  # the first NVML use: initialises it
    except NvmlUnavailableError as exc:
        info["reason"] = exc.reason
        return info, gpus
    try:
        for ident in source.devices():
            s = source.sample(ident.uuid)
            gpus.append(
                {
                    "index": ident.index,
                    "uuid": ident.uuid,
                    "model": ident.model,
                    "lost": s.lost,
                    "memory_total_bytes": s.mem_total_bytes,
                    "memory_used_bytes": s.mem_used_bytes,
                    "processes": len(s.processes),
                }
            )
        info["missing"] = source.nvml.missing()
    finally:
        source.close()
    info["ok"] = bool(gpus)
    info["reason"] = (
        f"{len(gpus)} GPU(s), driver {info['driver_version'] or 'unknown'}"
        if gpus
        else "the NVIDIA driver is loaded but reports no GPU"
    )
    return info, gpus


# -- Ray ----------------------------------------------------------------------------------------


def check_ray(
    environ: Mapping[str, str] | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """Ray's version, the cluster ``auditor run`` would join (:func:`resolve_cluster`, as the
    run decides it) and whether it answers; never starts or joins Ray."""
    env = os.environ if environ is None else environ
    version = _dist_version("ray")
    out: dict[str, Any] = {
        "installed": version is not None,
        "version": version,
        "address_env": env.get("RAY_ADDRESS") or None,
        "address": None,
        "address_from": None,
        "reachable": None,
        "detail": "",
    }
    if version is None:
        out["detail"] = "Ray is not installed (pip install 'ray>=2.40')"
        return out
    try:
        cluster = resolve_cluster(None, env)
    except AddressError as exc:
        out["detail"] = f"{exc}: auditor run refuses to start"
        return out
    if cluster is None:
        out["detail"] = (
            "RAY_ADDRESS=local: auditor run starts a new local Ray"
            if (env.get("RAY_ADDRESS") or "").strip() == "local"
            else "no cluster address (RAY_ADDRESS unset, no local cluster started with "
            "'ray start'): auditor run starts an embedded Ray"
        )
        return out
    out["address"], out["address_from"] = cluster.address, cluster.source
    hp = host_port(cluster.address)
    if hp is None:
        out["detail"] = f"cannot tell host and port from address {cluster.address!r}"
        return out
    out["reachable"], out["detail"] = tcp_reachable(hp[0], hp[1], timeout_s)
    if not out["reachable"]:
        out["detail"] += ": auditor run refuses to start until it answers"
    return out


# -- launcher and scheduler -----------------------------------------------------------------------


def check_launch(
    environ: Mapping[str, str] | None = None,
    command: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The launcher and scheduler this process runs under (and, with ``command``, the launcher
    ``auditor run -- command`` would start), and where rank, node and job identity come from;
    ``labels``: the pod's (read from the downward API file where None)."""
    env = os.environ if environ is None else environ
    launch = identify(command, env, read_pod_labels(env) if labels is None else labels)
    about = {spec.name: spec.about for spec in LAUNCHERS}
    return {
        "command": list(command),
        "launcher": launch.launcher or None,
        "within": launch.within,
        "within_about": about.get(launch.within or "", ""),
        "scheduler": launch.scheduler,
        "rank": launch.rank,
        "local_rank": launch.local_rank,
        "world_size": launch.world_size,
        "node": launch.node or socket.gethostname(),
        "node_rank": launch.node_rank,
        "job_id": launch.job_id,
        "job_name": launch.job_name,
        # What ``auditor run`` names the job (the auditor_job label) without ``--job``.
        "job": launch.job_label,
        "per_task": launch.per_task,
        "job_view_key": launch.key,
        "member": launch.member,
        "sources": dict(launch.sources),
    }


def _launch_lines(info: dict[str, Any]) -> list[str]:
    src = info["sources"]

    def where(name: str) -> str:
        return f" ({src[name]})" if name in src else ""

    within = info["within"]
    runs = f"inside {within}: {info['within_about']}" if within else "no launcher around it"
    lines = [f"Launch      scheduler {info['scheduler']}; {runs}"]
    if info["command"]:
        lines.append(f"            the command starts: {info['launcher']}")
    if info["rank"] is not None:
        local = (
            ""
            if info["local_rank"] is None
            else f", local rank {info['local_rank']}{where('local_rank')}"
        )
        lines.append(
            f"            rank {info['rank']}{where('rank')} of {info['world_size']}"
            f"{where('world_size')}{local}"
        )
    else:
        lines.append("            rank: from each process's group (none set here)")
    node_rank = "" if info["node_rank"] is None else f", node rank {info['node_rank']}"
    lines.append(
        f"            node {info['node']}{where('node') or ' (hostname)'}"
        f"{node_rank}{where('node_rank')}"
    )
    if info["job"]:
        name = f" ({info['job_name']})" if info["job_id"] and info["job_name"] else ""
        lines.append(f"            job {info['job']}{name}{where('job')}: the auditor_job label")
    elif info["scheduler"] == "slurm":
        lines.append(
            "            job: --job, else the script's name (srun makes the allocation after "
            "the auditor starts: run it in sbatch or salloc for the SLURM job id)"
        )
    else:
        lines.append("            job: --job, else the script's name (no scheduler names it)")
    if info["per_task"]:
        lines.append(
            f"            one auditor per {'task' if within == 'srun' else 'pod'}: as "
            f"{info['member']}, meets the others in the job view through the Ray cluster "
            "(--address)"
        )
    return lines


# -- HTTP endpoints -------------------------------------------------------------------------------


def _http_get(url: str, timeout_s: float) -> tuple[int | None, str, str]:
    """(status, body, error); status None when nothing answered."""
    host = urllib.parse.urlsplit(url).hostname or ""
    # Loopback endpoints never go through an HTTP proxy from the environment.
    handlers = [urllib.request.ProxyHandler({})] if host in _LOOPBACK else []
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout_s) as resp:
            body = resp.read(4 << 20).decode("utf-8", errors="replace")
            return int(resp.status), body, ""
    except urllib.error.HTTPError as exc:
        return int(exc.code), "", f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return None, "", str(reason)


def _normalise_url(url: str, default_path: str) -> str:
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.path in ("", "/") and default_path:
        parts = parts._replace(path=default_path)
    return urllib.parse.urlunsplit(parts)


def check_metrics_endpoint(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """An auditor metrics endpoint: up when it answers 200; counts the auditor series."""
    full = _normalise_url(url, "/metrics")
    status, body, error = _http_get(full, timeout_s)
    series = sum(1 for line in body.splitlines() if line.startswith(METRIC_PREFIX) and " " in line)
    up = status == 200
    if up:
        detail = f"HTTP 200, {series} {METRIC_PREFIX}* series"
    elif status is not None:
        detail = f"HTTP {status}"
    else:
        detail = error
    return {"url": full, "up": up, "series": series if up else None, "detail": detail}


def check_prometheus(url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Prometheus readiness: ``GET <url>/-/ready``."""
    base = _normalise_url(url, "").rstrip("/")
    ready_url = base + "/-/ready"
    status, body, error = _http_get(ready_url, timeout_s)
    ready = status == 200
    if status is not None:
        detail = f"HTTP {status}" + (f": {body.strip()[:80]}" if body.strip() else "")
    else:
        detail = error
    return {"url": base, "ready": ready, "detail": detail}


# -- the report ---------------------------------------------------------------------------------


def collect(
    prometheus_url: str | None = None,
    metrics_urls: Sequence[str] = (),
    *,
    nvml: Nvml | None = None,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    command: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Every check, as a JSON-serialisable dict (``nvml``, ``environ`` and ``labels`` for
    tests); ``command``: what ``auditor run`` would start."""
    nvml_info, gpus = check_nvml(nvml)
    return {
        "schema": SCHEMA,
        "time": time.time(),
        "host": socket.gethostname(),
        "auditor_version": __version__,
        "python": platform.python_version(),
        "torch_version": _dist_version("torch"),
        "nvml": nvml_info,
        "gpus": gpus,
        "ray": check_ray(environ, timeout_s=timeout_s),
        "launch": check_launch(environ, command, labels),
        "metrics_endpoints": [check_metrics_endpoint(u, timeout_s=timeout_s) for u in metrics_urls],
        "prometheus": (
            check_prometheus(prometheus_url, timeout_s=timeout_s) if prometheus_url else None
        ),
    }


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


def render(report: dict[str, Any]) -> str:
    """The report as a few plain lines for a terminal."""
    lines = [
        f"auditor doctor: {report['host']}, auditor {report['auditor_version']}, "
        f"Python {report['python']}, torch {report.get('torch_version') or 'not installed'}"
    ]
    nv = report["nvml"]
    gpus = report["gpus"]
    if gpus:
        versions = ", ".join(
            f"{label} {nv[key]}"
            for label, key in (
                ("driver", "driver_version"),
                ("NVML", "nvml_version"),
                ("CUDA driver", "cuda_driver_version"),
            )
            if nv.get(key)
        )
        lines.append(f"NVML        ok: {versions} ({nv.get('bindings') or 'bindings ?'})")
        for g in gpus:
            state = (
                "LOST (fell off the bus)"
                if g["lost"]
                else (
                    f"{_gib(g['memory_used_bytes'])} used of {_gib(g['memory_total_bytes'])}, "
                    f"{g['processes']} process(es)"
                )
            )
            lines.append(f"  GPU {g['index']}     {g['model']}  {g['uuid']}  {state}")
        if nv.get("missing"):
            lines.append(
                "  not available here (reported as missing, not zero): "
                + ", ".join(sorted(nv["missing"]))
            )
    else:
        lines.append(f"NVML        no NVIDIA driver/GPU found: {nv['reason']}")
        lines.append("            GPU metrics are skipped; CPU-only jobs are still audited")
    for note in nv.get("notes") or ():
        lines.append(f"  note: {note}")

    ray = report["ray"]
    if not ray["installed"]:
        lines.append(f"Ray         {ray['detail']}")
    else:
        where = ""
        if ray["address"]:
            state = "reachable" if ray["reachable"] else "NOT reachable"
            where = f"; cluster {ray['address']} ({ray['address_from']}) {state}: "
            lines.append(f"Ray         {ray['version']}{where}{ray['detail']}")
        else:
            lines.append(f"Ray         {ray['version']}; {ray['detail']}")

    if report.get("launch"):
        lines.extend(_launch_lines(report["launch"]))

    endpoints = report["metrics_endpoints"]
    if not endpoints:
        lines.append("Metrics     no auditor metrics endpoint given to check")
    for e in endpoints:
        lines.append(f"Metrics     {e['url']}: {'up' if e['up'] else 'DOWN'} ({e['detail']})")

    prom = report["prometheus"]
    if prom is None:
        lines.append("Prometheus  not configured")
    else:
        state = "ready" if prom["ready"] else "NOT ready"
        lines.append(f"Prometheus  {prom['url']}: {state} ({prom['detail']})")
    return "\n".join(lines)


def main(
    json_output: bool,
    prometheus_url: str | None,
    metrics_urls: Sequence[str] = (),
    *,
    nvml: Nvml | None = None,
    command: Sequence[str] = (),
) -> int:
    """Print the report (JSON or text). 0 when it could be made, even without a GPU; 1 if not."""
    try:
        report = collect(prometheus_url, metrics_urls, nvml=nvml, command=command)
        text = json.dumps(report, indent=2) if json_output else render(report)
    except Exception as exc:  # an internal error: say it in one line, no traceback
        print(f"auditor doctor: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(text)
    return 0


def doctor(cfg: DoctorConfig) -> int:
    """``auditor doctor``: the report for ``cfg`` (see :func:`main`)."""
    return main(json_output=cfg.json, prometheus_url=cfg.prometheus_url, command=cfg.command)
