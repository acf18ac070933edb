"""The DDP barrier model behind every predicted speed-up, and severity from the speed-up."""

from __future__ import annotations

import dataclasses
import random

import pytest

from auditor.analysis import analyze, engine
from auditor.analysis.advisor import comm_floor, job_step_s, predicted_speedup
from auditor.analysis.findings import Finding, severity_for
from auditor.analysis.measures import PeerMedians, peer_median, ready
from auditor.analysis.rules import REGISTRY, RULES
from auditor.analysis.stats import RankStats
from tests.helpers.jobs import JobBuilder, RankSpec


def _rs(rank: int, step_s: float, wait: float | None, steps: int = 10) -> RankStats:
    return RankStats(
        rank=rank,
        host="h",
        device="cuda:0",
        steps=steps,
        step_s=step_s,
        data_wait_s=0.0,
        h2d_s=0.0,
        forward_s=0.0,
        backward_s=0.0,
        optimizer_s=0.0,
        collective_wait_s=wait,
        compute_s=step_s - (wait or 0.0),
        batch_size=None,
        main_cpu=None,
        worker_cpu=None,
        workers=0,
        loader=None,
        rss_bytes=None,
        mem_allocated_bytes=None,
        mem_peak_bytes=None,
    )


def _job(*waits: float | None, step: float = 0.2) -> dict[int, RankStats]:
    """A DDP job: every rank's step is ``step``; rank r waited ``waits[r]`` at the all-reduce."""
    return {r: _rs(r, step, w) for r, w in enumerate(waits)}


@pytest.mark.parametrize(
    ("stats", "floor"),
    [
        pytest.param(_job(0.01, 0.09, 0.05), 0.01, id="least-wait"),
        pytest.param(_job(None, 0.09, 0.03), 0.03, id="unmeasured-ignored"),
        pytest.param(_job(None, None), 0.0, id="nothing-measured"),
        pytest.param({}, 0.0, id="empty"),
    ],
)
def test_comm_floor(stats: dict[int, RankStats], floor: float) -> None:
    assert comm_floor(stats) == pytest.approx(floor)


@pytest.mark.parametrize(
    ("stats", "local", "expected"),
    [
        # Locals 0.19, 0.11, 0.15; floor 0.01: 0.19 + 0.01 = 0.2, the observed step.
        pytest.param(_job(0.01, 0.09, 0.05), None, 0.2, id="observed"),
        # Rank 0 brought to 0.11: the slowest local is now rank 2's 0.15.
        pytest.param(_job(0.01, 0.09, 0.05), {0: 0.11}, 0.16, id="fix-slowest"),
        # Speeding up a rank that waits changes nothing.
        pytest.param(_job(0.01, 0.09, 0.05), {1: 0.05}, 0.2, id="fix-a-waiter"),
        pytest.param(_job(0.01, 0.09, 0.05), {0: 0.05, 2: 0.05}, 0.12, id="fix-two"),
        pytest.param({}, None, 0.0, id="empty"),
    ],
)
def test_job_step(
    stats: dict[int, RankStats], local: dict[int, float] | None, expected: float
) -> None:
    assert job_step_s(stats, local) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("stats", "new_local", "expected"),
    [
        # 0.2 / 0.16 = 1.25
        pytest.param(_job(0.01, 0.09, 0.05), {0: 0.11}, 1.25, id="slowest-fixed"),
        # 0.2 / (0.11 + 0.01) = 1.667
        pytest.param(_job(0.01, 0.09, 0.05), {0: 0.11, 2: 0.11}, 0.2 / 0.12, id="all-equal"),
        pytest.param(_job(0.01, 0.09, 0.05), {1: 0.01}, 1.0, id="waiter-fixed"),
        # A "fix" that slows a rank down is never reported as a slow-down below 1.
        pytest.param(_job(0.01, 0.09, 0.05), {0: 0.5}, 1.0, id="clamped-at-1"),
        pytest.param(_job(0.01, 0.09), {}, 1.0, id="no-change"),
        pytest.param({}, {0: 0.1}, 1.0, id="empty"),
        pytest.param(_job(0.0, 0.0, step=0.0), {0: 0.0}, 1.0, id="zero-step"),
    ],
)
def test_predicted_speedup(
    stats: dict[int, RankStats], new_local: dict[int, float], expected: float
) -> None:
    assert predicted_speedup(stats, new_local) == pytest.approx(expected)


