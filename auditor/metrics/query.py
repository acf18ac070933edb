"""A small client for Prometheus' HTTP query API (``/api/v1/query``), for ``auditor serve``.

Only what the service needs: instant queries returning vectors or, for a range selector such as
``metric[60s]``, the raw samples of each series (no resampling, no extrapolation: the snapshot
builder differences counters itself). Every failure -- unreachable, timed out, an HTTP error, an
error payload, an answer that is not JSON -- is one :class:`PrometheusError` with a one-line
message, so the caller has a single thing to retry on.

The opener is a parameter (``urllib``'s by default) so tests can count or fail requests without
patching anything global.

Answers are decoded with orjson (about twice as fast as ``json`` on the service's answers, some
180,000 series at 4,096 ranks). :meth:`PrometheusClient.vector` keeps an instant vector
column-wise (:class:`Vector`: each series' labels, the values in one array) instead of an object
per series, which is what the service reads; it reads Prometheus' usual answer straight from the
bytes (:mod:`.promvector`: no object per series, labels decoded once per shape).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from .promvector import LabelCache, decode_vector

Opener = Callable[[urllib.request.Request, float], Any]


class PrometheusError(RuntimeError):
    """Prometheus could not answer a query; the message is one line and names the server."""


@dataclass(frozen=True)
class Series:
    """One series of a query answer: its labels and ``(time, value)`` samples, oldest first."""

    labels: dict[str, str]
    samples: tuple[tuple[float, float], ...]

    @property
    def last(self) -> tuple[float, float] | None:
        return self.samples[-1] if self.samples else None


@dataclass(frozen=True)
class Vector:
    """An instant vector column-wise: series ``i`` has labels ``labels[i]`` and value
    ``values[i]`` (NaN where Prometheus answered NaN)."""

    labels: Sequence[Mapping[str, str]]
    values: npt.NDArray[np.float64]

    def __len__(self) -> int:
        return len(self.labels)

    def label(self, name: str) -> list[str]:
        """Every series' value of label ``name`` ("" where absent)."""
        return [labels.get(name, "") for labels in self.labels]

    @classmethod
    def of(cls, series: Sequence[Series]) -> Vector:
        """The latest sample of each series (series without samples left out)."""
        kept = [s for s in series if s.samples]
        return cls(
            [s.labels for s in kept],
            np.array([s.samples[-1][1] for s in kept], dtype=np.float64),
        )


def _open(request: urllib.request.Request, timeout: float) -> Any:
    return urllib.request.urlopen(request, timeout=timeout)


def check_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError unless it is an http(s) URL with a host."""
    parsed = urllib.parse.urlparse(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"expected an http(s) URL such as http://127.0.0.1:9090, got {url!r}")
    return url.strip().rstrip("/")


class PrometheusClient:
    """Queries one Prometheus server; ``timeout_s`` bounds each request, client and server side."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, opener: Opener | None = None) -> None:
        self.url = check_url(url)
        self.timeout_s = timeout_s
        self._open = opener or _open
        self.requests = 0  # queries sent, for the service's own accounting
        # The labels of the answers' shapes seen last (shared by most answers, and from one
        # evaluation to the next): decoded once, not once an answer.
        self.labels = LabelCache()

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """An instant query at ``at`` (seconds since the epoch; Prometheus' now if None).

        A vector answer gives one sample per series; a matrix answer (``metric[60s]``) gives
        every raw sample in the range. Scalars and strings are not used by the service.
        """
        data = self._data(self._post("/api/v1/query", self._params(expr, at)))
        kind = data.get("resultType")
        result = data.get("result") or []
        if kind == "vector":
            return [
                Series(dict(r["metric"]), ((float(r["value"][0]), _float(r["value"][1])),))
                for r in result
            ]
        if kind == "matrix":
            return [
                Series(
                    dict(r["metric"]), tuple((float(t), _float(v)) for t, v in r.get("values", []))
                )
                for r in result
            ]
        raise PrometheusError(f"{self.url}: unexpected result type {kind!r} for {expr!r}")

    def vector(self, expr: str, at: float | None = None) -> Vector:
        """An instant query whose answer is a vector, column-wise (no object per series: the
        labels stay the dicts the decoder built, the values go straight into one array)."""
        raw = self._post("/api/v1/query", self._params(expr, at))
        fast = decode_vector(raw, self.labels)
        if fast is not None:
            return Vector(*fast)
        data = self._data(raw)  # anything else (an error, warnings): the general decoder
        kind = data.get("resultType")
        result = data.get("result") or []
        if kind != "vector":
            raise PrometheusError(f"{self.url}: expected a vector for {expr!r}, got {kind!r}")
        try:
            # Values come as strings ("NaN", "+Inf" included): numpy parses them in one call.
            values = np.array([r["value"][1] for r in result], dtype=np.float64)
            labels = [r["metric"] for r in result]
        except (KeyError, IndexError, TypeError, ValueError):
            raise PrometheusError(f"{self.url}: malformed vector for {expr!r}") from None
        return Vector(labels, values)

    def _params(self, expr: str, at: float | None) -> dict[str, str]:
        params = {"query": expr, "timeout": f"{self.timeout_s:g}s"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return params

    def _post(self, path: str, params: dict[str, str]) -> bytes:
        """The answer's body, as sent."""
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(
            self.url + path,
            data=body,  # POST: long selectors do not fit in a URL
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            method="POST",
        )
        self.requests += 1
        # The client waits a little longer than the server-side timeout so Prometheus' own
        # "query timed out" answer arrives instead of a bare socket timeout.
        try:
            with self._open(request, self.timeout_s + 2.0) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{self.url}: HTTP {exc.code}: {_error_text(exc)}") from None
        except urllib.error.URLError as exc:
            raise PrometheusError(f"{self.url} unreachable: {exc.reason}") from None
        except TimeoutError:
            raise PrometheusError(f"{self.url}: no answer within {self.timeout_s:g} s") from None
        except http.client.HTTPException as exc:  # not HTTP (a wrong port), or cut off midway
            text = _one_line(repr(exc))
            raise PrometheusError(f"{self.url}: broken HTTP answer: {text}") from None
        except (ConnectionError, OSError) as exc:
            raise PrometheusError(f"{self.url} unreachable: {exc}") from None
        return bytes(raw)

    def _data(self, raw: bytes) -> dict[str, Any]:
        """The ``data`` of a successful answer; PrometheusError for any other."""
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise PrometheusError(f"{self.url}: answer is not JSON") from None
        if not isinstance(payload, dict) or payload.get("status") != "success":
            err = payload.get("error") if isinstance(payload, dict) else None
            raise PrometheusError(f"{self.url}: query failed: {_one_line(str(err or 'no status'))}")
        data = payload.get("data")
        if not isinstance(data, dict):
            raise PrometheusError(f"{self.url}: answer has no data")
        return data


def _float(text: Any) -> float:
    """Prometheus sends values as strings ("NaN", "+Inf" included)."""
    return float(text)


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The ``error`` field of Prometheus' JSON error body, else the HTTP reason, on one line."""
    try:
        body = json.loads(exc.read())
        text = str(body.get("error") or exc.reason)
    except (ValueError, AttributeError, OSError):
        text = str(exc.reason)
    return _one_line(text)


def _one_line(text: str) -> str:
    return " ".join(text.split())
