"""Runs inside training ranks: hooks, step clock, rank sink.

Imports nothing from cluster/, analysis/ or report/ and never imports Ray: ranks measure and
hand off, cheaply. ``auditor run`` injects it through ``boot/sitecustomize.py``; other launchers
opt in with ``AUDITOR_PROBE=1`` plus the boot folder on ``PYTHONPATH`` (``auditor probe-path``
prints it), or with one line in the script: ``import auditor.probe.auto``.
"""

from .importhook import install

__all__ = ["install"]
