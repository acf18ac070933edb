"""``auditor dashboards push`` against a local fake of the Grafana HTTP API endpoints it uses:
GET /api/health, GET /api/folders, POST /api/folders, POST /api/dashboards/db."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
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
    # Failures of what stands at the URL rather than of Grafana's API: every request is answered
    # with a redirect to redirect_to, or with a web page, or after stall_s seconds.
    redirect_to: str | None = None
    html: bool = False
    stall_s: float = 0.0

    def handle(self, method: str, path: str, auth: str | None, body: Any) -> tuple[int, Any]:
        self.requests.append(Request(method, path, auth, body))
        if self.redirect_to:
            return 302, {}
        if self.html:
            return 200, b"<html><body>Welcome to nginx!</body></html>"
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


@contextlib.contextmanager
def serving(fake: FakeGrafana) -> Iterator[str]:
    """``fake`` behind a real HTTP server on 127.0.0.1; yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            status, answer = fake.handle(
                self.command, self.path, self.headers.get("Authorization"), body
            )
            time.sleep(fake.stall_s)
            data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
            try:
                self.send_response(status)
                kind = "text/html" if isinstance(answer, bytes) else "application/json"
                self.send_header("Content-Type", kind)
                if fake.redirect_to:
                    self.send_header("Location", fake.redirect_to + self.path)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped waiting (stall_s): what it says is the test's subject

        do_GET = _serve
        do_POST = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def grafana() -> Iterator[tuple[FakeGrafana, str]]:
    fake = FakeGrafana()
    with serving(fake) as url:
        yield fake, url


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


def test_a_redirect_is_reported_not_followed(grafana: tuple[FakeGrafana, str]) -> None:
    """urllib would send the token on to the host a redirect names: it is not followed."""
    fake, url = grafana
    elsewhere = FakeGrafana()
    with serving(elsewhere) as other:
        fake.redirect_to = other
        with pytest.raises(PushError) as caught:
            push(url, TOKEN, [d.to_dict() for d in dashboards()])
    assert "redirected (302)" in str(caught.value) and other in str(caught.value)
    assert "--grafana-url" in str(caught.value)
    assert not elsewhere.requests and len(fake.requests) == 1


def test_a_web_page_at_the_url_is_not_grafana(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    fake.html = True
    with pytest.raises(PushError, match=r"not JSON while trying to check its health.*Grafana's"):
        push(url, TOKEN, [])


def test_a_wrong_sub_path_says_so(grafana: tuple[FakeGrafana, str]) -> None:
    _, url = grafana
    with pytest.raises(PushError) as caught:
        push(url + "/grafana", TOKEN, [])
    assert "404" in str(caught.value) and "Not found" in str(caught.value)
    assert "sub-path" in str(caught.value)


def test_a_grafana_that_does_not_answer_in_time(grafana: tuple[FakeGrafana, str]) -> None:
    fake, url = grafana
    fake.stall_s = 1.0
    with pytest.raises(PushError, match=r"did not answer within 0\.2 s .* check its health"):
        push(url, TOKEN, [], timeout=0.2)


def test_a_server_that_does_not_speak_http() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def banner() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

        thread = threading.Thread(target=banner, daemon=True)
        thread.start()
        with pytest.raises(PushError, match=r"sent no HTTP answer .* is the URL Grafana's"):
            push(f"http://127.0.0.1:{port}", TOKEN, [])
        thread.join(timeout=5)


def test_a_host_that_does_not_resolve() -> None:
    # .invalid never resolves (RFC 2606).
    with pytest.raises(PushError, match=r"cannot reach Grafana at http://grafana\.invalid"):
        push("http://grafana.invalid:3000", TOKEN, [], timeout=5)


@pytest.mark.parametrize("token", [TOKEN + "\nsecond-line", "glsa_ünicode", "two words"])
def test_a_token_that_cannot_go_in_a_header(
    token: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """http.client would refuse it with an error that quotes the whole value."""
    with pytest.raises(PushError, match="a token is one word") as caught:
        push("http://127.0.0.1:1", token, [])
    assert token not in str(caught.value)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n", encoding="utf-8")
    argv = ["dashboards", "push", "--grafana-url", "http://127.0.0.1:1"]
    assert main([*argv, "--grafana-token-file", str(token_file)]) == 2
    err = capsys.readouterr().err
    assert "a token is one word" in err and token not in err and TOKEN not in err


def test_push_needs_no_http_client_package() -> None:
    """The auditor lives in users' training environments: pushing dashboards must not need a
    package that replaces their urllib3 (grafana-client brought urllib3-future)."""
    code = (
        "import sys, auditor.ops.push, auditor.cli\n"
        "roots = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(roots & {'grafana_client', 'niquests', 'urllib3', 'requests', 'httpx'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
