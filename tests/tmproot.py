"""Every temporary path a test session may leave behind lives in one fresh folder.

A new machine has no ``/tmp/ray`` and no state from earlier runs; tests must not depend on either.
The session's root is a new, short folder (Unix socket paths are limited to 107 bytes) that
stands in for ``/tmp`` as Ray's default temp root (``RAY_TMPDIR``): Ray's own ``ray/`` folder
is created inside it, as a first ``ray start`` on a new machine would, because Ray's
``cluster_utils.Cluster`` writes ``ray_current_cluster`` there whatever ``temp_dir`` its nodes
get. Every Ray temp dir of a test comes from :func:`ray_temp_dir`, inside the same root, so a
crashed session leaves one folder and the next session starts from an empty one.
"""

from __future__ import annotations

import os
import shutil
import tempfile

_ROOT: str | None = None


def open_root() -> str:
    """Create the session's root and point Ray's default temp root at it (once per session)."""
    global _ROOT
    if _ROOT is None:
        root = tempfile.mkdtemp(prefix="aud-t-", dir="/tmp")
        os.makedirs(os.path.join(root, "ray"))
        # Ray reads RAY_TMPDIR before TMPDIR; TMPDIR stays as it is, so pytest's and the
        # jobs' own temp paths (and their Unix sockets) keep their usual, short length.
        os.environ["RAY_TMPDIR"] = root
        # Tests run their own private local Ray; Ray 2.60's token auth is for shared clusters.
        os.environ["RAY_AUTH_MODE"] = "disabled"
        _ROOT = root
    return _ROOT


def close_root() -> None:
    global _ROOT
    if _ROOT is not None:
        shutil.rmtree(_ROOT, ignore_errors=True)
        _ROOT = None


def ray_temp_dir(prefix: str = "ray-") -> str:
    """A fresh, short temp dir for one Ray head, node or embedded run, inside the session root."""
    return tempfile.mkdtemp(prefix=prefix, dir=open_root())
