"""PrometheusClient against a real HTTP server that answers /api/v1/query with canned bodies.

The server picks its answer by the ``query`` form field, so one server covers every case: the
answer shapes Prometheus sends (vector, matrix; values as strings, "NaN" and "+Inf" included)
and each way a query can fail. Every failure must come out as one PrometheusError whose message
is one line naming the server and the cause.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from auditor.metrics.query import PrometheusClient, PrometheusError, Series, check_url

VECTOR = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {"metric": {"auditor_job": "train", "rank": "0"}, "value": [1700000000.5, "0.25"]},
            {"metric": {"auditor_job": "train", "rank": "1"}, "value": [1700000000.5, "NaN"]},
            {"metric": {"auditor_job": "train", "rank": "2"}, "value": [1700000000.5, "+Inf"]},
        ],
    },
}
MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [
            {
                "metric": {"__name__": "auditor_rank_up", "auditor_job": "train", "rank": "0"},
                "values": [[1700000000, "1"], [1700000015, "1"], [1700000030, "0"]],
            },
            {"metric": {"auditor_job": "train", "rank": "1"}, "values": []},
        ],
    },
}
BAD_DATA = {
    "status": "error",
    "errorType": "bad_data",
    # Prometheus' parse errors span lines; the client's message must not.
    "error": 'parse error at char 9:\nunexpected "}" in label matching',
}


@dataclass
class Canned:
    code: int
    body: bytes
    content_type: str = "application/json"
    hold: threading.Event | None = None  # answer only once this is set
    length: int | None = None  # a Content-Length that lies (a connection cut mid-answer)


def _json(payload: Any, code: int = 200) -> Canned:
    return Canned(code, json.dumps(payload).encode())


@dataclass
class FakePrometheus:
    url: str
    answers: dict[str, Canned]
    forms: list[dict[str, list[str]]] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def release() -> Iterator[threading.Event]:
    """Holds the slow answer; set at teardown so the held handler thread ends."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture(scope="module")
