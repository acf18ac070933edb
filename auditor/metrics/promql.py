"""PromQL the auditor writes in more than one place (serve's queries, the recording rules)."""

from __future__ import annotations


def growth(series: str, window: str) -> str:
    """How much each counter in ``series`` (a selector) grew between its first and its last
    sample in ``window``: not extrapolated. ``increase()`` and ``rate()`` stretch each series to
    the window's edges by a factor of its own (one that starts inside the window, as every
    series of a starting job does, by how near its first value is to zero), so a rank's step and
    phase counters grew by different factors and a waiting rank's collective wait could exceed
    its step. Between the same two scrapes every counter of a rank covers the same steps, and
    its phases add up to its step. A counter reset in the window (its endpoint restarted)
    counts from its lowest value."""
    x = f"{series}[{window}]"
    return f"(last_over_time({x}) - min_over_time({x}))"
