"""memory_growth in words: the rank, its rate a step and a minute, since when, its level against
its capacity and the time to full; what climbs and the usual causes as the change to make."""

from __future__ import annotations

from dataclasses import replace

from auditor.analysis.findings import Finding
from auditor.analysis.rules import memory_growth
from auditor.analysis.rules.memory_growth import (
    ALLOCATED,
    ALLOCATOR_CACHE,
    CAUSES,
    DEVICE,
    DEVICE_LESS_OUTSIDE,
    HOST,
    HOST_AVAILABLE,
    HOST_MEMORY,
    RESERVED,
    RSS,
    TENSORS_KEPT,
    UNKNOWN,
    Facts,
    Growth,
)
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.report.phrasing.memory_growth import fmt_time_left, live_tag
from tests.helpers.growth import FLAT, growth_snapshot, host_budget, leak
from tests.helpers.units import GIB, MIB

HOST_LEAK = Growth(
    rank=0,
    where=HOST,
    figure=RSS,
    climbing=(RSS,),
    cause=HOST_MEMORY,
    causes=CAUSES[HOST_MEMORY],
    bytes_per_step=2.1 * MIB,
    bytes_per_s=2.1 * MIB * 60 / 60,
    since_step=12,
    level_bytes=1.5 * GIB,
    capacity_bytes=16 * GIB,
    capacity_source=HOST_AVAILABLE,
    full_in_s=41 * 60,
)


def _finding(*growths: Growth, severity: str = "critical") -> Finding:
    return Finding(
        kind="memory_growth",
        severity=severity,
        ranks=tuple(g.rank for g in growths),
        facts=Facts({g.rank: g for g in growths}),
    )


def test_a_host_leak_in_words() -> None:
    g = replace(HOST_LEAK, bytes_per_s=2.1 * MIB * 60 / 60)  # 60 steps a minute
    words = phrase(_finding(g))
    assert words.summary == (
        "rank 0's host memory climbs 2.1 MiB a step (126.0 MiB/min) since step 12: "
        "1.5 GiB of 16.0 GiB now; at that rate the host is full in 41 min"
    )
    fix = words.fixes[0]
    assert fix.startswith(
        "its memory grows: something is kept from every step (2.1 MiB a step); "
        "find what this rank keeps: a loss summed or appended as a tensor (keep loss.item()"
    )
    assert "outputs or predictions collected in a list" in fix
    assert "retain_graph=True" in fix
    assert "a cache, dict or list filled every step and never emptied" in fix
    assert fix.endswith("until it is fixed, at that rate the host is full in 41 min")
    assert str(words.notes["speedup_model"]).startswith("not predicted")
    assert words.notes["capacity_source"] == {
        "0": "the rank's memory plus the host's available memory (measured budget)"
    }


def test_a_device_leak_says_allocated_climbs_and_names_the_gpu() -> None:
    g = replace(
        HOST_LEAK,
        where=DEVICE,
        figure=ALLOCATED,
        climbing=(ALLOCATED, RESERVED),
        cause=TENSORS_KEPT,
        causes=CAUSES[TENSORS_KEPT],
        bytes_per_step=190 * MIB,
        bytes_per_s=190 * MIB,
        since_step=40,
        level_bytes=3.4 * GIB,
        capacity_bytes=138 * GIB,
        capacity_source=DEVICE_LESS_OUTSIDE,
        full_in_s=12 * 60,
        gpu="vm GPU 0",
    )
    words = phrase(_finding(g))
    assert words.summary == (
        "rank 0's GPU memory (allocated) climbs 190.0 MiB a step (11.1 GiB/min) since step 40: "
        "3.4 GiB of 138.0 GiB now; at that rate vm GPU 0 is full in 12 min"
    )
    assert words.fixes[0].startswith(
        "allocated memory grows: tensors are kept alive across steps (190.0 MiB a step)"
    )


