"""The range of a predicted speed-up: the rules on parts of the window (auditor.analysis.spread),
as the final verdict gives it (Audit.final)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis.findings import Finding
from auditor.analysis.snapshot import SampleStore
from auditor.analysis.spread import (
    host_ceiling,
    pace_spread,
    part_bounds,
    with_ceiling,
    with_pace,
    with_ranges,
)
from auditor.audit import Audit
from auditor.report.phrasing import phrase
from tests.helpers.jobs import JobBuilder, NodeSpec, balanced, forward_straggler, with_rank


def finding(speedup: float | None, ranks: tuple[int, ...] = (2,), kind: str = "stall") -> Finding:
    return Finding(kind=kind, severity="warning", ranks=ranks, predicted_speedup=speedup)


def test_parts_cover_the_window_in_equal_times() -> None:
    assert part_bounds(10.0, 18.0, 4) == [(10.0, 12.0), (12.0, 14.0), (14.0, 16.0), (16.0, 18.0)]
    assert part_bounds(10.0, 10.0, 4) == []
    assert part_bounds(float("-inf"), 10.0, 4) == []


def test_a_range_runs_from_the_least_to_the_most_of_the_window_and_its_parts() -> None:
    whole = [finding(2.1), finding(1.5, ranks=(0,)), finding(None, kind="memory_headroom")]
    parts = [
        [finding(2.0), finding(1.4, ranks=(0,))],
        [finding(2.4), finding(None, kind="memory_headroom")],
        [finding(1.8)],
        [],  # this part did not find it: it says nothing about its size
    ]
    got = {(f.kind, f.ranks): f.predicted_range for f in with_ranges(whole, parts)[0]}
    assert got[("stall", (2,))] == (1.8, 2.4)
    # Found by one part only: no range (the report gives the one figure).
    assert got[("stall", (0,))] is None
    # Predicts nothing: nothing to range.
    assert got[("memory_headroom", (2,))] is None


def test_a_range_grows_over_what_later_parts_and_the_rule_said() -> None:
    """A rule may give a range from its model (the point is its low end); the parts stretch it,
    halves after quarters; ``only`` limits which findings are stretched."""
    ranged, done = with_ranges([finding(2.0)], [[finding(1.9)], [finding(2.2)]])
    assert ranged[0].predicted_range == (1.9, 2.2) and done == {("stall", (2,), ())}
    again, _ = with_ranges(ranged, [[finding(1.0)], [finding(3.0)]])
    assert again[0].predicted_range == (1.0, 3.0)
    untouched, none = with_ranges(ranged, [[finding(1.0)], [finding(3.0)]], only=set())
    assert untouched == ranged and none == set()
    from_rule = replace(finding(2.0), predicted_range=(2.0, 2.6))
    assert with_ranges([from_rule], [[finding(1.9)], [finding(2.1)]])[0][0].predicted_range == (
        1.9,
        2.6,
    )


def audit_of(builder: JobBuilder) -> Audit:
    audit = Audit("test", window_s=None)
    audit.store = builder.store
    return audit


def straggler(audit: Audit) -> Finding:
    _, findings = audit.final()
    return next(f for f in findings if f.kind == "compute_straggler")


def test_a_steady_straggler_gets_a_narrow_range_around_its_prediction() -> None:
    audit = audit_of(JobBuilder(forward_straggler(), store=SampleStore("test")).run(160))
    f = straggler(audit)
    assert f.predicted_speedup is not None and f.predicted_range is not None
    lo, hi = f.predicted_range
    assert lo <= f.predicted_speedup <= hi
    assert hi / lo < 1.05  # 2% jitter per phase, nothing else moves


def test_a_noisy_straggler_gets_the_spread_of_its_parts() -> None:
    """30% jitter per phase: each quarter's medians differ, and so do their predictions."""
    builder = JobBuilder(forward_straggler(), jitter=0.3, seed=3, store=SampleStore("test"))
    f = straggler(audit_of(builder.run(160)))
    assert f.predicted_speedup is not None and f.predicted_range is not None
    lo, hi = f.predicted_range
    assert lo < f.predicted_speedup < hi
    # Its fix says the range.
    assert f"expect {f.predicted_speedup:.1f}x ({lo:.1f}-{hi:.1f}x)" in phrase(f).fixes[2]


