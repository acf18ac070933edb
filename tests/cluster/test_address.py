"""Which Ray ``auditor run`` joins, and ``doctor`` reports: one decision, Ray's own order."""

from __future__ import annotations

import io
import socket
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from auditor.cluster.address import AddressError, RayCluster, resolve_cluster
from auditor.cluster.launcher import LaunchError
from auditor.cluster.runtime import check_cluster
from auditor.commands import run as run_command
from auditor.commands.doctor import check_ray
from auditor.configs import RunConfig


def recorded(root: Path, address: str) -> dict[str, str]:
    """An environment whose Ray temp root holds ``ray start``'s record of ``address``."""
    (root / "ray").mkdir(exist_ok=True)
    (root / "ray" / "ray_current_cluster").write_text(address + "\n")
    return {"RAY_TMPDIR": str(root)}


def test_ray_order_flag_then_ray_address_then_the_recorded_cluster(tmp_path: Path) -> None:
    empty = {"RAY_TMPDIR": str(tmp_path / "none")}
    assert resolve_cluster(None, empty) is None  # nothing named: an embedded Ray
    env = {**recorded(tmp_path, "10.0.0.9:6379"), "RAY_ADDRESS": "10.0.0.1:6379"}
    assert resolve_cluster("10.0.0.2:6379", env) == RayCluster(
        "10.0.0.2:6379", "--address", "10.0.0.2:6379"
    )
    # As ray.init: RAY_ADDRESS stands in for a flag left out or given as "auto".
    for flag in (None, "auto"):
        assert resolve_cluster(flag, env) == RayCluster(
            "10.0.0.1:6379", "RAY_ADDRESS", "10.0.0.1:6379"
        )
    found = resolve_cluster(None, recorded(tmp_path, "10.0.0.9:6379"))
    assert found is not None and found.address == "10.0.0.9:6379"
    assert found.source.endswith("ray/ray_current_cluster") and found.init_address == "auto"


def test_local_starts_a_new_ray_and_auto_needs_a_cluster(tmp_path: Path) -> None:
    env = recorded(tmp_path, "10.0.0.9:6379")
    assert resolve_cluster(None, {**env, "RAY_ADDRESS": "local"}) is None
    assert resolve_cluster("local", {**env, "RAY_ADDRESS": "10.0.0.1:6379"}) is None
    with pytest.raises(AddressError, match="RAY_ADDRESS=auto, but no Ray cluster"):
        resolve_cluster(None, {"RAY_ADDRESS": "auto", "RAY_TMPDIR": str(tmp_path / "none")})


def test_a_dead_cluster_is_one_line_that_says_where_it_came_from() -> None:
    said = r"127\.0\.0\.1:1 \(from RAY_ADDRESS\).*RAY_ADDRESS=local"
    with pytest.raises(LaunchError, match=said):
        check_cluster(RayCluster("127.0.0.1:1", "RAY_ADDRESS", "127.0.0.1:1"), timeout_s=1)
    with pytest.raises(LaunchError, match="expected HOST:PORT"):
        check_cluster(RayCluster("nohostport", "--address", "nohostport"))


def test_doctor_reports_the_cluster_run_would_join(tmp_path: Path) -> None:
    env = {**recorded(tmp_path, "127.0.0.1:1"), "RAY_ADDRESS": "127.0.0.1:2"}
    ray = check_ray(env, timeout_s=1)
    cluster = resolve_cluster(None, env)
    assert cluster is not None
    assert (ray["address"], ray["address_from"]) == (cluster.address, cluster.source)
    assert ray["reachable"] is False and "refuses to start" in ray["detail"]
    local = check_ray({**env, "RAY_ADDRESS": "local"})
    assert local["address"] is None and "new local Ray" in local["detail"]


def test_a_named_cluster_that_cannot_be_joined_stops_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It answers, yet joining fails (say, its token auth refuses us): no in-process agent
    audits a job its user believes is on that cluster; the job is stopped and the run fails."""

    def refused(**kwargs: Any) -> Any:
        raise ConnectionError("the cluster refused the driver")

    monkeypatch.setattr(run_command, "start_agent", refused)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        cfg = RunConfig(
            command=(sys.executable, "-c", f"import time; time.sleep(60)  # {tmp_path}"),
            report=str(tmp_path / "r.json"),
            quiet=True,
            nice=0,
            grace=2.0,
        )
        t0 = time.monotonic()
        with pytest.raises(LaunchError) as err:
            run_command.run(cfg, out=io.StringIO(), env={"RAY_ADDRESS": address})
    assert err.value.exit_code == run_command.JOIN_FAILED_EXIT != 0
    assert f"could not join the Ray cluster at {address} (from RAY_ADDRESS)" in str(err.value)
    assert "the job was stopped" in str(err.value)
    assert time.monotonic() - t0 < 30  # stopped, not waited for
    job = [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or ())
    ]
    assert not job, job