def test_the_allocators_cache_climbing_points_at_fragmentation() -> None:
    g = replace(
        HOST_LEAK,
        where=DEVICE,
        figure=RESERVED,
        climbing=(RESERVED,),
        cause=ALLOCATOR_CACHE,
        causes=CAUSES[ALLOCATOR_CACHE],
        full_in_s=5 * 3600,
        gpu="node0 GPU 1",
    )
    words = phrase(_finding(g, severity="warning"))
    assert words.summary.startswith("rank 0's GPU memory (reserved by the allocator) climbs")
    assert words.summary.endswith("at that rate node0 GPU 1 is full in 5.0 h")
    fix = words.fixes[0]
    assert "reserved memory grows while allocated memory stays flat" in fix
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in fix
    assert "pad them to a few fixed shapes" in fix


def test_unknown_capacity_or_pace_projects_no_time() -> None:
    no_cap = replace(HOST_LEAK, capacity_bytes=None, capacity_source=UNKNOWN, full_in_s=None)
    words = phrase(_finding(no_cap, severity="info"))
    assert words.summary.endswith(
        "1.5 GiB now; the host's capacity is unknown: no time to full projected"
    )
    assert "until it is fixed" not in words.fixes[0]
    no_pace = replace(HOST_LEAK, bytes_per_s=None, full_in_s=None)
    words = phrase(_finding(no_pace, severity="info"))
    assert "2.1 MiB a step since step 12" in words.summary
    assert words.summary.endswith("the step rate is unknown: no time to full projected")


def test_several_ranks_soonest_full_first_and_sharing_said() -> None:
    a = replace(HOST_LEAK, rank=3, full_in_s=600.0, shared_with=(5,))
    b = replace(HOST_LEAK, rank=5, full_in_s=600.0, shared_with=(3,))
    c = replace(HOST_LEAK, rank=1, full_in_s=None, capacity_bytes=None)
    words = phrase(_finding(a, b, c))
    assert words.summary.startswith("ranks 1, 3, 5: rank 3's host memory climbs")
    assert "full in 10 min (with rank 5 climbing too); rank 5's host memory" in words.summary
    assert words.summary.index("rank 5's") < words.summary.index("rank 1's")
    assert set(words.fixes) == {1, 3, 5}
    many = [replace(HOST_LEAK, rank=r, full_in_s=60.0 * (r + 1)) for r in range(8)]
    words = phrase(_finding(*many))
    assert words.summary.startswith("ranks 0, 1, 2, 3, 4, 5, 6, 7: rank 0's")
    assert words.summary.endswith("; and 5 more")


def test_times_left_read_naturally() -> None:
    assert fmt_time_left(20) == "under a minute"
    assert fmt_time_left(41 * 60 + 10) == "41 min"
    assert fmt_time_left(3.5 * 3600) == "3.5 h"
    assert fmt_time_left(3 * 86400) == "3.0 days"
    assert live_tag(HOST_LEAK) == "memory +2.1 MiB/step, full in 41 min"
    assert live_tag(replace(HOST_LEAK, full_in_s=None)) == "memory +2.1 MiB/step"


def test_the_rule_and_its_words_agree_end_to_end() -> None:
    snap = growth_snapshot(
        {0: leak(2 * MIB), 1: FLAT},
        flush=10,
        budgets={0: host_budget(0, available=16 * GIB, at_step=599)},
    )
    (f,) = memory_growth.RULE(snap)
    words = phrase(f)
    # 2 MiB a step at 20 steps a second: 2.3 GiB a minute; 16 GiB at 40 MiB/s: 7 minutes.
    assert words.summary.startswith("rank 0's host memory climbs 2.0 MiB a step (2.3 GiB/min)")
    assert words.summary.endswith("at that rate the host is full in 7 min")
    report = ReportFinding.of(f)
    assert report.fixes == {0: words.fixes[0]}
    assert [a.lever for a in report.actions] == ["retained_tensors"]