def test_predicted_speedup_on_a_constructed_job_by_hand() -> None:
    # Two ranks, no jitter: rank 1's own work is 141 ms (forward 70 ms), rank 0's 101 ms, comm
    # 4 ms. Observed step 145 ms; rank 1 brought to 101 ms: 105 ms. 145 / 105 = 1.381.
    snap = JobBuilder([RankSpec(), RankSpec(forward=0.070)], jitter=0.0).run(10).snapshot()
    stats = snap.stats
    assert job_step_s(stats) == pytest.approx(0.145)
    assert predicted_speedup(stats, {1: stats[0].local_s}) == pytest.approx(0.145 / 0.105)


@pytest.mark.parametrize(
    ("speedup", "severity"),
    [
        (None, "info"),
        (1.0, "info"),
        (1.099, "info"),
        (1.10, "warning"),
        (1.499, "warning"),
        (1.5, "critical"),
        (3.0, "critical"),
    ],
)
def test_severity_for(speedup: float | None, severity: str) -> None:
    assert severity_for(speedup) == severity


def test_severity_thresholds_are_parameters() -> None:
    assert severity_for(1.05, warning_at=1.05) == "warning"
    assert severity_for(1.3, critical_at=1.3) == "critical"


def test_finding_validates_its_severity() -> None:
    with pytest.raises(ValueError, match="unknown severity"):
        Finding(kind="batch_split", severity="fatal", ranks=())


def test_the_engine_refuses_a_finding_of_a_kind_no_rule_declares(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rule = RULES["batch_split"]
    rogue = dataclasses.replace(
        rule,
        measure=lambda snap, t: snap,
        decide=lambda i, t, e: [Finding(kind="no_such_kind", severity="info", ranks=())],
    )
    monkeypatch.setattr(engine, "REGISTRY", tuple(rogue if r is rule else r for r in REGISTRY))
    with pytest.raises(ValueError, match="unknown kind 'no_such_kind'"):
        analyze(JobBuilder([RankSpec(), RankSpec()]).run(10).snapshot())


def test_common_helpers() -> None:
    assert peer_median({0: 1.0, 1: 2.0, 2: 10.0}, 2) == 1.5
    assert peer_median({0: 1.0}, 0) is None
    stats = {0: _rs(0, 0.1, 0.0, steps=8), 1: _rs(1, 0.1, 0.0, steps=7), 2: _rs(2, 0.0, None)}
    assert set(ready(stats, 8)) == {0}


@pytest.mark.parametrize("size", range(7))
def test_peer_medians_equal_one_median_per_key(size: int) -> None:
    """Every key's peer median, read off the one sort, is the median of the others' values
    taken afresh: odd and even counts, ties, keys with no value, keys not in the set."""
    rng = random.Random(size)
    for _ in range(50):
        values: dict[int, float | None] = {
            k: rng.choice([None, float(rng.randint(0, 4)), rng.random()]) for k in range(size)
        }
        medians = PeerMedians(values)
        measured = {k: v for k, v in values.items() if v is not None}
        for key in [*values, -1]:
            expected = (
                peer_median(measured, key)
                if key in measured
                else (peer_median(measured, -1) if measured else None)
            )
            assert medians.get(key) == expected, (values, key)
        # The least peer median any key has: what a rule screens against before asking.
        peers = [medians.get(k) for k in measured]
        assert medians.least() == (
            min(p for p in peers if p is not None) if len(measured) > 1 else None
        )
