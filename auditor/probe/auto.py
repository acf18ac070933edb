"""``import auditor.probe.auto``: the one-line opt-in for jobs not started by ``auditor run``."""

from .importhook import install

install()
