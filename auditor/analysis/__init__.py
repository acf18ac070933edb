"""Pure analysis: snapshots in, findings out. Imports nothing from cluster/, telemetry/, report/."""

from .engine import analyze
from .findings import Finding
from .snapshot import RankView, SampleStore, Snapshot

__all__ = ["Finding", "RankView", "SampleStore", "Snapshot", "analyze"]
