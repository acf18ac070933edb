"""memory_growth: a rank's memory fitted against its steps over the whole run; a steady climb
past warm-up is named with its rate, level, capacity and time to full, and nothing else is."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import memory_growth
from auditor.analysis.rules.memory_growth import (
    ALLOCATED,
    ALLOCATOR_CACHE,
    DEVICE,
    DEVICE_LESS_OUTSIDE,
    EXPANDABLE_SEGMENTS,
    HOST,
    HOST_AVAILABLE,
    HOST_MEMORY,
    KIND,
    NVML_TOTAL_LESS_OTHERS,
    RESERVED,
    RSS,
    TENSORS_KEPT,
    UNKNOWN,
    Growth,
    theil_sen,
)
from auditor.analysis.snapshot import Snapshot
from auditor.audit import Audit
from auditor.report.phrasing import phrase
from auditor.telemetry.recorded import read_recording
from tests.helpers.growth import (
    FLAT,
    Course,
    device_budget,
    growth_snapshot,
    host_budget,
    leak,
)
from tests.helpers.units import GIB, MIB

# Every helper job steps every 50 ms: 20 steps a second, 1,200 a minute.
STEPS_PER_MIN = 1_200
# A rank's warm-up: 300 MiB over its first 30 steps (allocator, workers, imports), then flat.
WARM = Course(warmup=300 * MIB, warmup_steps=30)


def _only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.to_dict() for f in findings]
    return findings[0]


def _growth(f: Finding, rank: int) -> Growth:
    g = f.facts.ranks[rank]
    assert isinstance(g, Growth)
    return g


def test_a_host_leak_is_found_with_its_rate_exact() -> None:
    # Rank 0 keeps 2 MiB a step from the start; its RSS is read every 10 steps (a staircase).
    snap = growth_snapshot(
        {0: leak(2 * MIB, warmup=300 * MIB, warmup_steps=30), 1: WARM},
        flush=10,
        budgets={0: host_budget(0, available=16 * GIB, at_step=300)},
    )
    f = _only(memory_growth.RULE(snap))
    assert f.kind == KIND and f.ranks == (0,)
    g = _growth(f, 0)
    assert g.where == HOST and g.figure == RSS and g.climbing == (RSS,)
    assert g.cause == HOST_MEMORY
    assert g.bytes_per_step == pytest.approx(2 * MIB, rel=1e-9)
    assert g.bytes_per_minute == pytest.approx(2 * MIB * STEPS_PER_MIN, rel=1e-6)
    # It climbs from the start (the warm-up adds on top of the leak in the first steps).
    assert g.since_step <= 40
    # Level: read after step 599: 512 + 300 + 2 x 599 MiB.
    assert g.level_bytes == (512 + 300 + 2 * 599) * MIB
    # Capacity: its RSS when the budget was measured (at step 300: the RSS read after step 299)
    # and the 16 GiB the host had available then.
    assert g.capacity_source == HOST_AVAILABLE
    assert g.capacity_bytes == (512 + 300 + 2 * 299) * MIB + 16 * GIB
    # Full: (16 GiB - 300 steps x 2 MiB since) at 40 MiB/s.
    expected = (16 * GIB - 2 * MIB * 300) / (2 * MIB * 20)
    assert g.full_in_s == pytest.approx(expected, rel=1e-6)
    assert f.severity == "critical"  # 6.6 minutes
    assert f.fixes == (Fix("retained_tensors", 0, None, None, None, (KIND,)),)
    assert f.predicted_speedup is None
    row = f.evidence["per_rank"]["0"]
    assert row["bytes_per_step"] == 2 * MIB
    assert row["where"] == "host" and row["cause"] == "host_memory"
    assert row["causes"][:2] == ["loss_kept", "outputs_kept"]
    assert row["full_in_s"] == pytest.approx(expected, abs=0.1)
    assert f.evidence["speedup_model"] == "not_predicted"


def test_a_device_leak_names_allocated_and_the_gpu_capacity() -> None:
    snap = growth_snapshot(
        allocated={0: leak(12 * MIB, base=2 * GIB), 1: Course(base=2 * GIB)},
        budgets={0: device_budget(0, total=80 * GIB, outside=GIB)},
    )
    f = _only(memory_growth.RULE(snap))
    g = _growth(f, 0)
    assert g.where == DEVICE and g.figure == ALLOCATED
    # Reserved follows allocated (256 MiB of cache on top): both climb; the leak is tensors.
    assert g.climbing == (ALLOCATED, RESERVED)
    assert g.cause == TENSORS_KEPT
    assert g.bytes_per_step == pytest.approx(12 * MIB)
    assert g.capacity_source == DEVICE_LESS_OUTSIDE
    assert g.capacity_bytes == 79 * GIB
    level = 2 * GIB + 12 * MIB * 599
    assert g.level_bytes == level
    assert g.full_in_s == pytest.approx((79 * GIB - level) / (12 * MIB * 20))
    assert f.severity == "critical"  # 5.5 minutes


def test_without_a_budget_the_gpu_total_comes_from_nvml() -> None:
    snap = growth_snapshot(
        allocated={0: leak(12 * MIB, base=2 * GIB), 1: Course(base=2 * GIB)},
        gpu_total=80 * GIB,
        context=512 * MIB,
    )
    g = _growth(_only(memory_growth.RULE(snap)), 0)
    assert g.capacity_source == NVML_TOTAL_LESS_OTHERS
    # What NVML sees beyond the rank's reserved bytes (its context) is not the rank's room.
    assert g.capacity_bytes == pytest.approx(80 * GIB - 512 * MIB)
    assert g.gpu == "node0 GPU 0"


def test_the_allocators_cache_alone_climbing_is_told_from_a_leak() -> None:
    snap = growth_snapshot(
        allocated={0: Course(base=4 * GIB), 1: Course(base=4 * GIB)},
        reserved={0: leak(6 * MIB, base=5 * GIB), 1: Course(base=5 * GIB)},
        budgets={0: device_budget(0)},
    )
    f = _only(memory_growth.RULE(snap))
    g = _growth(f, 0)
    assert g.climbing == (RESERVED,) and g.figure == RESERVED
    assert g.cause == ALLOCATOR_CACHE
    assert f.fixes == (Fix("allocator_config", 0, None, EXPANDABLE_SEGMENTS, None, (KIND,)),)


def test_a_warm_up_that_levels_off_is_not_a_climb() -> None:
    # 1 GiB over the first 40 steps, then flat.
    quick = Course(warmup=GIB, warmup_steps=40)
    # A long warm-up: 600 MiB over the first 200 of 600 steps, past the steps skipped.
    slow = Course(warmup=600 * MIB, warmup_steps=200)
    snap = growth_snapshot({0: quick, 1: slow}, flush=10)
    assert memory_growth.RULE(snap) == []
    snap = growth_snapshot(allocated={0: quick, 1: slow})
    assert memory_growth.RULE(snap) == []


@pytest.mark.parametrize("stop", [300, 400, 450])
def test_a_climb_that_levels_off_is_not_found(stop: int) -> None:
    snap = growth_snapshot({0: leak(2 * MIB, stop=stop), 1: FLAT}, flush=10)
    assert memory_growth.RULE(snap) == []
    snap = growth_snapshot(allocated={0: leak(2 * MIB, stop=stop), 1: FLAT})
    assert memory_growth.RULE(snap) == []


@pytest.mark.parametrize("start", [150, 250, 300, 330])
def test_a_leak_that_starts_midway_is_found_from_where_it_starts(start: int) -> None:
    """Flat, then 2 MiB a step from ``start`` of 600 steps. The span's Theil-Sen line reads a
    climb flat for 40% of it low (1.73 MiB a step from step 300); the later half's line is the
    climb's own, and the rate reported."""
    snap = growth_snapshot({0: leak(2 * MIB, start=start), 1: FLAT}, flush=10)
    g = _growth(_only(memory_growth.RULE(snap)), 0)
    assert g.bytes_per_step == pytest.approx(2 * MIB, rel=0.01)
    # Within the staircase's noise band (10 steps a stair) of the start.
    assert abs(g.since_step - start) <= 40


