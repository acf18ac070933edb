"""Byte units, kept once: what the tests' memory figures are written in."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30
