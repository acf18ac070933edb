"""Fixtures shared by the probe tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from . import short_dir


@pytest.fixture
def path() -> Iterator[str]:
    """A Unix socket's path in a short temporary folder (removed afterwards)."""
    d = short_dir()
    yield os.path.join(d, "s.sock")
    shutil.rmtree(d, ignore_errors=True)
