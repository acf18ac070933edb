"""Which Ray ``auditor run`` uses: one decision, made here for ``run`` and for ``doctor``.

Ray's own order, as ``ray.init()`` and Ray's tools read it: ``--address`` when given (other
than ``auto``); else ``RAY_ADDRESS`` (set on a Ray cluster's nodes and inside a Ray job); else
the cluster the last ``ray start`` on this machine recorded in ``<Ray temp root>/ray/
ray_current_cluster``; else none, and ``auditor run`` starts its own embedded Ray. ``local``
(flag or ``RAY_ADDRESS``) means a new local Ray, as it does to Ray. Pure: no Ray import, so
``doctor`` stays cheap.
"""

from __future__ import annotations

import os
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RayCluster:
    """An existing Ray cluster to join."""

    address: str  # as named: host:port, or ray://host:port (Ray Client)
    source: str  # "--address", "RAY_ADDRESS", or the ray_current_cluster file it was read from
    # What ray.init is given: "auto" for the recorded cluster, so Ray treats it as found
    # automatically (its token auth then follows the local token, as for ray.init()).
    init_address: str


class AddressError(ValueError):
    """The named Ray address cannot be used; the message is one line for the user."""


def ray_temp_root(env: Mapping[str, str]) -> str:
    """Ray's default temp root on Linux (``ray._common.utils.get_default_system_temp_dir``)."""
    return env.get("RAY_TMPDIR") or env.get("TMPDIR") or "/tmp"


def ray_address_file(env: Mapping[str, str]) -> str:
    """Where ``ray start`` records the cluster it started (``ray stop`` removes it)."""
    return os.path.join(ray_temp_root(env), "ray", "ray_current_cluster")


def _recorded(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def resolve_cluster(flag: str | None, env: Mapping[str, str]) -> RayCluster | None:
    """The cluster to join, or None for an embedded Ray. Raises :class:`AddressError` for
    ``auto`` when no cluster was started on this machine (Ray refuses that too)."""
    flag = (flag or "").strip()
    env_addr = (env.get("RAY_ADDRESS") or "").strip()
    # As ray.init: RAY_ADDRESS stands in for an address left out or given as "auto".
    if flag and flag != "auto":
        named, source = flag, "--address"
    elif env_addr:
        named, source = env_addr, "RAY_ADDRESS"
    else:
        named, source = flag, "--address"
    if named == "local":
        return None
    if named and named != "auto":
        return RayCluster(named, source, named)
    path = ray_address_file(env)
    found = _recorded(path)
    if found:
        return RayCluster(found, path, "auto")
    if named == "auto":
        raise AddressError(f"{source}=auto, but no Ray cluster was started here (no {path})")
    return None


def host_port(address: str) -> tuple[str, int] | None:
    """Host and port of ``host:port`` or ``scheme://host:port``; None when it says neither."""
    text = address.strip()
    if "://" not in text:
        text = "tcp://" + text
    parsed = urllib.parse.urlsplit(text)
    try:
        port = parsed.port
    except ValueError:
        return None
    if not parsed.hostname or port is None:
        return None
    return parsed.hostname, port


def tcp_reachable(host: str, port: int, timeout_s: float) -> tuple[bool, str]:
    """Whether ``host:port`` accepts a connection, and what was seen, in words."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, f"{host}:{port} accepts connections"
    except OSError as exc:
        return False, f"{host}:{port} does not answer ({exc.strerror or exc})"
