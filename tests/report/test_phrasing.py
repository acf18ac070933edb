"""A finding's words: one phrasing module per rule, dispatched on the type of the rule's facts.

The rules give facts and no prose (their summaries and fixes are checked through ``phrase`` in
each rule's own tests); here: every rule's facts have a wording, a symptom words its cause's fixes,
the report rounds and orders what it writes, and the phrases the wordings share.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import auditor.analysis.rules as rules
import auditor.report.phrasing as phrasing
from auditor.analysis.findings import Finding
from auditor.analysis.rules import RULES
from auditor.analysis.rules.compute_straggler import Facts, SlowRank
from auditor.analysis.rules.utilization_imbalance import Facts as ImbalanceFacts
from auditor.analysis.rules.utilization_imbalance import Spread
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase, phrase_facts
from auditor.report.phrasing.words import it_or_them, ops_text, s_if_one, with_expectation
from auditor.wording import fmt_ms, fmt_pct, ranks_text

SLOW = SlowRank("forward", 0.07, 0.03)


def _modules(package: object) -> set[str]:
    path = package.__path__
    return {m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_")}


def test_one_phrasing_module_per_rule() -> None:
    assert _modules(phrasing) - {"words"} == set(RULES) == _modules(rules)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_facts_type_a_rule_defines_has_its_wording(rule: str) -> None:
    module = importlib.import_module(f"auditor.analysis.rules.{rule}")
    words = importlib.import_module(f"auditor.report.phrasing.{rule}")
    mine = {
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__ and dataclasses.is_dataclass(c)
    }
    worded = {t for t, fn in phrase_facts.registry.items() if fn.__module__ == words.__name__}
    # Each wording is for facts of its own rule; each rule has at least one worded type.
    assert worded and worded <= mine, (rule, worded, mine)


def test_a_finding_without_facts_says_nothing() -> None:
    words = phrase(Finding(kind="memory_headroom", severity="info", ranks=(0,)))
    assert (words.summary, dict(words.fixes), dict(words.notes)) == ("", {}, {})


def test_facts_of_an_unknown_type_are_refused() -> None:
    odd = Finding(kind="memory_headroom", severity="info", ranks=(0,), facts=object())
    with pytest.raises(TypeError, match="no wording for object"):
        phrase(odd)


def test_a_symptom_words_its_cause_fixes_for_the_ranks_it_blames() -> None:
    cause = Finding(
        kind="compute_straggler",
        severity="critical",
        ranks=(1, 3),
        facts=Facts({1: SLOW, 3: SLOW}),
        predicted_speedup=2.0,
    )
    symptom = Finding(
        kind="utilization_imbalance",
        severity="warning",
        ranks=(1,),
        facts=ImbalanceFacts(Spread("rank 1", 0.97, "rank 0", 0.5), cause, {1: 0.97}),
        cause="compute_straggler",
    )
    words = phrase(symptom)
    assert dict(words.fixes) == {1: phrase(cause).fixes[1]}
    assert words.summary == (
        "busy time spread 97% (rank 1) against 50% (rank 0) because of compute_straggler: "
        "the others wait for rank 1"
    )


def test_the_report_rounds_the_speedup_and_sorts_the_fixes_by_rank() -> None:
    f = Finding(
        kind="compute_straggler",
        severity="warning",
        ranks=(1, 3),
        facts=Facts({3: SLOW, 1: SLOW}),
        predicted_speedup=1.23456,
    )
    d = ReportFinding.of(f).to_dict()
    assert d["predicted_speedup"] == 1.235
    assert list(d["fixes"]) == ["1", "3"]
    assert d["fixes"]["1"].startswith("forward takes 70 ms vs 30 ms on peers")
    assert ReportFinding.from_dict(d).fixes == phrase(f).fixes


@pytest.mark.parametrize(
    ("value", "text"), [(None, "n/a"), (0.1234, "123 ms"), (0.0, "0 ms"), (1.5, "1500 ms")]
)
def test_fmt_ms(value: float | None, text: str) -> None:
    assert fmt_ms(value) == text


@pytest.mark.parametrize(("value", "text"), [(0.6, "60%"), (0.0, "0%"), (1.0, "100%")])
def test_fmt_pct(value: float, text: str) -> None:
    assert fmt_pct(value) == text


@pytest.mark.parametrize(
    ("fix", "speedup", "text"),
    [
        ("x", None, "x"),
        ("x", 1.01, "x"),  # too small to promise
        ("x", 1.5, "x; expect about 1.5x"),
    ],
)
def test_with_expectation(fix: str, speedup: float | None, text: str) -> None:
    assert with_expectation(fix, speedup) == text


def test_shared_phrases() -> None:
    assert ranks_text([3]) == "rank 3"
    assert ranks_text([2, 0]) == "ranks 0, 2"
    assert ops_text(("all_gather", "ddp_allreduce")) == "all_gather/ddp_allreduce"
    assert (s_if_one([1]), s_if_one([1, 2]), s_if_one(1)) == ("s", "", "s")
    assert (it_or_them({1: None}), it_or_them(2)) == ("it", "them")
