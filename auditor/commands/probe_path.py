"""``auditor probe-path``: the folder that opts a job into the probe via PYTHONPATH."""

from __future__ import annotations

import sys
from typing import TextIO

from auditor.cluster.probing import BOOT_DIR


def probe_path(*, out: TextIO | None = None) -> int:
    """Print the probe's boot folder (:data:`auditor.cluster.probing.BOOT_DIR`)."""
    print(BOOT_DIR, file=out or sys.stdout)
    return 0