def test_a_straggler_that_turned_slower_is_ranged_over_the_steps_since() -> None:
    """Rank 2's forward takes 70 ms for half the run, then 110 ms: the verdict judges the steps
    since the change (a slowdown), and so does the range: the parts before it are left out."""
    builder = JobBuilder(forward_straggler(), store=SampleStore("test")).run(100)
    builder.run(100, with_rank(balanced(4), 2, forward=0.110))
    f = straggler(audit_of(builder))
    assert "since_step" in f.evidence
    assert f.predicted_range is not None
    # Under the barrier model: (rank 2's 181 ms + 4 ms comm) / (101 ms own work + 4 ms comm).
    assert f.predicted_range == pytest.approx(((0.185 / 0.105),) * 2, rel=0.03)


def test_a_fault_that_begins_midway_is_ranged_by_the_parts_that_saw_it() -> None:
    """Balanced for the first half: the parts before the onset find nothing and do not drag the
    range down to 1x."""
    builder = JobBuilder(balanced(4), store=SampleStore("test")).run(100)
    builder.run(100, forward_straggler())
    f = straggler(audit_of(builder))
    assert f.predicted_range is not None
    assert f.predicted_range[0] > 1.2


def test_a_host_ceiling_lowers_the_range_of_what_it_caps() -> None:
    capped = with_ceiling([finding(2.0), finding(1.4, ranks=(0,))], ceiling=1.6)
    assert capped[0].predicted_range == (1.6, 2.0)  # no range yet: from the ceiling up
    assert capped[1].predicted_range is None  # below the ceiling: untouched
    ranged, _ = with_ranges([finding(2.0)], [[finding(1.9)], [finding(2.2)]])
    assert with_ceiling(ranged, 1.5)[0].predicted_range == (1.5, 2.2)
    assert with_ceiling(ranged, None) == ranged


@pytest.mark.parametrize("busy, ceiling", [(1.6, 2.0 / 1.6), (0.5, 4.0)])
def test_the_busiest_hosts_cores_over_its_busy_cores(busy: float, ceiling: float) -> None:
    nodes = {"node0": NodeSpec(cores=2.0, busy_cores=busy)}
    snap = JobBuilder(forward_straggler(), nodes=nodes).run(40).snapshot()
    assert host_ceiling(snap) == pytest.approx(ceiling)
    assert host_ceiling(replace(snap, nodes=())) is None  # no host sampled: no ceiling


def test_a_range_reaches_out_as_far_as_the_jobs_pace_moved_over_the_parts() -> None:
    # Three parts found the stall, at job steps of 100, 104 and 110 ms: a re-run can step
    # 1.1x faster or slower than this one, so the range (1.8, 2.4) reaches to (1.8/1.1, 2.4x1.1).
    # The part that did not find it, and the one without a pace, say nothing.
    parts = [[finding(2.0)], [finding(2.4)], [finding(1.8)], [], [finding(2.2)]]
    spread = pace_spread(parts, [0.100, 0.104, 0.110, 0.050, None])
    assert spread == {("stall", (2,), ()): pytest.approx(1.1)}
    (ranged,) = with_ranges([finding(2.1)], parts)[0]
    (f,) = with_pace([ranged], spread)
    assert f.predicted_range == pytest.approx((1.8 / 1.1, 2.4 * 1.1))
    assert f.evidence["pace_spread"] == 1.1
    # Never below 1.0; no range or no spread: as it was.
    low = replace(ranged, predicted_range=(1.02, 1.1))
    assert with_pace([low], spread)[0].predicted_range == pytest.approx((1.0, 1.21))
    assert with_pace([finding(2.1)], spread) == [finding(2.1)]
    assert with_pace([ranged], {}) == [ranged]


def test_a_busy_host_bounds_the_range_of_a_sleeping_straggler() -> None:
    """Rank 2 of 4 sleeps 40 ms more in its forward on a 2-core host 1.6 cores busy: removing
    the sleep leaves the CPU work, at most 2 / 1.6 = 1.25x faster."""
    nodes = {"node0": NodeSpec(cores=2.0, busy_cores=1.6)}
    builder = JobBuilder(forward_straggler(), nodes=nodes, store=SampleStore("test")).run(160)
    f = straggler(audit_of(builder))
    assert f.predicted_speedup is not None and f.predicted_speedup > 1.25
    assert f.predicted_range is not None
    # The ceiling, and as far again as the job's own pace moved over the parts.
    q = f.evidence.get("pace_spread", 1.0)
    assert isinstance(q, float) and 1.0 <= q < 1.05
    assert f.predicted_range[0] == pytest.approx(1.25 / q, rel=1e-3)  # q rounded to 3 places
    assert f.predicted_range[1] >= f.predicted_speedup
