"""``auditor dashboards push`` against a local fake of the Grafana HTTP API endpoints it uses:
GET /api/health, GET /api/folders, POST /api/folders, POST /api/dashboards/db."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from auditor.cli import main
from auditor.cli.dashboards import PUSH_OPTIONS
from auditor.ops.push import PushError, push
from auditor.ops.render import dashboards

TOKEN = "glsa_test-Token-0123456789abcdef"


@dataclass
class Request:
    method: str
    path: str
    authorization: str | None
    body: Any


@dataclass
class FakeGrafana:
    """Grafana's documented answers for the four endpoints, with a switch per failure."""

    token: str = TOKEN
    folders: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    dashboard_status: int = 200
    echo_token_in_error: bool = False
    versions: dict[str, int] = field(default_factory=dict)

    def handle(self, method: str, path: str, auth: str | None, body: Any) -> tuple[int, Any]:
        self.requests.append(Request(method, path, auth, body))
        if method == "GET" and path == "/api/health":
            return 200, {"commit": "abc", "database": "ok", "version": "11.2.0"}
        if auth != f"Bearer {self.token}":
            return 401, {"message": "Invalid API key", "traceID": ""}
        if method == "GET" and path.split("?")[0] == "/api/folders":
            return 200, [
                {"id": f["id"], "uid": f["uid"], "title": f["title"]} for f in self.folders
            ]
        if method == "POST" and path == "/api/folders":
            folder = {"id": len(self.folders) + 1, "uid": f"f{len(self.folders) + 1}", **body}
            self.folders.append(folder)
            return 200, folder
        if method == "POST" and path == "/api/dashboards/db":
            if self.echo_token_in_error:
                return 500, {"message": f"internal error for Bearer {auth}"}
            if self.dashboard_status != 200:
                return self.dashboard_status, {"message": "Access denied"}
            uid = body["dashboard"]["uid"]
            self.versions[uid] = self.versions.get(uid, 0) + 1
            return 200, {
                "id": len(self.versions),
                "uid": uid,
                "url": f"/d/{uid}/{uid}",
                "status": "success",
                "version": self.versions[uid],
                "slug": uid,
            }
        return 404, {"message": "Not found"}

    def posted_dashboards(self) -> list[Any]:
        return [q.body for q in self.requests if q.path == "/api/dashboards/db"]


@pytest.fixture
def grafana() -> Iterator[tuple[FakeGrafana, str]]:
    fake = FakeGrafana()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            status, answer = fake.handle(
                self.command, self.path, self.headers.get("Authorization"), body
            )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AUDITOR_GRAFANA_TOKEN", raising=False)
    monkeypatch.delenv("AUDITOR_GRAFANA_TOKEN_FILE", raising=False)
    monkeypatch.delenv("AUDITOR_GRAFANA_URL", raising=False)
    monkeypatch.delenv("AUDITOR_GRAFANA_FOLDER", raising=False)


