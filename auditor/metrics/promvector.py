"""Prometheus' instant-vector answers decoded into columns without an object per series.

A general JSON decoder builds some seven Python objects per series (the element, its labels, the
``value`` pair, its timestamp and string); at 16,384 ranks (about 650,000 series an evaluation)
building and freeing them was most of the decoding. Prometheus' answers have one fixed shape::

    {"status":"success","data":{"resultType":"vector","result":[
        {"metric":{...},"value":[<time>,"<value>"]}, ...]}}

so the values are read straight from the bytes with numpy (one pass to find the ``[`` of each
``"value":[``, then fixed-width windows), and what is left once the value pairs are cut out,
the *skeleton*, is the labels alone. Answers to different queries mostly share a skeleton (the
same series by rank, or by GPU): the labels are decoded once per skeleton (orjson) and shared,
and :class:`LabelCache` keeps them across evaluations.

Anything not in that shape (an error, warnings, a matrix, whitespace other than
Prometheus' or Python's ``json.dumps``', a value the windows do not hold) makes
:func:`decode_vector` answer None: the caller decodes the whole answer the general way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import orjson
from numpy.lib.stride_tricks import sliding_window_view

Labels = Sequence[Mapping[str, str]]


@dataclass(frozen=True)
class _Dialect:
    """How an encoder spaces the answer: Prometheus (compact) or ``json.dumps`` (``", "``)."""

    prefix: bytes  # up to and including the result list's "["
    key: bytes  # the separator before "value", and the key up to its "["
    comma: bytes  # between the time and the value string


_DIALECTS = (
    _Dialect(b'{"status":"success","data":{"resultType":"vector","result":[', b',"value":[', b","),
    _Dialect(
        b'{"status": "success", "data": {"resultType": "vector", "result": [',
        b', "value": [',
        b", ",
    ),
)
_SUFFIX = b"]}}"
# Window widths: "[" up to the value string's opening quote (a time and the separator), and the
# value string. A value longer than that (FormatFloat of 1e-300 writes 300 zeros) is read alone.
_TIME_W = 24
_VALUE_W = 32
_PAD = _TIME_W + _VALUE_W + 8
_QUOTE, _OPEN = ord('"'), ord("[")


class LabelCache:
    """Decoded labels by skeleton, the last ``size`` used: answers that list the same series in
    the same order (most of an evaluation's, and the next evaluation's) share one decoded list
    of label dicts (a tuple). The dicts are shared: callers must not change them."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        # Most recent first. Looked up by length, then content (a memcmp), not by hash: a
        # skeleton is up to a few MB, and hashing it cost more than the comparisons.
        self._kept: list[tuple[bytes, tuple[dict[str, str], ...]]] = []

    def labels(self, skeleton: bytes) -> tuple[dict[str, str], ...] | None:
        """The labels of every series of ``skeleton`` (None: not an answer of that shape)."""
        for i, (seen, found) in enumerate(self._kept):
            if len(seen) == len(skeleton) and seen == skeleton:
                if i:
                    self._kept.insert(0, self._kept.pop(i))
                return found
        decoded = _decode_labels(skeleton)
        if decoded is not None and self.size > 0:
            self._kept = [(skeleton, decoded), *self._kept[: self.size - 1]]
        return decoded

    def clear(self) -> None:
        self._kept = []


def _decode_labels(skeleton: bytes) -> tuple[dict[str, str], ...] | None:
    try:
        result = orjson.loads(skeleton)["data"]["result"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(result, list):
        return None
    # Each element must be {"metric": {...}} and nothing else once its value pair is cut out
    # (a "histogram" element, say, is not read here).
    labels = tuple([r.get("metric") if type(r) is dict and len(r) == 1 else None for r in result])
    if not all(type(m) is dict for m in labels):
        return None
    # A tuple: shared by every answer of the shape, and by the rebuild's caches by identity.
    return labels  # type: ignore[return-value]


def decode_vector(
    body: bytes, cache: LabelCache | None = None
) -> tuple[Labels, npt.NDArray[np.float64]] | None:
    """An instant-vector answer as ``(labels, values)``: series ``i`` has labels ``labels[i]``
    and value ``values[i]`` (NaN, infinities as sent). None where ``body`` is not a successful
    vector answer in the expected shape (the caller then decodes it the general way)."""
    if not body.endswith(_SUFFIX) or b"\0" in body:  # NUL: not JSON; below, it pads
        return None
    dialect = next((d for d in _DIALECTS if body.startswith(d.prefix)), None)
    if dialect is None:
        return None
    raw = np.frombuffer(body + bytes(_PAD), dtype=np.uint8)
    cut = _value_pairs(raw, len(body), dialect)
    if cut is None:
        return None
    starts, ends, values = cut
    labels = (cache or LabelCache(0)).labels(_skeleton(raw, len(body), dialect, starts, ends))
    if labels is None or len(labels) != len(values):
        return None
    return labels, values


def _at(raw: npt.NDArray[np.uint8], at: npt.NDArray[np.intp], text: bytes) -> npt.NDArray[np.bool_]:
    """Whether ``text`` (2 to 16 bytes) is at each offset ``at`` of ``raw``: two 8-byte words
    compared (unaligned), not a window of bytes."""
    words = np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))
    head, tail = (
        int.from_bytes(text[:8].ljust(8, b"\0"), "little"),
        int.from_bytes(text[-8:].rjust(8, b"\0"), "little"),
    )
    if len(text) >= 8:
        return (words[at] == head) & (words[at + len(text) - 8] == tail)
    mask = (1 << (8 * len(text))) - 1
    return (words[at] & mask) == head


