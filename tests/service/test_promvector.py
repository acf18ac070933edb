"""The service's fast decoder of Prometheus' vector answers (auditor.metrics.promvector) against
the general one (orjson, then one value per series): the same labels and the same values, bit for
bit, on answers as Prometheus writes them (compact) and as ``json.dumps`` does (the benchmark's);
and None, so the client decodes the general way, on anything else."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import orjson
import pytest

from auditor.metrics.promvector import LabelCache, _first_byte, _numbers, decode_vector
from auditor.metrics.query import PrometheusClient, PrometheusError
from auditor.service.columns import RANK, Columns


def answer(result: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": result}, **extra}


def series(labels: dict[str, str], value: str, at: float = 1700000000.781) -> dict[str, Any]:
    return {"metric": labels, "value": [at, value]}


def compact(payload: Any) -> bytes:
    """As Prometheus writes it (Go: no spaces, "<" escaped)."""
    return json.dumps(payload, separators=(",", ":")).replace("<", "\\u003c").encode()


def spaced(payload: Any) -> bytes:
    """As json.dumps writes it by default (the benchmark's answers)."""
    return json.dumps(payload).encode()


def general(body: bytes) -> tuple[list[dict[str, str]], list[int]]:
    """The general decoding: labels as decoded, values as numpy reads the strings (as bits)."""
    result = orjson.loads(body)["data"]["result"]
    values = np.array([r["value"][1] for r in result], dtype=np.float64)
    return [r["metric"] for r in result], values.view(np.int64).tolist()


def fast(body: bytes, cache: LabelCache | None = None) -> tuple[list[dict[str, str]], list[int]]:
    decoded = decode_vector(body, cache)
    assert decoded is not None, body[:200]
    labels, values = decoded
    return list(labels), values.view(np.int64).tolist()


# Every value form Go's FormatFloat(v, 'f', -1, 64) writes, and a few Python's repr does.
VALUES = [
    "0",
    "1",
    "-0",
    "0.25",
    "-3.5",
    "244.95967466196072",
    "1700000000.781",
    "NaN",
    "+Inf",
    "-Inf",
    "123456789012345678901234567890",
    "0." + "0" * 300 + "1",  # 1e-301 in 'f' form: longer than the decoder's window
    "1e-07",
    "2.5E+10",
]
LABELS = [
    {"auditor_job": "train", "rank": "0"},
    {"auditor_job": "train"},  # Prometheus leaves out empty labels
    {},
    {"auditor_job": 'we"ird\\job', "rank": "12"},
    {"node": "<host>&", "rank": "3"},
    {"note": '"value":[1,"2"]', "x": "[]{}:,"},
    {"uuid": "GPU-ü-∑-🙂", "rank": "7"},
]


@pytest.mark.parametrize("encode", [compact, spaced])
def test_decodes_as_the_general_decoder(encode: Any) -> None:
    result = [
        series(labels, value)
        for labels in LABELS
        for value in VALUES
        if value != "1e-07" or labels  # a mix, not every pair
    ]
    body = encode(answer(result))
    assert fast(body) == general(body)


@pytest.mark.parametrize("encode", [compact, spaced])
def test_random_answers(encode: Any) -> None:
    rng = random.Random(7)
    for _ in range(30):
        n = rng.randrange(0, 60)
        result = []
        for i in range(n):
            x = rng.choice([rng.uniform(-1e6, 1e6), rng.random(), float(rng.randrange(1000))])
            text = rng.choice([repr(x), "NaN", "+Inf", f"{x:.3f}", str(int(x))])
            labels = {"auditor_job": rng.choice(["a", "b", ""]), "rank": str(i)}
            labels = {k: v for k, v in labels.items() if v}
            at = rng.choice([1700000000, 1700000000.5, 1700000000.781])
            result.append(series(labels, text, at))
        body = encode(answer(result))
        assert fast(body) == general(body)


@pytest.mark.parametrize("encode", [compact, spaced])
def test_empty_answer(encode: Any) -> None:
    labels, values = fast(encode(answer([])))
    assert labels == [] and values == []


@pytest.mark.parametrize(
    "payload",
    [
        {"status": "error", "errorType": "bad_data", "error": "parse error"},
        {"status": "success", "data": {"resultType": "matrix", "result": []}},
        {"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}},
        # warnings after the data: left to the general decoder
        answer([series({"rank": "0"}, "1")], warnings=["too many samples"]),
        # a value with an escape (JSON allows it; Prometheus does not write it): see below
        answer([series({"rank": "0"}, "ESCAPED")]),
        # a native histogram instead of a value
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": {}, "histogram": [1, {"count": "1", "sum": "2"}]}],
            },
        },
        # an extra field in a series
        answer([{"metric": {"rank": "0"}, "value": [1, "1"], "extra": 1}]),
        # the value before the labels
        answer([{"value": [1, "1"], "metric": {"rank": "0"}}]),
        # not a number
        answer([series({"rank": "0"}, "one")]),
        answer([series({"rank": "0"}, "")]),
    ],
)
def test_anything_else_is_left_to_the_general_decoder(payload: Any) -> None:
    for body in (compact(payload), spaced(payload)):
        body = body.replace(b'"ESCAPED"', b'"1\\u0030"')  # "10", escaped
        assert decode_vector(body) is None


# Value strings around the edges of the fast reading: orjson's numbers (an integer, "-0",
# exponents, more digits than a double holds, as long as the decoder's window and one longer)
# and what it refuses, which numpy reads instead ("01", "1.", ".5": float() takes them).
EDGES = [
    "-0",
    "-0.0",
    "0.1",
    "9007199254740993",
    "18446744073709551616",
    "1e5",
    "1E-5",
    "-2.5e+300",
    "4.9e-324",
    "0.30000000000000004",
    "-1234567890.123456789012345678",  # 30 bytes
    "1" * 31,
    "2" * 32,
    "3" * 33,
]


