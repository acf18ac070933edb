"""How many samples a batch holds, whatever shape the script gives it (the probe and its
DataLoader patch both ask)."""

from __future__ import annotations

from typing import Any

_SEQUENCES = (tuple, list)


def batch_size_of(batch: Any, _depth: int = 0) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor (tuples, lists, dicts)."""
    if type(batch) in _SEQUENCES and batch and _depth <= 3:
        # The common ``(x, y)`` batch, read first: once a batch, a line saved is worth it.
        shape = getattr(batch[0], "shape", None)
        if shape:  # a tensor with a dimension (an empty shape falls through to the walk)
            return int(shape[0])
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else None
    if _depth > 3:
        return None
    if isinstance(batch, (list, tuple)):
        for item in batch:
            # A tensor item read here (the common ``(x, y)`` batch): one call a batch, not two.
            shape = getattr(item, "shape", None)
            if shape is not None:
                n = int(shape[0]) if len(shape) else None
            else:
                n = batch_size_of(item, _depth + 1)
            if n is not None:
                return n
    elif isinstance(batch, dict):
        for item in batch.values():
            n = batch_size_of(item, _depth + 1)
            if n is not None:
                return n
    return None