def _value_pairs(
    raw: npt.NDArray[np.uint8], size: int, d: _Dialect
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp], npt.NDArray[np.float64]] | None:
    """Where each series' ``,"value":[<time>,"<value>"]`` starts and ends (exclusive) in the
    answer (its first ``size`` bytes of ``raw``, the rest NUL padding), and the values it holds;
    None where one does not read as such."""
    # A "[" preceded by the key opens a value pair: inside a label string every '"' is
    # escaped, so ',"value":[' cannot occur there, and no other key of a vector answer holds
    # a list but "result" (matched by the prefix, not by the key).
    opens = np.flatnonzero(raw[len(d.prefix) : size] == _OPEN) + len(d.prefix)
    starts = opens + 1 - len(d.key)
    is_key = _at(raw, starts, d.key)
    opens, starts = opens[is_key], starts[is_key]
    n = len(opens)
    if n == 0:
        empty = size == len(d.prefix) + len(_SUFFIX)
        return (starts, starts, np.empty(0)) if empty else None
    rows = np.arange(n)
    # The time (not read, as before: only the value is), then the separator and the value
    # string's opening quote.
    head = sliding_window_view(raw, _TIME_W)[opens + 1]
    first = (head == _QUOTE).argmax(axis=1)
    time_len = first - len(d.comma)
    if (
        not (head[rows, first] == _QUOTE).all()
        or (time_len < 1).any()
        or not _at(raw, opens + 1 + time_len, d.comma + b'"').all()
    ):
        return None
    # The value string, up to its closing quote (then "]").
    begin = opens + 2 + first
    text = sliding_window_view(raw, _VALUE_W)[begin]
    length = (text == _QUOTE).argmax(axis=1)
    long_rows = np.flatnonzero(text[rows, length] != _QUOTE)
    body = raw[:size].tobytes() if len(long_rows) else b""
    for i in long_rows.tolist():  # rare: a value longer than the window
        length[i] = body.find(b'"', int(begin[i])) - int(begin[i])
    ends = begin + length + 2  # past the closing quote and "]"
    if (length < 1).any() or not (raw[ends - 1] == ord("]")).all():
        return None
    # The strings NUL-padded (an "S" string ends at the first NUL), as narrow as the longest.
    width = int(length.max()) if not len(long_rows) else _VALUE_W
    strings = text[:, :width].copy()
    strings[np.arange(width) >= length[:, None]] = 0
    try:
        # numpy reads bytes as float() does ("NaN", "+Inf" included; an escape fails), at once.
        values = strings.view(f"S{width}").ravel().astype(np.float64)
        for i in long_rows.tolist():
            values[i] = float(body[int(begin[i]) : int(begin[i] + length[i])])
    except ValueError:
        return None
    return starts, ends, values


def _skeleton(
    raw: npt.NDArray[np.uint8],
    size: int,
    d: _Dialect,
    starts: npt.NDArray[np.intp],
    ends: npt.NDArray[np.intp],
) -> bytes:
    """The answer (the first ``size`` bytes of ``raw``) with the ranges ``[starts[i], ends[i])``
    (sorted, disjoint) cut out."""
    if not len(starts):
        return raw[:size].tobytes()
    # What lies between the cuts, one row each (as wide as the widest), read row by row.
    gap_at = np.concatenate(([len(d.prefix)], ends[:-1]))
    gap = starts - gap_at
    width = int(gap.max())
    if width * len(gap) <= 4 * size:  # usual labels, a few dozen bytes; else one pass
        rows = sliding_window_view(raw, width)[gap_at]
        kept = rows[np.arange(width) < gap[:, None]].tobytes()
        return raw[: len(d.prefix)].tobytes() + kept + raw[ends[-1] : size].tobytes()
    # Each range's first byte and the first byte past it toggle "inside" (a running xor).
    edge = np.zeros(size + 1, dtype=np.bool_)
    edge[starts] = True
    edge[ends] = True
    return raw[:size][~np.logical_xor.accumulate(edge[:-1])].tobytes()