@pytest.mark.parametrize(
    "course",
    [
        Course(noise=64 * MIB),
        Course(noise=256 * MIB),
        # A slope far below the noise: 0.05 MiB a step under +-128 MiB.
        Course(per_step=0.05 * MIB, noise=128 * MIB),
    ],
    ids=["noise", "large-noise", "slope-under-noise"],
)
def test_noise_is_not_a_climb(course: Course) -> None:
    for seed in range(3):
        snap = growth_snapshot({0: course, 1: course}, flush=10, seed=seed)
        assert memory_growth.RULE(snap) == []
        snap = growth_snapshot(allocated={0: course, 1: course}, seed=seed)
        assert memory_growth.RULE(snap) == []


def test_a_leak_under_noise_keeps_its_rate() -> None:
    snap = growth_snapshot({0: leak(2 * MIB, noise=32 * MIB), 1: FLAT}, flush=10, seed=1)
    g = _growth(_only(memory_growth.RULE(snap)), 0)
    assert g.bytes_per_step == pytest.approx(2 * MIB, rel=0.1)


@pytest.mark.parametrize(
    ("available", "severity"),
    [
        (10 * GIB, "critical"),  # 10 GiB at 40 MiB/s: 4 minutes
        (200 * GIB, "warning"),  # 85 minutes
        (3_000 * GIB, "warning"),  # 21 hours
        (5_000 * GIB, "info"),  # 36 hours: beyond a day
        (None, "info"),  # no capacity known: no time to full
    ],
    ids=["minutes", "hours", "within-a-day", "beyond-a-day", "unknown"],
)
def test_severity_follows_the_time_to_full(available: float | None, severity: str) -> None:
    budgets = {} if available is None else {0: host_budget(0, available=available, at_step=599)}
    snap = growth_snapshot({0: leak(2 * MIB), 1: FLAT}, flush=10, budgets=budgets)
    # The horizons alone (a 30 s run projects hours only with the projection's bound lifted).
    f = _only(memory_growth.RULE(snap, max_projection=1e9))
    g = _growth(f, 0)
    if available is None:
        assert g.full_in_s is None and g.capacity_source == UNKNOWN
    else:
        assert g.full_in_s == pytest.approx(available / (40 * MIB), rel=1e-6)
    assert f.severity == severity


