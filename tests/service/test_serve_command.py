"""``auditor serve`` from the command line: --once, option errors, the env twin, the bind error,
and (in a subprocess) a service that starts with Prometheus down and stops on SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.cli import main
from tests.helpers.prometheus import KEY_OF, job_answers, vector


def closed_url() -> str:
    """A Prometheus URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def prometheus() -> Iterator[str]:
    """A fake Prometheus answering every query of an evaluation for the 2-rank job "train",
    as of the evaluation time the query carries."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            form = urllib.parse.parse_qs(raw.decode())
            key = KEY_OF[form["query"][0]]
            now = float(form["time"][0])
            body = json.dumps(vector(job_answers("train", now)[key])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AUDITOR_"):
            monkeypatch.delenv(name)


def one_error_line(err: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("auditor: error: "), err
    return err.removeprefix("auditor: error: ").rstrip("\n")


def test_once_prints_the_jobs_as_json(prometheus: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--once", "--prometheus-url", prometheus]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    document = json.loads(out)
    assert isinstance(document["evaluated_at"], float)
    [job] = document["jobs"]
    assert (job["job"], job["ranks"], job["world_size"]) == ("train", 2, 2)
    [starved] = [f for f in job["findings"] if f["kind"] == "data_starvation"]
    assert starved["ranks"] == [1]
    assert starved["nodes"] == {"1": "node-b"}


def test_once_with_set_reaches_the_rules(
    prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--once", "--prometheus-url", prometheus]
    assert main([*argv, "--set", "data_starvation.min_wait_ratio=0.99"]) == 0
    [job] = json.loads(capsys.readouterr().out)["jobs"]
    assert "data_starvation" not in {f["kind"] for f in job["findings"]}


def test_once_against_a_closed_port_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = closed_url()
    assert main(["serve", "--once", "--prometheus-url", url, "--query-timeout", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err).startswith(f"{url} unreachable: ")


def test_once_from_the_shell_prints_nothing_else() -> None:
    """Outside pytest no logging is configured: the service's own warnings would reach stderr
    through logging's last resort handler."""
    url = closed_url()
    proc = subprocess.run(
        [sys.executable, "-m", "auditor", "serve", "--once", "--prometheus-url", url],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("AUDITOR_")},
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    assert one_error_line(proc.stderr).startswith(f"{url} unreachable: ")


@pytest.mark.parametrize("absent", [("orjson",), ("orjson", "numpy")])
def test_without_the_serve_extra_one_line_names_it(
    absent: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training environment has neither orjson nor numpy (the [serve] extra): serve says
    what to install instead of an ImportError's traceback."""
    for name in absent:
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    assert main(["serve", "--once", "--prometheus-url", closed_url()]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    line = one_error_line(err)
    assert line.endswith("pip install gpu-balance-auditor[serve]")
    assert " and ".join(absent) in line


def test_prometheus_url_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = closed_url()
    monkeypatch.setenv("AUDITOR_PROMETHEUS_URL", url + "/")
    assert main(["serve", "--once"]) == 1
    assert one_error_line(capsys.readouterr().err).startswith(f"{url} unreachable: ")


def test_command_line_beats_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = closed_url()
    monkeypatch.setenv("AUDITOR_PROMETHEUS_URL", "localhost:9090")  # never read
    assert main(["serve", "--once", "--prometheus-url", url]) == 1
    assert one_error_line(capsys.readouterr().err).startswith(f"{url} unreachable: ")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--prometheus-url", "localhost:9090"],
            {},
            "--prometheus-url: expected an http(s) URL such as http://127.0.0.1:9090, "
            "got 'localhost:9090'",
        ),
        (
            [],
            {"AUDITOR_PROMETHEUS_URL": "ftp://prom"},
            "AUDITOR_PROMETHEUS_URL: expected an http(s) URL such as http://127.0.0.1:9090, "
            "got 'ftp://prom'",
        ),
        (["--set", "nosuchrule.x=1"], {}, "--set: unknown rule(s): nosuchrule; rules: "),
        (["--set", "data_starvation.nosuch=1"], {}, "--set: data_starvation: unknown threshold"),
        (["--interval", "0"], {}, "--interval: must be positive: 0"),
        (["--port", "70000"], {}, "--port: port out of range: 70000"),
    ],
    ids=["url", "url-env", "set-rule", "set-threshold", "interval", "port"],
)
def test_bad_options_exit_2_with_one_line(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--once", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err).startswith(message)


def test_port_in_use_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("auditor.serve")
    before = (list(logger.handlers), logger.level, logger.propagate)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--prometheus-url", closed_url()])
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err) == f"cannot listen on 127.0.0.1:{port}: Address already in use"
    # Nothing of the service's logging set-up is left behind.
    assert (list(logger.handlers), logger.level, logger.propagate) == before


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_service_survives_prometheus_down_and_stops_on_sigterm() -> None:
    """The whole command in its own process: it serves while Prometheus is down (503 on
    /healthz, prometheus_up 0), keeps retrying, and exits 0 on SIGTERM saying so."""
    url = closed_url()
    argv = [sys.executable, "-m", "auditor", "serve", "--port", "0"]
    argv += ["--prometheus-url", url, "--max-backoff", "0.2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUDITOR_")}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    stderr = proc.stderr
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stderr:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        seen.append(lines.get(timeout=120))
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)/metrics", seen[0])
        assert found, seen
        service = found.group(1)
        # The outage warning, then a retry: by then the first failure is published.
        while not any("still failing" in line for line in seen):
            seen.append(lines.get(timeout=120))
        code, body = get(service + "/healthz")
        assert code == 503
        assert json.loads(body)["reason"].startswith(f"{url} unreachable: ")  # never succeeded
        code, body = get(service + "/metrics")
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert [s.value for s in families["auditor_serve_prometheus_up"].samples] == [0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=30)
    while not lines.empty():
        seen.append(lines.get())
    assert seen[-1] == "auditor serve: INFO stopped\n", seen
    warnings = [line for line in seen if " WARNING " in line]
    assert len(warnings) == 1 and url in warnings[0], seen