def test_push_creates_the_folder_and_posts_every_dashboard(
    grafana: tuple[FakeGrafana, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, url = grafana
    monkeypatch.setenv("AUDITOR_GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--grafana-url", url]) == 0
    calls = [(q.method, q.path.split("?")[0]) for q in fake.requests]
    expected = [d.to_dict() for d in dashboards()]
    assert calls == [
        ("GET", "/api/health"),
        ("GET", "/api/folders"),
        ("POST", "/api/folders"),
        *[("POST", "/api/dashboards/db")] * len(expected),
    ]
    assert fake.requests[2].body == {"title": "GPU Balance Auditor"}
    assert all(q.authorization == f"Bearer {TOKEN}" for q in fake.requests[1:])
    assert fake.posted_dashboards() == [
        {"dashboard": d, "folderUid": "f1", "overwrite": True} for d in expected
    ]
    out, err = capsys.readouterr()
    for d in expected:
        assert f"{url}/d/{d['uid']}/{d['uid']} version 1" in out
    assert TOKEN not in out + err


def test_push_reuses_an_existing_folder_and_overwrites(
    grafana: tuple[FakeGrafana, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, url = grafana
    fake.folders.append({"id": 9, "uid": "ops-folder", "title": "Ops"})
    monkeypatch.setenv("AUDITOR_GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--grafana-url", url, "--folder", "Ops"]) == 0
    assert main(["dashboards", "push", "--grafana-url", url, "--folder", "Ops"]) == 0
    assert not [q for q in fake.requests if q.method == "POST" and q.path == "/api/folders"]
    assert {p["folderUid"] for p in fake.posted_dashboards()} == {"ops-folder"}
    assert set(fake.versions.values()) == {2}
    assert "version 2" in capsys.readouterr().out


def test_a_token_file_works(
    grafana: tuple[FakeGrafana, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, url = grafana
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert (
        main(["dashboards", "push", "--grafana-url", url, "--grafana-token-file", str(token_file)])
        == 0
    )
    assert len(fake.posted_dashboards()) == len(dashboards())
    # The environment twin of the option, and of the URL.
    fake.requests.clear()
    monkeypatch.setenv("AUDITOR_GRAFANA_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("AUDITOR_GRAFANA_URL", url)
    assert main(["dashboards", "push"]) == 0
    assert len(fake.posted_dashboards()) == len(dashboards())


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    assert err.count("\n") == 1 and err.startswith("auditor: error: "), err
    return err


def test_401_is_a_clear_error_without_the_token(
    grafana: tuple[FakeGrafana, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, url = grafana
    fake.token = "some-other-token"
    monkeypatch.setenv("AUDITOR_GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--grafana-url", url]) == 1
    err = _one_line_error(capsys)
    assert "401" in err and "AUDITOR_GRAFANA_TOKEN" in err
    assert not fake.posted_dashboards()


def test_403_names_the_missing_permission(
    grafana: tuple[FakeGrafana, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, url = grafana
    fake.dashboard_status = 403
    monkeypatch.setenv("AUDITOR_GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--grafana-url", url]) == 1
    err = _one_line_error(capsys)
    assert "403" in err and "Editor" in err and "auditor-cluster" in err


def test_the_token_never_appears_in_errors(grafana: tuple[FakeGrafana, str]) -> None:
    """Not in the message, not in a chained exception, even when the server echoes it."""
    fake, url = grafana
    fake.echo_token_in_error = True
    with pytest.raises(PushError) as caught:
        push(url, TOKEN, [d.to_dict() for d in dashboards()])
    exc = caught.value
    assert "500" in str(exc) and "***" in str(exc)
    assert TOKEN not in str(exc) and TOKEN not in repr(exc)
    assert exc.__cause__ is None and exc.__suppress_context__


def test_unreachable_grafana(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Closed now: nothing listens on the port.
    monkeypatch.setenv("AUDITOR_GRAFANA_TOKEN", TOKEN)
    assert main(["dashboards", "push", "--grafana-url", f"http://127.0.0.1:{port}"]) == 1
    err = _one_line_error(capsys)
    assert "cannot reach Grafana" in err and f"127.0.0.1:{port}" in err


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["dashboards", "push", "--grafana-url", "http://127.0.0.1:1"],
            {},
            "AUDITOR_GRAFANA_TOKEN",
        ),
        (["dashboards", "push"], {"AUDITOR_GRAFANA_TOKEN": TOKEN}, "--grafana-url"),
        (
            [
                "dashboards",
                "push",
                "--grafana-url",
                "http://127.0.0.1:1",
                "--grafana-token-file",
                "/nonexistent/t",
            ],
            {},
            "cannot read the Grafana token file",
        ),
        # A token pasted where the file goes is not printed back.
        (
            [
                "dashboards",
                "push",
                "--grafana-url",
                "http://127.0.0.1:1",
                "--grafana-token-file",
                TOKEN,
            ],
            {},
            "No such file",
        ),
        # No flag carries the token itself.
        (
            ["dashboards", "push", "--grafana-url", "http://127.0.0.1:1", "--grafana-token", TOKEN],
            {},
            "--grafana-token is not accepted",
        ),
    ],
)
def test_usage_errors(
    argv: list[str],
    env: dict[str, str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    assert err.count("\n") == 1 and err.startswith("auditor: error: ") and message in err


def test_an_empty_token_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("\n")
    argv = ["dashboards", "push", "--grafana-url", "http://127.0.0.1:1"]
    assert main([*argv, "--grafana-token-file", str(token_file)]) == 2
    assert "empty" in capsys.readouterr().err


def test_urls_with_credentials_are_refused(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    with pytest.raises(PushError, match="no credentials in the URL"):
        push(url.replace("http://", "http://admin:secret@"), TOKEN, [])
    assert not fake.requests


def test_only_the_token_file_is_an_option() -> None:
    assert [o.dest for o in PUSH_OPTIONS if "token" in o.dest] == ["grafana_token_file"]
    assert {o.env for o in PUSH_OPTIONS} == {
        "AUDITOR_GRAFANA_URL",
        "AUDITOR_GRAFANA_FOLDER",
        "AUDITOR_GRAFANA_TOKEN_FILE",
    }
