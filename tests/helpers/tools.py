"""``require_tool``: the one decision on a command-line tool the tests need (promtool, amtool,
Alertmanager, chromium, torchrun).

Missing on a developer's machine, the test is skipped with the way to install it. Missing in CI
(``CI=true``, as GitHub Actions and most CI services set it) the test fails: there a missing tool
is a broken setup, and a skip would let every check that needs it pass unseen.
"""

from __future__ import annotations

import os
import shutil

import pytest

INSTALL = "tests/run.sh installs it: apt-get install prometheus prometheus-alertmanager chromium"


def in_ci() -> bool:
    """Whether the tests run in CI: ``CI`` set to ``true`` (or ``1``/``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require_tool(*names: str, install: str = INSTALL) -> str:
    """The path of the first of ``names`` on PATH; none there: skip, or fail under CI."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    why = f"{' or '.join(names)} is not on PATH ({install})"
    if in_ci():
        pytest.fail(f"{why}; in CI (CI=true) a missing tool is a broken setup", pytrace=False)
    pytest.skip(why)
