"""Session-wide isolation from the machine: see :mod:`tests.tmproot`."""

from __future__ import annotations

import pytest

from tests.tmproot import close_root, open_root


def pytest_configure(config: pytest.Config) -> None:
    open_root()


def pytest_unconfigure(config: pytest.Config) -> None:
    close_root()