@pytest.mark.parametrize(
    ("available", "severity", "early"),
    [
        (40 * GIB, "critical", False),  # 17 minutes: 43 times the 24 s it was seen
        (200 * GIB, "info", True),  # 85 minutes: 213 times
    ],
    ids=["soon", "far-past-what-was-seen"],
)
def test_a_projection_far_past_what_was_seen_is_info(
    available: float, severity: str, early: bool
) -> None:
    """A climb seen for 24 s (its fitted span) projects a crash at most 50 times that far:
    beyond, the climb is named as info, its time to full marked early."""
    snap = growth_snapshot(
        {0: leak(2 * MIB), 1: FLAT}, flush=10, budgets={0: host_budget(0, available=available)}
    )
    f = _only(memory_growth.RULE(snap))
    g = _growth(f, 0)
    assert g.seen_s == pytest.approx(24.0, abs=1.0)
    assert (f.severity, g.early) == (severity, early)
    assert f.evidence["per_rank"]["0"]["early"] is early
    words = phrase(f)
    assert ("too early to tell" in words.fixes[0]) is early


def test_allocated_bytes_climbing_briefly_are_not_early() -> None:
    """Allocated bytes count live tensors exactly: the same 24 s climb that RSS could not call
    (85 times past it here) is a warning on a GPU."""
    snap = growth_snapshot(
        allocated={0: leak(2 * MIB), 1: FLAT}, budgets={0: device_budget(0, total=80 * GIB)}
    )
    f = _only(memory_growth.RULE(snap))
    g = _growth(f, 0)
    assert g.figure == ALLOCATED and g.seen_s is not None and g.full_in_s is not None
    assert g.full_in_s > 50 * g.seen_s
    assert (f.severity, g.early) == ("warning", False)


