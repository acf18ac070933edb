"""Writing files that readers may open at any moment (reports, pages, discovery files)."""

from __future__ import annotations

import os
import tempfile


def write_text_atomic(path: str | os.PathLike[str], text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never half of it:
    a temporary file in the same folder, flushed to disk, then renamed over the target."""
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
