"""Prometheus' instant-vector answers decoded into columns without an object per series.

A general JSON decoder builds some seven Python objects per series (the element, its labels, the
``value`` pair, its timestamp and string); at 16,384 ranks (about 650,000 series an evaluation)
building and freeing them was most of the decoding. Prometheus' answers have one fixed shape::

    {"status":"success","data":{"resultType":"vector","result":[
        {"metric":{...},"value":[<time>,"<value>"]}, ...]}}

so the value pairs are found in the bytes with numpy (one pass to find the ``[`` of each
``"value":[``, then eight bytes at a time: the time, written alike in every pair, is checked
against the first; each value string's closing quote is found in 8-byte words), and the value
strings, laid out as one JSON list, are read by orjson in one call (numpy reads the few it does
not: ``"NaN"``, ``"+Inf"``). What is left once the value pairs are cut out, the *skeleton*, is
the labels alone. Answers to different queries mostly share a skeleton (the same series by
rank, or by GPU): the labels are decoded once per skeleton (orjson) and shared, and
:class:`LabelCache` keeps them across evaluations; a skeleton is compared in parts, as cut out
(the series' labels as rows of one width), its bytes joined only to decode new labels.

Anything not in that shape (an error, warnings, a matrix, whitespace other than
Prometheus' or Python's ``json.dumps``', a value the windows do not hold) makes
:func:`decode_vector` answer None: the caller decodes the whole answer the general way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import orjson
from numpy.lib.stride_tricks import sliding_window_view

Labels = Sequence[Mapping[str, str]]
# An answer without its value pairs: its bytes, or parts that are equal exactly when the bytes
# are (see _skeleton).
Skeleton = bytes | tuple[bytes, ...]


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
        self._kept: list[tuple[Skeleton, tuple[dict[str, str], ...]]] = []

    def labels(
        self, skeleton: Skeleton, joined: Callable[[], bytes] | None = None
    ) -> tuple[dict[str, str], ...] | None:
        """The labels of every series of ``skeleton`` (None: not an answer of that shape): the
        skeleton's bytes, or its parts (:func:`_skeleton`) with ``joined`` giving its bytes
        (asked only for labels not known yet)."""
        for i, (seen, found) in enumerate(self._kept):
            if len(seen) == len(skeleton) and seen == skeleton:
                if i:
                    self._kept.insert(0, self._kept.pop(i))
                return found
        text = skeleton if isinstance(skeleton, bytes) else joined() if joined else None
        decoded = None if text is None else _decode_labels(text)
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
    labels = (cache or LabelCache(0)).labels(*_skeleton(raw, len(body), dialect, starts, ends))
    if labels is None or len(labels) != len(values):
        return None
    return labels, values


def _words(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    """Every (unaligned) 8-byte little-endian word of ``raw``, by the offset of its first byte."""
    return np.ndarray((len(raw) - 7,), dtype="<u8", buffer=raw, strides=(1,))


def _at(raw: npt.NDArray[np.uint8], at: npt.NDArray[np.intp], text: bytes) -> npt.NDArray[np.bool_]:
    """Whether ``text`` (2 to 16 bytes) is at each offset ``at`` of ``raw``: two 8-byte words
    compared (unaligned), not a window of bytes."""
    words = _words(raw)
    head, tail = (
        int.from_bytes(text[:8].ljust(8, b"\0"), "little"),
        int.from_bytes(text[-8:].rjust(8, b"\0"), "little"),
    )
    if len(text) >= 8:
        return (words[at] == head) & (words[at + len(text) - 8] == tail)
    mask = (1 << (8 * len(text))) - 1
    return (words[at] & mask) == head


_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_SPACES = np.uint64(int.from_bytes(b" " * 8, "little"))
# By the bytes a word keeps of a string (index 0: none, the string ended in an earlier word;
# k + 1: its first k bytes): the mask of those bytes, and what fills the rest (a "," where the
# string's closing quote is, spaces after it).
_KEEP = np.array([0, *((1 << (8 * k)) - 1 for k in range(9))], dtype=np.uint64)
_FILL = (
    np.array(
        [
            int(_SPACES),
            *(int.from_bytes(b" " * k + b"," + b" " * (7 - k), "little") for k in range(8)),
            int(_SPACES),
        ],
        dtype=np.uint64,
    )
    & ~_KEEP
)
_ZERO = int.from_bytes(b"0,      ", "little")  # a row orjson reads as 0 (a value read apart)
_DIGIT0, _MINUS = ord("0"), ord("-")


def _first_byte(word: npt.NDArray[np.uint64], byte: int) -> npt.NDArray[np.intp]:
    """The index (0-7) of the first ``byte`` in each little-endian word, 8 where none is."""
    x = word ^ (_ONES * np.uint64(byte))
    # The high bit of each zero byte of x: bytes above the lowest zero may be flagged wrongly,
    # the lowest flag is always right (a borrow only runs upwards from a zero byte).
    flags = (x - _ONES) & ~x & _HIGHS
    return np.where(flags != 0, _lowest_byte(flags), 8)


def _lowest_byte(flags: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """The index (0-7) of the lowest byte with a bit set in each word (not 0)."""
    lowest = flags & (~flags + np.uint64(1))  # its lowest bit alone: a power of two
    exponent = (lowest.astype(np.float64).view(np.uint64) >> np.uint64(52)).astype(np.intp)
    return (exponent - 1023) >> 3


def _times(
    raw: npt.NDArray[np.uint8], words: npt.NDArray[np.uint64], opens: npt.NDArray[np.intp]
) -> npt.NDArray[np.intp] | None:
    """Each value pair's time length (the bytes after its "[" up to the separator before the
    value string's quote: the first quote within ``_TIME_W`` bytes, less the separator) where
    every pair's time is written alike (the instant query's one time: the usual answer); None
    where they differ."""
    at = int(opens[0]) + 1
    first = raw[at : at + _TIME_W].tobytes().find(b'"')
    if first < 0:
        return None
    # Every time's first bytes (up to the quote) equal the first time's: none has a quote
    # before it.
    for step in range(0, first, 8):
        keep = _KEEP[min(first - step, 8) + 1]
        word = words[opens + 1 + step] & keep
        if not (word == word[0]).all():
            return None
    return np.full(len(opens), first, dtype=np.intp)


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
    words = _words(raw)
    # The time (not read, as before: only the value is), then the separator and the value
    # string's opening quote.
    first = _times(raw, words, opens)
    if first is None:  # times written differently: each one looked at
        head = sliding_window_view(raw, _TIME_W)[opens + 1]
        first = (head == _QUOTE).argmax(axis=1)
        if not (head[rows, first] == _QUOTE).all():
            return None
    time_len = first - len(d.comma)
    if (time_len < 1).any() or not _at(raw, opens + 1 + time_len, d.comma + b'"').all():
        return None
    # The value string, up to its closing quote (then "]"), read eight bytes at a time.
    begin = opens + 2 + first
    text = np.empty((_VALUE_W // 8, n), dtype=np.uint64)
    length = np.full(n, -1, dtype=np.intp)
    for q in range(_VALUE_W // 8):
        text[q] = words[begin + 8 * q]
        quote = _first_byte(text[q], _QUOTE)
        found = (quote < 8) & (length < 0)
        length[found] = 8 * q + quote[found]
    long_rows = np.flatnonzero(length < 0)
    body = raw[:size].tobytes() if len(long_rows) else b""
    for i in long_rows.tolist():  # rare: a value longer than the window
        length[i] = body.find(b'"', int(begin[i])) - int(begin[i])
    ends = begin + length + 2  # past the closing quote and "]"
    if (length < 1).any() or not (raw[ends - 1] == ord("]")).all():
        return None
    # Plain numbers (a digit first, or "-" and a digit) are read by orjson; the rest ("NaN",
    # "+Inf", a value longer than the window), and all where orjson refuses one, by numpy.
    char = (text[0] & np.uint64(0xFF)).astype(np.uint8)
    after = ((text[0] >> np.uint64(8)) & np.uint64(0xFF)).astype(np.uint8)
    plain = ((char - np.uint8(_DIGIT0)) <= 9) | (
        (char == _MINUS) & ((after - np.uint8(_DIGIT0)) <= 9)
    )
    plain[long_rows] = False
    values = _numbers(text, length, plain, negative=char == _MINUS)
    rest = rows if values is None else np.flatnonzero(~plain)
    if values is None:
        values = np.empty(n)
    if len(rest):
        read = _strings(raw, body, begin[rest], length[rest])
        if read is None:
            return None
        values[rest] = read
    return starts, ends, values


def _numbers(
    text: npt.NDArray[np.uint64],
    length: npt.NDArray[np.intp],
    plain: npt.NDArray[np.bool_],
    negative: npt.NDArray[np.bool_],
) -> npt.NDArray[np.float64] | None:
    """The value strings (``text``: their first words, word ``q`` of every string in row ``q``;
    ``length`` bytes each, then their closing quote) as numbers, all read by orjson from one
    JSON list; NaN for those not ``plain`` (the caller's to read). None where orjson does not
    read each plain string as one number.

    orjson rounds as ``float()`` does; what it reads as a number is the number ``float()``
    reads, and every string is checked to be one number (a string starts with a digit, or a
    minus and a digit: it is at least one number; the count says none is more). Its integers
    become floats here, "-0" with the text's sign."""
    n = len(length)
    # Words a row: the longest plain string's, its closing quote's byte included.
    width = (int(length.max(initial=0, where=plain)) + 8) // 8
    laid = np.empty((n, width), dtype=np.uint64)
    for q in range(width):
        kept = np.clip(length - 8 * q, -1, 8) + 1
        laid[:, q] = (text[q] & _KEEP[kept]) | _FILL[kept]
    laid[~plain] = _SPACES
    laid[~plain, 0] = _ZERO
    try:
        # The last row's "," is followed by one more number (dropped).
        read = orjson.loads(b"[" + laid.tobytes() + b"0]")
        if len(read) != n + 1:
            return None
        values = np.fromiter(read, dtype=np.float64, count=n + 1)[:n]
    except (orjson.JSONDecodeError, TypeError, ValueError, OverflowError):
        return None
    values[negative] = np.copysign(values[negative], -1.0)  # "-0": read as the integer 0
    values[~plain] = np.nan
    return values


def _strings(
    raw: npt.NDArray[np.uint8],
    body: bytes,
    begin: npt.NDArray[np.intp],
    length: npt.NDArray[np.intp],
) -> npt.NDArray[np.float64] | None:
    """The value strings at ``begin`` (``length`` bytes each) as numpy reads them (as float()
    does: "NaN", "+Inf" included; ``body``: the answer, where one is longer than the window);
    None where one is not a number (an escape, a word)."""
    # The strings NUL-padded (an "S" string ends at the first NUL), as narrow as the longest
    # that fits the window; a longer one is read alone.
    width = int(min(length.max(), _VALUE_W))
    strings = sliding_window_view(raw, width)[begin]
    strings[np.arange(width) >= length[:, None]] = 0
    try:
        # numpy reads bytes as float() does ("NaN", "+Inf" included; an escape fails), at once.
        values = strings.view(f"S{width}").ravel().astype(np.float64)
        for i in np.flatnonzero(length > _VALUE_W).tolist():
            values[i] = float(body[int(begin[i]) : int(begin[i] + length[i])])
    except ValueError:
        return None
    return values


def _skeleton(
    raw: npt.NDArray[np.uint8],
    size: int,
    d: _Dialect,
    starts: npt.NDArray[np.intp],
    ends: npt.NDArray[np.intp],
) -> tuple[Skeleton, Callable[[], bytes]]:
    """The answer (the first ``size`` bytes of ``raw``) with the ranges ``[starts[i], ends[i])``
    (sorted, disjoint) cut out, as the label cache compares it, and a function giving its
    bytes. Usually parts, not the bytes: what comes before the first range and after the last,
    the length of what lies between each two (a series' labels), and those stretches as rows
    of one width, NUL-padded; equal parts, equal skeletons. They are compared as they are cut
    out: the bytes are joined only for labels not decoded yet."""
    if not len(starts):
        whole = raw[:size].tobytes()
        return whole, lambda: whole
    # What lies between the cuts, one row each (as wide as the widest).
    gap_at = np.concatenate(([len(d.prefix)], ends[:-1]))
    gap = starts - gap_at
    width = int(gap.max())
    if width * len(gap) <= 4 * size:  # usual labels, a few dozen bytes; else one pass
        rows = sliding_window_view(raw, width)[gap_at]
        inside = np.arange(width) < gap[:, None]
        if int(gap.min()) < width:
            rows *= inside  # NUL past each row's own bytes (there: a value pair)
        head, tail = raw[: len(d.prefix)].tobytes(), raw[ends[-1] : size].tobytes()
        parts = (head + tail, gap.tobytes(), rows.tobytes())
        return parts, lambda: head + rows[inside].tobytes() + tail
    # Each range's first byte and the first byte past it toggle "inside" (a running xor).
    edge = np.zeros(size + 1, dtype=np.bool_)
    edge[starts] = True
    edge[ends] = True
    skeleton = raw[:size][~np.logical_xor.accumulate(edge[:-1])].tobytes()
    return skeleton, lambda: skeleton