def test_the_same_projection_seen_for_long_enough_is_a_warning() -> None:
    # One step every 2.5 s: the climb's fitted span lasts 20 minutes; at 0.8 MiB/s the host
    # (4 GiB available at its first step) is full in an hour (3 times that).
    snap = growth_snapshot(
        {0: leak(2 * MIB), 1: FLAT},
        flush=10,
        step_s=2.5,
        budgets={0: host_budget(0, available=4 * GIB)},
    )
    f = _only(memory_growth.RULE(snap))
    g = _growth(f, 0)
    assert g.bytes_per_s == pytest.approx(0.8 * MIB, rel=1e-6)
    assert g.seen_s == pytest.approx(1200.0, rel=0.05)
    assert g.full_in_s is not None and 30 * 60 < g.full_in_s < 50 * g.seen_s
    assert (f.severity, g.early) == ("warning", False)


def test_the_severity_horizons_are_thresholds() -> None:
    snap = growth_snapshot(
        {0: leak(2 * MIB), 1: FLAT}, flush=10, budgets={0: host_budget(0, available=200 * GIB)}
    )
    # 200 GiB at 40 MiB/s: about 85 minutes.
    assert _only(memory_growth.RULE(snap, max_projection=1e9)).severity == "warning"
    assert (
        _only(memory_growth.RULE(snap, critical_s=2 * 3600, max_projection=1e9)).severity
        == "critical"
    )
    assert _only(memory_growth.RULE(snap, warning_s=3600)).severity == "info"


def test_two_ranks_leaking_on_one_host_fill_it_together() -> None:
    snap = growth_snapshot(
        {0: leak(2 * MIB), 1: leak(2 * MIB)},
        flush=10,
        budgets={r: host_budget(r, available=16 * GIB, at_step=599) for r in (0, 1)},
    )
    f = _only(memory_growth.RULE(snap))
    assert f.ranks == (0, 1)
    for r in (0, 1):
        g = _growth(f, r)
        assert g.shared_with == (1 - r,)
        # Twice the rate: 16 GiB at 80 MiB/s.
        assert g.full_in_s == pytest.approx(16 * GIB / (80 * MIB), rel=1e-6)
    assert f.fixes == tuple(Fix("retained_tensors", r, None, None, None, (KIND,)) for r in (0, 1))


def test_eight_ranks_one_leaking_gpu_rank_is_named_alone() -> None:
    courses = {r: Course(base=3 * GIB, warmup=GIB, warmup_steps=25) for r in range(8)}
    courses[5] = leak(4 * MIB, base=3 * GIB, warmup=GIB, warmup_steps=25)
    snap = growth_snapshot(
        allocated=courses, budgets={r: device_budget(r) for r in range(8)}, steps=800
    )
    f = _only(memory_growth.RULE(snap))
    assert f.ranks == (5,)
    g = _growth(f, 5)
    assert g.bytes_per_step == pytest.approx(4 * MIB)
    assert g.shared_with == ()  # each rank its own GPU


def test_eight_ranks_of_different_severities_are_split_by_severity() -> None:
    courses = {r: FLAT for r in range(8)}
    courses[2] = leak(2 * MIB)
    courses[6] = leak(2 * MIB)
    budgets = {
        2: host_budget(2, available=8 * GIB, at_step=599),
        6: host_budget(6, available=8 * GIB, at_step=599),
    }
    snap = growth_snapshot(courses, flush=10, budgets=budgets, host="node0")
    (found,) = memory_growth.RULE(snap)
    # One host: both fill it together.
    assert found.ranks == (2, 6)
    assert found.severity == "critical"
    hosts = {2: "a", 6: "b"}
    split = growth_snapshot(courses, flush=10, budgets=budgets)
    split = replace(
        split,
        ranks=tuple(
            replace(v, info=replace(v.info, host=hosts.get(v.info.rank, "c"))) for v in split.ranks
        ),
    )
    (alone,) = memory_growth.RULE(split)
    assert {r: _growth(alone, r).shared_with for r in alone.ranks} == {2: (), 6: ()}


