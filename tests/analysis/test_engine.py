"""The engine: every rule over one snapshot, overrides, ordering and cross-rule invariants."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from auditor.analysis import analyze
from auditor.analysis.rules import KINDS, RULES
from auditor.analysis.snapshot import Snapshot
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.helpers.jobs import (
    JobBuilder,
    NodeSpec,
    RankSpec,
    backward_straggler,
    balanced,
    ddp_snapshot,
    forward_straggler,
    oversubscribed_2core,
    starved_rank3,
    uneven_batch,
    with_rank,
)


def _starved(steps: int = 24) -> Snapshot:
    return ddp_snapshot(starved_rank3(), steps=steps)


def _uneven(steps: int = 24) -> Snapshot:
    return ddp_snapshot(uneven_batch(), steps=steps)


def _forward(steps: int = 24) -> Snapshot:
    return ddp_snapshot(forward_straggler(), steps=steps)


def _backward(steps: int = 24) -> Snapshot:
    return ddp_snapshot(backward_straggler(), steps=steps)


def _oversubscribed(steps: int = 24) -> Snapshot:
    specs, nodes = oversubscribed_2core()
    return ddp_snapshot(specs, steps=steps, nodes=nodes)


# (scenario, the ranks that really hold the job back, the kinds expected)
SCENARIOS: list[Any] = [
    pytest.param(_starved, {3}, {"data_starvation"}, id="starved-rank3-of-8"),
    pytest.param(_uneven, {1}, {"batch_split", "utilization_imbalance"}, id="uneven-batch"),
    # Rank 2 busy 140 of 145 ms (97%), the others 100 of 145 ms (69%): a 28-point spread.
    pytest.param(
        _forward, {2}, {"compute_straggler", "utilization_imbalance"}, id="forward-straggler"
    ),
    pytest.param(
        _backward, {1}, {"compute_straggler", "utilization_imbalance"}, id="backward-straggler"
    ),
    pytest.param(_oversubscribed, {1}, {"cpu_oversubscription"}, id="oversubscribed-2-cores"),
]


@pytest.mark.parametrize("world", [2, 8])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_balanced_job_has_no_findings(world: int, seed: int) -> None:
    assert analyze(ddp_snapshot(balanced(world), seed=seed)) == []


@pytest.mark.parametrize("world", [2, 8])
def test_balanced_job_with_a_descheduled_step_has_no_findings(world: int) -> None:
    # One step in which rank 0 stalls for a second (every rank's step stretches with it at the
    # barrier): medians must not move the verdict.
    job = JobBuilder(balanced(world)).run(12)
    job.run(1, with_rank(balanced(world), 0, forward=1.0))
    job.run(11, balanced(world))
    assert analyze(job.snapshot()) == []


@pytest.mark.parametrize("world", [2, 8])
def test_balanced_cpu_only_job_without_loader_workers_has_no_findings(world: int) -> None:
    specs = balanced(world, device="cpu", num_workers=0, pin_memory=False, worker_cpu=None)
    assert analyze(ddp_snapshot(specs)) == []


@pytest.mark.parametrize(("build", "culprits", "kinds"), SCENARIOS)
def test_findings_blame_only_the_culprits(
    build: Callable[..., Snapshot], culprits: set[int], kinds: set[str]
) -> None:
    findings = analyze(build())
    assert {f.kind for f in findings} == kinds
    for f in findings:
        assert f.ranks, f.to_dict()
        assert set(f.ranks) <= culprits, f.to_dict()
        # Every blamed rank gets a concrete fix.
        assert set(f.ranks) <= set(phrase(f).fixes), f.to_dict()
        assert f.kind in KINDS
        assert f.predicted_speedup is None or f.predicted_speedup >= 1.0


@pytest.mark.parametrize(("build", "culprits", "kinds"), SCENARIOS)
def test_findings_round_trip_through_json(
    build: Callable[..., Snapshot], culprits: set[int], kinds: set[str]
) -> None:
    findings = analyze(build())
    assert {f.kind for f in findings} == kinds
    for f in findings:
        d = json.loads(json.dumps(ReportFinding.of(f).to_dict()))
        back = ReportFinding.from_dict(d)
        assert back.kind == f.kind
        assert back.ranks == f.ranks
        assert back.fixes == phrase(f).fixes
        assert back.summary == phrase(f).summary
        assert back.cause == f.cause
        assert back.predicted_speedup == pytest.approx(f.predicted_speedup, abs=1e-3)


def test_most_severe_first_then_largest_speedup() -> None:
    # Four findings of three severities from one job. Host "a" has 2 cores: rank 1's 8 busy
    # DataLoader workers oversubscribe it (warning, no speed-up figure). On host "b" rank 2's
    # forward takes 200 ms (critical straggler, and the utilization spread it causes: warning
    # with its speed-up), and rank 3 waits 50 ms for data, hidden behind the straggler (info).
    # The rules run in another order (cpu_oversubscription, data_starvation, ...).
    specs = [
        RankSpec(num_workers=1, main_cpu=0.15, worker_cpu=0.2, host="a"),
        RankSpec(num_workers=8, main_cpu=0.15, worker_cpu=0.4, host="a"),
        RankSpec(host="b", forward=0.2),
        RankSpec(host="b", data_wait=0.05),
    ]
    nodes = {"a": NodeSpec(cores=2.0, busy_cores=2.0)}
    findings = analyze(ddp_snapshot(specs, nodes=nodes))
    assert [(f.kind, f.ranks, f.severity) for f in findings] == [
        ("compute_straggler", (2,), "critical"),
        ("utilization_imbalance", (2,), "warning"),
        ("cpu_oversubscription", (1,), "warning"),
        ("data_starvation", (3,), "info"),
    ]
    # Within a severity the larger predicted speed-up comes first (none counts as none).
    assert findings[1].predicted_speedup is not None and findings[1].predicted_speedup > 1.0
    assert findings[2].predicted_speedup is None


@pytest.mark.parametrize(("build", "culprits", "kinds"), SCENARIOS)
def test_every_rule_is_silent_below_min_steps(
    build: Callable[..., Snapshot], culprits: set[int], kinds: set[str]
) -> None:
    # 7 steps, every rule's default min_steps is 8.
    assert analyze(build(steps=7)) == []
    # Lowering min_steps through the engine brings every expected finding back.
    overrides = {name: {"min_steps": 4} for name in RULES}
    assert {f.kind for f in analyze(build(steps=7), overrides=overrides)} == kinds


@pytest.mark.parametrize(
    ("build", "overrides", "kind", "present"),
    [
        pytest.param(
            _starved,
            {"data_starvation": {"min_wait_ratio": 0.7}},
            "data_starvation",
            False,
            id="starvation-ratio",
        ),
        pytest.param(
            _starved,
            {"data_starvation": {"min_steps": 25}},
            "data_starvation",
            False,
            id="starvation-min-steps",
        ),
        pytest.param(
            _uneven, {"batch_split": {"min_ratio": 2.5}}, "batch_split", False, id="batch-ratio"
        ),
        pytest.param(
            _forward,
            {"compute_straggler": {"min_excess": 1.5}},
            "compute_straggler",
            False,
            id="straggler-excess",
        ),
        pytest.param(
            _forward,
            {"compute_straggler": {"min_excess": 1.3}},
            "compute_straggler",
            True,
            id="straggler-excess-still-met",
        ),
        pytest.param(
            _backward,
            {"utilization_imbalance": {"min_spread": 0.9}},
            "utilization_imbalance",
            False,
            id="spread",
        ),
        pytest.param(
            _oversubscribed,
            {"cpu_oversubscription": {"min_host_busy": 1.01}},
            "cpu_oversubscription",
            False,
            id="host-busy",
        ),
        # An override for one rule leaves the others alone.
        pytest.param(
            _starved,
            {"batch_split": {"min_ratio": 100.0}},
            "data_starvation",
            True,
            id="other-rule-untouched",
        ),
    ],
)
def test_thresholds_overridable_through_the_engine(
    build: Callable[..., Snapshot], overrides: dict, kind: str, present: bool
) -> None:
    kinds = {f.kind for f in analyze(build(), overrides=overrides)}
    assert (kind in kinds) is present


@pytest.mark.parametrize(
    "overrides",
    [
        {"no_such_rule": {}},
        {"data_starvation": {}, "hardware_straggler_typo": {"min_steps": 1}},
        {"DATA_STARVATION": {"min_wait_ratio": 0.1}},
    ],
)
def test_unknown_rule_name_raises(overrides: dict) -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        analyze(_starved(), overrides=overrides)


def test_empty_snapshot_has_no_findings() -> None:
    snap = JobBuilder(balanced(2)).snapshot()
    assert snap.ranks == ()
    assert analyze(snap) == []


def test_window_judges_only_recent_steps() -> None:
    # Rank 2 straggled for 40 steps, then recovered for 40. A window over the last ~3 s
    # (about 28 steps of 105 ms) sees a balanced job; the whole run's medians sit on the
    # boundary, so only the recent window is asserted.
    job = JobBuilder(forward_straggler()).run(40).run(40, balanced(4))
    assert analyze(job.snapshot(window_s=3.0)) == []
    # The reverse: it starts straggling; the recent window names it, and the run's history
    # says when (slowdown reads the whole run whatever the window).
    job = JobBuilder(balanced(4)).run(40).run(30, forward_straggler())
    findings = analyze(job.snapshot(window_s=3.0))
    assert {(f.kind, f.ranks) for f in findings} == {
        ("compute_straggler", (2,)),
        ("utilization_imbalance", (2,)),
        ("slowdown", (2,)),
    }


def test_saturated_host_fix_never_raises_workers() -> None:
    # Rank 3 starves on a saturated host where cpu_oversubscription blames every rank: no
    # finding anywhere may tell rank 3 to start more workers.
    specs = [replace(s, worker_cpu=0.9) for s in starved_rank3()]
    findings = analyze(ddp_snapshot(specs, nodes={"node0": NodeSpec(cores=16, busy_cores=16)}))
    assert {f.kind for f in findings} == {"data_starvation", "cpu_oversubscription"}
    # Both findings name rank 3, and each has a fix for it.
    assert all(3 in f.ranks and 3 in phrase(f).fixes for f in findings), [
        f.to_dict() for f in findings
    ]
    # The only worker count proposed for rank 3 is fewer (cpu_oversubscription's 2 -> 1);
    # starvation asks for cheaper loading, not more workers.
    proposed = [
        (f.kind, int(new))
        for f in findings
        for new in re.findall(r"num_workers 2 -> (\d+)", phrase(f).fixes[3])
    ]
    assert proposed == [("cpu_oversubscription", 1)]


def test_rules_are_pure() -> None:
    # Same snapshot twice, same answer; the snapshot is not changed by being judged.
    snap = _uneven()
    before = [v.steps for v in snap.ranks]
    first = [f.to_dict() for f in analyze(snap)]
    second = [f.to_dict() for f in analyze(snap)]
    assert first == second
    assert [v.steps for v in snap.ranks] == before


def test_rank_spec_defaults_make_a_100ms_step() -> None:
    # Guard for the builders' nominal numbers the other modules compute by hand with.
    spec = RankSpec()
    assert spec.local == pytest.approx(0.101)
    assert spec.compute == pytest.approx(0.100)
