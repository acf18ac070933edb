"""The Prometheus file_sd writer shared by ``auditor fleet --sd-file`` and ``auditor run
--sd-file``: targets Prometheus can reach, the documented JSON shape, atomic rewrites, removal."""

from __future__ import annotations

import ipaddress
import json
import socket
from pathlib import Path

import pytest

from auditor.cluster.fleet import (
    Fleet,
    NodeDeployment,
    primary_address,
    remove_sd_file,
    sd_entry,
    sd_target,
    sd_text,
    write_sd_file,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "bind", "reachable", "expected"),
    [
        ("http://127.0.0.1:9411/metrics", "127.0.0.1", "10.0.0.5", "127.0.0.1:9411"),
        ("http://10.0.0.7:9411/metrics", "10.0.0.7", "10.0.0.5", "10.0.0.7:9411"),
        ("http://0.0.0.0:9412/metrics", "0.0.0.0", "10.0.0.5", "10.0.0.5:9412"),
        ("http://:9413/metrics", "", "gpu-node-a", "gpu-node-a:9413"),
        ("http://:::9414/metrics", "::", "fd00::5", "[fd00::5]:9414"),
        ("http://[::]:9415/metrics", "[::]", "10.0.0.5", "10.0.0.5:9415"),
        ("http://::1:9416/metrics", "::1", "10.0.0.5", "[::1]:9416"),
        ("http://[::1]:9417/metrics", "[::1]", "10.0.0.5", "[::1]:9417"),
    ],
)
def test_target_is_the_bound_host_unless_it_is_a_wildcard(
    url: str, bind: str, reachable: str, expected: str
) -> None:
    assert sd_target(url, bind, reachable) == expected


def test_written_file_has_the_file_sd_shape_and_no_temporary_left(tmp_path: Path) -> None:
    path = tmp_path / "targets" / "auditor-run-job.json"  # the folder is created
    entries = [sd_entry("10.0.0.5:9411")]
    text = write_sd_file(str(path), entries)
    assert path.read_text() == text == sd_text(entries)
    assert json.loads(text) == entries
    entries2 = [sd_entry("10.0.0.5:9412")]
    write_sd_file(str(path), entries2)
    assert json.loads(path.read_text()) == entries2
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_shipped_example_is_in_the_written_shape() -> None:
    example = REPO / "deploy" / "prometheus" / "targets" / "example.json"
    entries = json.loads(example.read_text())
    assert json.loads(sd_text(entries)) == entries
    for entry in entries:
        assert set(entry) == {"targets", "labels"}
        # Target labels named like the series' own would become exported_* duplicates.
        assert not set(entry["labels"]) & {"auditor_job", "node", "rank", "gpu", "job"}


def test_an_entry_has_the_target_and_no_labels_the_series_carry() -> None:
    assert sd_entry("10.0.0.5:9411") == {"targets": ["10.0.0.5:9411"], "labels": {}}


def test_remove_takes_the_file_and_tolerates_its_absence(tmp_path: Path) -> None:
    path = tmp_path / "auditor-run-job.json"
    write_sd_file(str(path), [])
    remove_sd_file(str(path))
    assert not path.exists()
    remove_sd_file(str(path))  # already gone: nothing to do, no error


def test_primary_address_is_a_routable_ip_or_the_hostname() -> None:
    address = primary_address()
    if address == socket.gethostname():
        return
    ip = ipaddress.ip_address(address)
    assert not ip.is_loopback and not ip.is_unspecified


def test_fleet_writes_its_nodes_through_the_shared_writer(tmp_path: Path) -> None:
    """A wildcard bind lists each node's Ray IP; sorted by node name; no Ray cluster needed."""
    pytest.importorskip("ray")
    path = tmp_path / "auditor-nodes.json"
    fleet = Fleet(sd_file=str(path), metrics_host="0.0.0.0")
    for node_id, name, ip, port in [
        ("n2", "node-b", "10.0.0.12", 9412),
        ("n1", "node-a", "10.0.0.11", 9411),
    ]:
        d = NodeDeployment(node_id=node_id, name=name, ip=ip, agent=None)
        fleet._set_address(d, {"metrics": f"http://0.0.0.0:{port}/metrics"})
        fleet._deployments[node_id] = d
    fleet._write_sd()
    # No target labels: the series carry node (and auditor_job) themselves, and a target label
    # of the same name would rename theirs to exported_node under a default scrape.
    assert json.loads(path.read_text()) == [
        {"targets": ["10.0.0.11:9411"], "labels": {}},
        {"targets": ["10.0.0.12:9412"], "labels": {}},
    ]
    assert path.read_text() == sd_text(fleet.targets())
