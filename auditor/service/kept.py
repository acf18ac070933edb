"""What ``auditor serve``'s rebuild keeps from one evaluation to the next: the parts that depend on
labels alone (a job's ranks and their order, each rank's identity, the GPUs' labels and owners),
each with the inputs it came from, reused while those inputs are the same. A job's identity does
not change between evaluations; its figures do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


class Kept:
    """The last result of each part of the rebuild that depends on labels alone, with its
    inputs: reused while they are the same. Label lists count as the same when they are the
    same (immutable) tuple, which the client hands out for an unchanged shape of answer
    (:class:`~auditor.metrics.promvector.LabelCache`), from one evaluation to the next; lists
    (hand-written answers) never do. Everything else is compared by value (arrays with their
    NaNs)."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[tuple[Any, ...], Any]] = {}

    def get(self, part: str, inputs: tuple[Any, ...]) -> Any:
        kept = self._kept.get(part)
        if kept is None or not all(map(_same, kept[0], inputs)):
            return None
        return kept[1]

    def keep(self, part: str, inputs: tuple[Any, ...], result: Any) -> None:
        if all(type(x) is tuple for x in inputs if _is_labels(x)):
            self._kept[part] = (inputs, result)
        else:
            self._kept.pop(part, None)

    def clear(self) -> None:
        self._kept.clear()


def _is_labels(x: Any) -> bool:
    return isinstance(x, (list, tuple)) and bool(x) and isinstance(x[0], Mapping)


def _same(a: Any, b: Any) -> bool:
    if _is_labels(a) or _is_labels(b):
        return a is b and type(a) is tuple
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
        )
    return type(a) is type(b) and bool(a == b)


# One per process: the service's evaluations follow one another (a result is never changed
# once made, so sharing it with the next evaluation's snapshots is safe).
LAST = Kept()


def forget() -> None:
    """Drop what the rebuild kept from the last evaluation (the next one starts cold)."""
    LAST.clear()
