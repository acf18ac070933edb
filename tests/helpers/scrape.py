"""Reading a Prometheus endpoint back in tests: every sample by name and labels."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Series:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def value(series: Series, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` whose labels include ``labels`` (None if there is none)."""
    hits = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None