@pytest.mark.parametrize("encode", [compact, spaced])
@pytest.mark.parametrize("odd", [None, "01", "1.", ".5", "NaN", "-Inf"])
def test_edges_of_the_fast_reading(encode: Any, odd: str | None) -> None:
    values = EDGES if odd is None else [*EDGES, odd]
    body = encode(answer([series({"rank": str(i)}, v) for i, v in enumerate(values)]))
    assert fast(body) == general(body)  # as bits: "-0" keeps its sign


def test_first_byte_of_words() -> None:
    words = [b'"abcdefg', b'a"bcdefg', b'abcdefg"', b"abcdefgh", b'ab""cdef', b"\0\0\0\0\0\0\0\0"]
    found = _first_byte(np.array([int.from_bytes(w, "little") for w in words], np.uint64), ord('"'))
    assert found.tolist() == [0, 1, 7, 8, 2, 8]


def _laid(strings: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as the decoder holds them: their first four words, word q of each in row q,
    each followed by its closing quote."""
    padded = [(s + b'"]').ljust(40, b"\0") for s in strings]
    text = np.array(
        [[int.from_bytes(p[8 * q : 8 * q + 8], "little") for p in padded] for q in range(4)],
        dtype=np.uint64,
    )
    return text, np.array([len(s) for s in strings], dtype=np.intp)


def test_numbers_read_as_float_does() -> None:
    strings = [b"0", b"-0", b"244.95967466196072", b"1e5", b"-3.5", b"NaN", b"9" * 25]
    text, length = _laid(strings)
    plain = np.array([True, True, True, True, True, False, True])
    negative = np.array([s.startswith(b"-") for s in strings])
    values = _numbers(text, length, plain, negative)
    assert values is not None
    want = [float(s) for s in strings]
    want[5] = math.nan  # not plain: left to the caller
    assert values.view(np.int64).tolist() == np.array(want).view(np.int64).tolist()
    # One orjson refuses (JSON has no leading zeros) or reads as more than one number.
    for bad in (b"01", b"1,2", b"1 2", b"1]"):
        text, length = _laid([b"1", bad])
        assert _numbers(text, length, np.array([True, True]), np.array([False, False])) is None


def test_not_json_is_refused() -> None:
    good = compact(answer([series({"rank": "0"}, "1")]))
    for body in (
        good[:-1],
        good.replace(b"1700000000.781", b"17000000\x0000.781"),
        good.replace(b'"1"]', b'"1\x00"]'),
        good.replace(b'"value":[1700000000.781,', b'"value":[1700000000.781'),
        good.replace(b"1700000000.781", b""),
        b"",
        b"[]",
    ):
        assert decode_vector(body) is None, body


def test_answers_of_one_shape_share_their_labels() -> None:
    cache = LabelCache(size=2)
    ranks = [{"auditor_job": "j", "rank": str(r)} for r in range(50)]
    a = compact(answer([series(x, "1") for x in ranks]))
    b = compact(answer([series(x, repr(r / 3)) for r, x in enumerate(ranks)]))
    gpus = compact(answer([series({"uuid": f"GPU-{r}"}, "2") for r in range(50)]))
    la, lb, lg = (decode_vector(body, cache) for body in (a, b, gpus))
    assert la is not None and lb is not None and lg is not None
    assert la[0] is lb[0] and la[0] == tuple(ranks)  # decoded once, shared
    assert lg[0] is not la[0]
    assert lb[1].tolist() == [r / 3 for r in range(50)]
    # The cache keeps the shapes used last: a third one pushes out the oldest.
    other = compact(answer([series({"node": "n"}, "3")]))
    assert decode_vector(other, cache) is not None
    again = decode_vector(a, cache)
    assert again is not None and again[0] is not la[0] and again[0] == tuple(ranks)
    # Shared label lists line up at once in the rebuild's columns.
    index = {("j", str(r)): r for r in range(50)}
    columns = Columns(index, RANK)
    from auditor.metrics.query import Vector

    first = columns.rows(Vector(la[0], la[1]))
    assert columns.rows(Vector(lb[0], lb[1])) is first
    assert first.tolist() == list(range(50))


class _Body:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def __enter__(self) -> _Body:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self) -> bytes:
        return self.body


def _client(bodies: list[bytes]) -> PrometheusClient:
    queue = list(bodies)
    return PrometheusClient("http://prom:9090", opener=lambda req, timeout: _Body(queue.pop(0)))


def test_client_falls_back_to_the_general_decoder() -> None:
    ok = answer([series({"rank": "0"}, "0.5"), series({"rank": "1"}, "NaN")])
    escaped = compact(ok).replace(b'"0.5"', b'"0.\\u0035"')  # 0.5, escaped
    warned = compact(answer([series({"rank": "0"}, "+Inf")], warnings=["w"]))
    client = _client([compact(ok), escaped, warned])
    for want in ([0.5, math.nan], [0.5, math.nan], [math.inf]):
        vector = client.vector("q", at=1.0)
        assert np.array_equal(vector.values, want, equal_nan=True)
    assert client.requests == 3


def test_client_errors_are_still_errors() -> None:
    bad = compact({"status": "error", "errorType": "bad_data", "error": "parse\nerror"})
    matrix = compact({"status": "success", "data": {"resultType": "matrix", "result": []}})
    client = _client([bad, matrix, b"not json"])
    for text in ("query failed: parse error", "expected a vector", "not JSON"):
        with pytest.raises(PrometheusError, match=text):
            client.vector("q")
