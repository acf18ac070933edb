"""Real Prometheus and Alertmanager servers for tests (Debian's packages), on 127.0.0.1.

Each server runs in its own temp dir with its own storage, on a free port, and is stopped (and
waited for) by the test that started it. ``restart`` keeps the port and the storage, as an
operator's restart would. Readiness is polled, never slept for.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

from tests.helpers.tools import require_tool
from tests.helpers.waiting import wait_for_service

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, *, data: bytes | None = None, timeout: float = 5.0) -> Any:
    request = urllib.request.Request(url, data=data)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return None


class Server:
    """One server process with a readiness URL."""

    def __init__(self, argv: list[str], ready_url: str, log: Path) -> None:
        self.argv = argv
        self.ready_url = ready_url
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        wait_for_service(
            lambda: self._alive() and http_status(self.ready_url) == 200,
            timeout=timeout,
            what=f"{self.argv[0]} ready at {self.ready_url} (log: {self.log})",
        )

    def _alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.argv[0]} exited: {self.log.read_text()[-2000:]}")
        return True

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class Prometheus(Server):
    def __init__(self, workdir: Path, config: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data = workdir / "prometheus-data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            require_tool("prometheus"),
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        super().__init__(argv, f"{self.url}/-/ready", workdir / "prometheus.log")

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = urllib.parse.urlencode({"query": expr}).encode()
        answer = http_json(f"{self.url}/api/v1/query", data=body)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(http_json(f"{self.url}/api/v1/alerts")["data"]["alerts"])

    def targets_up(self) -> bool:
        active = http_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
        return bool(active) and all(t["health"] == "up" for t in active)


class Alertmanager(Server):
    def __init__(self, workdir: Path, config: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        data = workdir / "alertmanager-data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            require_tool("prometheus-alertmanager", "alertmanager"),
            f"--config.file={config}",
            f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            # No gossip: a lone test instance must not listen on a cluster port.
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        super().__init__(argv, f"{self.url}/-/ready", workdir / "alertmanager.log")

    def alerts(self) -> list[dict[str, Any]]:
        return list(http_json(f"{self.url}/api/v2/alerts"))

    def post_alerts(self, labels: list[dict[str, str]]) -> None:
        """Fire one alert per label set, as Prometheus sends them."""
        body = json.dumps([{"labels": one} for one in labels]).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()