def test_a_short_run_is_not_judged() -> None:
    snap = growth_snapshot({0: leak(8 * MIB), 1: FLAT}, steps=60)
    assert memory_growth.RULE(snap) == []
    assert memory_growth.RULE(snap, warmup_steps=5, min_steps=20) != []


def test_silent_without_a_history() -> None:
    snap = growth_snapshot({0: leak(2 * MIB), 1: FLAT})
    assert memory_growth.RULE(replace(snap, history={})) == []
    assert memory_growth.RULE(Snapshot(job="x", start=0.0, end=1.0, ranks=())) == []


def test_theil_sen_ignores_a_staircase_and_outliers() -> None:
    xs = [float(k) for k in range(200)]
    stairs = [float((k // 10 * 10 + 9) * 3) for k in range(200)]
    assert theil_sen(xs, stairs) == pytest.approx(3.0)
    spiky = [3.0 * k + (1e6 if k % 17 == 0 else 0.0) for k in range(200)]
    assert theil_sen(xs, spiky) == pytest.approx(3.0)
    assert theil_sen(xs, [5.0] * 200) is None  # flat: no pair spans a change
    assert theil_sen([1.0], [1.0]) is None


def test_the_engine_names_the_leak_and_no_larger_batch_for_it() -> None:
    budget = replace(
        device_budget(0),
        param_bytes=GIB,
        grad_bytes=GIB,
        optimizer_bytes=2 * GIB,
        activation_bytes=256 * MIB,
        activation_batch=32,
    )
    snap = growth_snapshot(
        allocated={0: leak(8 * MIB, base=5 * GIB), 1: Course(base=5 * GIB)},
        budgets={0: budget, 1: replace(budget, rank=1, device="cuda:1")},
    )
    findings = analyze(snap)
    (growth,) = [f for f in findings if f.kind == KIND]
    assert growth.ranks == (0,)
    raises = [
        fx
        for f in findings
        for fx in f.fixes
        if fx.lever == "batch_size"
        and fx.rank == 0
        and isinstance(fx.proposed, int)
        and isinstance(fx.current, int)
        and fx.proposed > fx.current
    ]
    assert raises == []
    # Rank 1, flat, still gets its larger batch.
    assert any(fx.lever == "batch_size" and fx.rank == 1 for f in findings for fx in f.fixes)


def test_a_leak_whose_heap_is_trimmed_at_the_end_still_climbs() -> None:
    """A real CPU job (``bench/gpu_validate.py --dry-run``'s leak: rank 1 keeps every step's loss
    with its graph), recorded: rank 1's RSS climbs in stairs from 381 to 1015 MiB, then the heap
    hands 48 MiB back in its last steps. The last third's plain slope fell to 1.3 MiB a step
    (under half the rate: "the rise stopped", no finding); its running maximum climbs on."""
    data = Path(__file__).parents[1] / "data" / "cpu_leak_heap_trimmed"
    rec = read_recording(data / "recording.jsonl")
    audit = Audit(rec.job, window_s=None)
    audit.add(rec.batch)
    _, findings = audit.final()
    growth = [f for f in findings if f.kind == "memory_growth"]
    assert [(f.ranks, f.severity) for f in growth] == [((1,), "critical")]
    own = json.loads((data / "rank1_own_measure.json").read_text())["bytes_per_step"]
    rate = growth[0].evidence["per_rank"]["1"]["bytes_per_step"]
    assert abs(rate / own - 1) <= 0.1, (rate, own)
