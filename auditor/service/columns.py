"""Prometheus answers as columns over one index (ranks, or GPUs), for the snapshot rebuild.

Each answer is one value per series, labelled by what the query aggregated ``by``. The rebuild
wants, per figure, one value per rank (or GPU): a column, NaN where Prometheus had none. Building
them is one label lookup per series and one numpy scatter per answer; at 4,096 ranks (some
180,000 series) that replaced a dict per figure and a dict per rank and sub-label.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from math import isfinite
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from auditor.metrics.query import Series, Vector

Column = npt.NDArray[np.float64]
Answer = Vector | Sequence[Series]
# Every query's answer, by the query's key.
Answers = Mapping[str, Answer]


def as_vector(answer: Answer | None) -> Vector:
    """The service decodes straight into :class:`Vector`; hand-written answers are Series."""
    if answer is None:
        return Vector([], np.empty(0))
    return answer if isinstance(answer, Vector) else Vector.of(answer)


@dataclass(frozen=True)
class Key:
    """The labels that say which index entry a series is: ``("auditor_job", "rank")`` or
    ``("uuid",)`` (a value, or a tuple of values; "" where a label is absent)."""

    names: tuple[str, ...]

    def of(self, labels: Mapping[str, str]) -> Hashable:
        values = tuple(labels.get(n, "") for n in self.names)
        return values[0] if len(values) == 1 else values

    def all(self, vector: Vector) -> list[Any]:
        """Every series' key (read-only: it may be shared). Prometheus leaves out empty labels,
        so a series may lack one: the C-level getter serves the usual answer whole, the slow
        path the others."""
        labels = vector.labels
        # The client hands answers of one shape the same (immutable) tuple of labels, from one
        # evaluation to the next too (PrometheusClient.labels): their keys are read once.
        shared = type(labels) is tuple
        if shared:
            for seen, keys in _KEYS_SEEN.get(self.names, ()):
                if seen is labels:
                    return keys
        try:
            keys = list(map(itemgetter(*self.names), labels))
        except KeyError:
            keys = [self.of(x) for x in labels]
        if shared:
            kept = _KEYS_SEEN.setdefault(self.names, [])
            kept[:] = [(labels, keys), *kept[: _KEYS_KEPT - 1]]
        return keys


# The keys of the label tuples read last, by key names (kept alive with them: identity is the
# test).
_KEYS_SEEN: dict[tuple[str, ...], list[tuple[Sequence[Mapping[str, str]], list[Any]]]] = {}
_KEYS_KEPT = 4


RANK = Key(("auditor_job", "rank"))
GPU = Key(("uuid",))


def rows(vector: Vector, index: Mapping[Any, int], key: Key) -> npt.NDArray[np.intp]:
    """The index position of each series of ``vector`` (-1: not in the index)."""
    # map() over C callables: no Python frame per series (some 180,000 at 4,096 ranks).
    found = map(index.get, key.all(vector), repeat(-1))
    return np.fromiter(found, dtype=np.intp, count=len(vector))


class Columns:
    """Answers as columns over one index (ranks by :data:`RANK`, or GPUs by :data:`GPU`).

    Answers to different queries mostly list the same series (same labels) in the same order:
    one comparison of their label lists (C-level, about half the cost of reading each series'
    key and looking it up) lets an answer reuse the positions found for an earlier one.
    """

    # Label lists remembered: the rank answers come in one or two shapes (by rank; identities
    # with every label are not read as columns), the GPU answers in one; a mismatch costs one
    # dict comparison.
    _KEPT = 4

    def __init__(self, index: Mapping[Any, int], key: Key) -> None:
        self.index = index
        self.key = key
        self._seen: list[tuple[Sequence[Mapping[str, str]], npt.NDArray[np.intp]]] = []

    def rows(self, vector: Vector) -> npt.NDArray[np.intp]:
        """The index position of each series of ``vector`` (-1: not in the index); read-only,
        as it may be shared with other answers."""
        labels = vector.labels
        for seen, at in self._seen:
            # The client hands answers of one shape the same labels (PrometheusClient.labels):
            # the identity check is the usual hit, the comparison the rest.
            if seen is labels or (len(seen) == len(labels) and seen == labels):
                return at
        at = rows(vector, self.index, self.key)
        at.setflags(write=False)
        self._seen = [(labels, at), *self._seen[: self._KEPT - 1]]
        return at

    def column(self, vector: Vector) -> Column:
        """One value per index entry (NaN: no series, or a NaN answer)."""
        out = np.full(len(self.index), np.nan)
        at = self.rows(vector)
        ok = (at >= 0) & ~np.isnan(vector.values)
        out[at[ok]] = vector.values[ok]
        return out


# Columns become Python lists in C where every value is an ordinary number (the usual answer):
# a Python expression per value only where one is missing. Integers stay exact below 2**53.
_EXACT = 2.0**53


def _ordinary(values: Column) -> bool:
    return bool((np.abs(values) < _EXACT).all())  # NaN and infinities compare False


def optional(values: Column) -> list[float | None]:
    """A column as Python values, None for NaN (what the samples say for "not measured")."""
    if not np.isnan(values).any():
        return values.tolist()
    return [None if x != x else x for x in values.tolist()]


def optional_ints(values: Column) -> list[int | None]:
    """An integral figure (bytes, a count) as ``int()`` gives it, None where not a number."""
    if _ordinary(values):
        return values.astype(np.int64).tolist()
    return [int(x) if isfinite(x) else None for x in values.tolist()]


def rounded(values: Column, missing: Any) -> list[Any]:
    """Each value as ``round()`` gives it (half to even), ``missing`` where not a number."""
    if _ordinary(values):
        return np.rint(values).astype(np.int64).tolist()
    return [round(x) if isfinite(x) else missing for x in values.tolist()]


# Label values as whole numbers (ranks, world sizes, GPU indexes).


def int_label(text: str | None) -> int | None:
    """A label's whole number ("3", also "3.0"), None where absent or not a number."""
    try:
        return int(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pass
    if not text:
        return None
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        return None


def int_labels(texts: list[str]) -> list[int | None]:
    """:func:`int_label` of each label: in C where all are plain whole numbers (rank numbers)."""
    try:
        return list(map(int, texts))
    except (TypeError, ValueError):
        return list(map(int_label, texts))


@lru_cache(maxsize=1024)
def int_label_or_0(text: str | None) -> int:
    # Cached: a few distinct label values (world size, local rank, GPU index) recur on every
    # rank or GPU. (Rank numbers, all distinct, go through int_label: a cache only churned.)
    return int_label(text) or 0