def prom(release: threading.Event) -> Iterator[FakePrometheus]:
    answers = {
        "vector": _json(VECTOR),
        "matrix": _json(MATRIX),
        "scalar": _json(
            {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2"]}}
        ),
        "bad": _json(BAD_DATA, code=400),
        "error-200": _json({"status": "error", "error": "query\ntimed out"}),
        "no-data": _json({"status": "success"}),
        "unavailable": Canned(503, b"<html>upstream\nunavailable</html>", "text/html"),
        "not-json": Canned(200, b"<html>a login page</html>", "text/html"),
        "slow": Canned(200, json.dumps(VECTOR).encode(), hold=release),
        "cut": Canned(200, b'{"status": "succ', length=4096),
    }
    fake = FakePrometheus(url="", answers=answers)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            form = urllib.parse.parse_qs(raw.decode())
            fake.forms.append(form)
            fake.methods.append(self.command)
            fake.paths.append(self.path)
            canned = fake.answers[form["query"][0]]
            if canned.hold is not None:
                canned.hold.wait(timeout=60)
            try:
                self.send_response(canned.code)
                self.send_header("Content-Type", canned.content_type)
                self.send_header("Content-Length", str(canned.length or len(canned.body)))
                self.end_headers()
                self.wfile.write(canned.body)
            except OSError:
                pass  # the client gave up first (the slow case)
            if canned.length is not None:
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def closed_port() -> int:
    """A port nothing listens on: bound to find it free, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _values(series: Series) -> list[float]:
    return [v for _, v in series.samples]


def test_vector_answer_parses_labels_times_and_special_values(prom: FakePrometheus) -> None:
    client = PrometheusClient(prom.url)
    series = client.query("vector")
    assert [s.labels for s in series] == [
        {"auditor_job": "train", "rank": "0"},
        {"auditor_job": "train", "rank": "1"},
        {"auditor_job": "train", "rank": "2"},
    ]
    assert series[0].samples == ((1700000000.5, 0.25),)
    assert series[0].last == (1700000000.5, 0.25)
    assert math.isnan(series[1].samples[0][1])
    assert series[2].samples[0][1] == math.inf
    assert client.requests == 1


def test_matrix_answer_keeps_every_raw_sample_oldest_first(prom: FakePrometheus) -> None:
    series = PrometheusClient(prom.url).query("matrix")
    assert series[0].labels == {"__name__": "auditor_rank_up", "auditor_job": "train", "rank": "0"}
    assert series[0].samples == ((1700000000.0, 1.0), (1700000015.0, 1.0), (1700000030.0, 0.0))
    assert series[0].last == (1700000030.0, 0.0)
    assert series[1].samples == ()
    assert series[1].last is None


def test_request_is_a_form_post_with_query_time_and_timeout(prom: FakePrometheus) -> None:
    client = PrometheusClient(prom.url + "/", timeout_s=7.5)
    client.query("vector", at=1700000123.456789)
    assert prom.methods[-1] == "POST"
    assert prom.paths[-1] == "/api/v1/query"
    assert prom.forms[-1] == {
        "query": ["vector"],
        "time": ["1700000123.457"],
        "timeout": ["7.5s"],
    }
    client.query("vector")  # no time: Prometheus' own "now"
    assert prom.forms[-1] == {"query": ["vector"], "timeout": ["7.5s"]}


def test_long_selectors_travel_in_the_body(prom: FakePrometheus) -> None:
    """A 4,096-rank selector would not fit in a URL; the body carries it, encoded."""
    expr = (
        'max by (auditor_job, rank) (auditor_rank_up{rank=~"'
        + "|".join(map(str, range(4096)))
        + '"})'
    )
    prom.answers[expr] = _json(VECTOR)
    PrometheusClient(prom.url).query(expr)
    assert prom.forms[-1]["query"] == [expr]
    assert prom.paths[-1] == "/api/v1/query"


def _failure(client: PrometheusClient, expr: str) -> str:
    with pytest.raises(PrometheusError) as info:
        client.query(expr)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(client.url), message
    return message


@pytest.mark.parametrize(
    ("expr", "cause"),
    [
        ("bad", 'HTTP 400: parse error at char 9: unexpected "}" in label matching'),
        ("unavailable", "HTTP 503: Service Unavailable"),
        ("not-json", "answer is not JSON"),
        ("error-200", "query failed: query timed out"),
        ("no-data", "answer has no data"),
        ("scalar", "unexpected result type 'scalar' for 'scalar'"),
    ],
)
def test_failed_answers_are_one_line_errors_naming_server_and_cause(
    prom: FakePrometheus, expr: str, cause: str
) -> None:
    message = _failure(PrometheusClient(prom.url), expr)
    assert message == f"{prom.url}: {cause}"


def test_answer_cut_mid_body_is_a_prometheus_error(prom: FakePrometheus) -> None:
    message = _failure(PrometheusClient(prom.url), "cut")
    assert message.startswith(f"{prom.url}: broken HTTP answer: IncompleteRead(")


def test_slow_answer_beyond_the_timeout_is_a_prometheus_error(prom: FakePrometheus) -> None:
    client = PrometheusClient(prom.url, timeout_s=0.3)
    message = _failure(client, "slow")
    assert message == f"{prom.url}: no answer within 0.3 s"
    assert prom.forms[-1]["timeout"] == ["0.3s"]  # Prometheus is told the same bound


def test_closed_port_is_unreachable() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{closed_port()}")
    message = _failure(client, "up")
    assert message.startswith(f"{client.url} unreachable: ")
    assert "refused" in message.lower()


def test_server_that_does_not_speak_http_is_a_prometheus_error() -> None:
    """A URL pointing at some other TCP service (a mistyped port) is a failure to report,
    not a crash."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            _read_request(conn)  # closing on unread data would reset the connection instead
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        message = _failure(PrometheusClient(f"http://127.0.0.1:{port}"), "up")
    finally:
        thread.join(timeout=30)
        listener.close()
    url = f"http://127.0.0.1:{port}"
    assert message == f"{url}: broken HTTP answer: BadStatusLine('SSH-2.0-OpenSSH_9.2\\r\\n')"


def _read_request(conn: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = conn.recv(65536)
        if not chunk:
            return
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


def test_opener_is_injectable_and_gets_the_request_and_a_timeout() -> None:
    seen: list[tuple[str, float]] = []

    class Answer:
        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self) -> bytes:
            return json.dumps(VECTOR).encode()

    def opener(request: Any, timeout: float) -> Answer:
        seen.append((request.full_url, timeout))
        return Answer()

    client = PrometheusClient("http://prom.example:9090", timeout_s=3.0, opener=opener)
    assert len(client.query("up")) == 3
    # The client waits longer than the server-side timeout, so Prometheus' own answer wins.
    [(url, timeout)] = seen
    assert url == "http://prom.example:9090/api/v1/query"
    assert timeout > 3.0


@pytest.mark.parametrize("url", ["localhost:9090", "ftp://x", "", "http://", "  "])
def test_check_url_rejects_what_is_not_an_http_url_with_a_host(url: str) -> None:
    with pytest.raises(ValueError, match="expected an http\\(s\\) URL"):
        check_url(url)
    with pytest.raises(ValueError, match="expected an http\\(s\\) URL"):
        PrometheusClient(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:9090/", "http://127.0.0.1:9090"),
        (" https://prom.example/prometheus/ ", "https://prom.example/prometheus"),
        ("http://prom:9090", "http://prom:9090"),
    ],
)
def test_check_url_strips_the_trailing_slash(url: str, expected: str) -> None:
    assert check_url(url) == expected
    assert PrometheusClient(url).url == expected


def test_vector_answers_come_column_wise() -> None:
    """The service's path: labels as decoded, values parsed from Prometheus' strings."""

    class Answer:
        def __init__(self, payload: dict[str, Any]) -> None:
            self._body = json.dumps(payload).encode()

        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def read(self) -> bytes:
            return self._body

    answers = [VECTOR, MATRIX]
    client = PrometheusClient(
        "http://prom.example:9090", opener=lambda r, t: Answer(answers.pop(0))
    )
    vector = client.vector("up")
    assert vector.label("rank") == ["0", "1", "2"]
    assert (
        vector.values[0] == 0.25 and math.isnan(vector.values[1]) and vector.values[2] == math.inf
    )
    with pytest.raises(PrometheusError, match="expected a vector"):
        client.vector("up[60s]")
