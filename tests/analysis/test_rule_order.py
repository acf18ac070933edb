"""The findings do not depend on the order of RULES: cause-linking is the engine's own step."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from auditor.analysis import SampleStore, analyze
from auditor.analysis import engine as engine_module
from auditor.analysis.causes import EXPLAINED_BY, LISTING
from auditor.analysis.rules import RULES
from auditor.analysis.snapshot import Snapshot
from auditor.telemetry.recorded import read_recording

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDINGS = sorted(p.parent.name for p in DATA.glob("*/recording.jsonl"))


def _snapshot(name: str) -> Snapshot:
    rec = read_recording(DATA / name / "recording.jsonl")
    store = SampleStore(job=rec.job)
    store.add(rec.batch)
    now = store.latest_time()
    assert now is not None
    return store.snapshot(now=now, window_s=None)


def test_listing_covers_every_rule_and_puts_explaining_rules_first() -> None:
    assert set(LISTING) == set(RULES)
    for rule, by in EXPLAINED_BY.items():
        assert all(LISTING.index(b) < LISTING.index(rule) for b in by), rule


@pytest.mark.parametrize("name", RECORDINGS)
def test_shuffled_rules_give_identical_findings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [f.to_dict() for f in analyze(_snapshot(name))]
    names = list(RULES)
    orders = [names[::-1]] + [random.Random(seed).sample(names, len(names)) for seed in range(3)]
    for order in orders:
        monkeypatch.setattr(engine_module, "RULES", {n: RULES[n] for n in order})
        assert [f.to_dict() for f in analyze(_snapshot(name))] == expected, order
