"""The registry: every rule declared once in its module, the order and the cause graph derived
from the declarations, and findings that do not depend on the order the rules came in."""

from __future__ import annotations

import dataclasses
import pkgutil
import random
from pathlib import Path

import pytest

import auditor.analysis.rules as rules_package
import auditor.report.phrasing as phrasing_package
from auditor.analysis import SampleStore, analyze
from auditor.analysis import engine as engine_module
from auditor.analysis.rules import KINDS, REGISTRY, RULES, ordered
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


def _modules(package: object) -> set[str]:
    return {m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")}  # type: ignore[attr-defined]


def test_one_module_one_rule_one_wording() -> None:
    assert set(KINDS) == _modules(rules_package)
    assert _modules(phrasing_package) - {"words"} == set(KINDS)
    assert [r.kind for r in REGISTRY] == list(KINDS) == list(RULES)


def test_explaining_rules_come_first_and_exist() -> None:
    seen: set[str] = set()
    for rule in REGISTRY:
        assert set(rule.explained_by) <= seen, rule.kind
        seen.add(rule.kind)


def test_the_order_is_derived_whatever_order_rules_come_in() -> None:
    for seed in range(5):
        shuffled = random.Random(seed).sample(list(REGISTRY), len(REGISTRY))
        assert ordered(shuffled) == REGISTRY


def test_a_rule_placed_before_what_explains_it_is_refused() -> None:
    first, *rest = REGISTRY
    early = dataclasses.replace(rest[-1], place=first.place - 1)
    with pytest.raises(TypeError, match="explained by"):
        ordered([early, *REGISTRY[:-1]])
    twin = dataclasses.replace(first, kind="twin")
    with pytest.raises(TypeError, match="share"):
        ordered([*REGISTRY, twin])


def test_thresholds_are_typed_and_unknown_ones_refused() -> None:
    for rule in REGISTRY:
        assert rule.threshold_names, rule.kind
        assert rule.settings() == rule.thresholds()
    with pytest.raises(ValueError, match="unknown threshold"):
        REGISTRY[0].settings({"no_such_threshold": 1})


@pytest.mark.parametrize("name", RECORDINGS)
def test_shuffled_rules_give_identical_findings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [f.to_dict() for f in analyze(_snapshot(name))]
    for seed in range(3):
        shuffled = random.Random(seed).sample(list(REGISTRY), len(REGISTRY))
        # A registry listed in another order is put back in the derived one by ``ordered``.
        monkeypatch.setattr(engine_module, "REGISTRY", ordered(shuffled))
        assert [f.to_dict() for f in analyze(_snapshot(name))] == expected, seed
