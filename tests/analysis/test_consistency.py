"""One report, one story: the review of the findings (auditor.analysis.consistency)."""

from __future__ import annotations

from auditor.analysis.consistency import (
    ACCOUNT_WAIT,
    FIX_UNDONE,
    GPU_WORKS,
    MEMORY_CLIMBS,
    review,
)
from auditor.analysis.engine import review as engine_review
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules.utilization_imbalance import Facts
from auditor.report.set_aside import sentence
from tests.helpers.gpus import GpuSpec, attach_gpus
from tests.helpers.jobs import JobBuilder, backward_straggler, balanced, with_rank


def _gpu_job() -> tuple[JobBuilder, list[str]]:
    job = JobBuilder(balanced(2)).run(40)
    uuids = attach_gpus(job, [GpuSpec(util=0.95), GpuSpec(util=0.0)])
    return job, uuids


def _idle(uuid: str, rank: int) -> Finding:
    return Finding("idle_device", "warning", (rank,), gpus=(uuid,))


def test_an_idle_gpu_whose_rank_computes_is_set_aside() -> None:
    job, uuids = _gpu_job()
    idle = _idle(uuids[1], 1)
    straggler = Finding("compute_straggler", "critical", (1,), predicted_speedup=1.8)
    out = review([straggler, idle], job.snapshot())
    assert out.findings == (straggler,)
    (aside,) = out.set_aside
    assert (aside.finding, aside.reason, aside.by_kind, aside.by_ranks) == (
        idle,
        GPU_WORKS,
        "compute_straggler",
        (1,),
    )
    text = sentence(aside, {uuids[1]: "node0 GPU 1"})
    assert text.startswith("Set aside: idle_device on node0 GPU 1")
    assert "compute_straggler on rank 1" in text


def test_an_idle_gpu_of_another_rank_stands() -> None:
    job, uuids = _gpu_job()
    idle = _idle(uuids[1], 1)
    straggler = Finding("compute_straggler", "critical", (0,), predicted_speedup=1.8)
    out = review([straggler, idle], job.snapshot())
    assert out.findings == (straggler, idle)
    assert out.set_aside == ()


def test_a_gpu_named_working_outranks_idle() -> None:
    job, uuids = _gpu_job()
    idle = _idle(uuids[0], 0)
    slow = Finding("hardware_straggler", "warning", (1,), gpus=(uuids[0],))
    out = review([slow, idle], job.snapshot())
    assert out.findings == (slow,)
    assert out.set_aside[0].reason == GPU_WORKS


def _batch(kind: str, severity: str, current: int, proposed: int, speedup: float | None) -> Finding:
    fix = Fix("batch_size", 0, current, proposed, speedup, (kind,))
    return Finding(kind, severity, (0,), predicted_speedup=speedup, fixes=(fix,))


def test_a_fix_that_undoes_a_stronger_one_is_set_aside() -> None:
    job = JobBuilder(balanced(2)).run(10)
    down = _batch("memory_pressure", "warning", 64, 32, None)
    up = _batch("memory_headroom", "info", 64, 256, None)
    out = review([down, up], job.snapshot())
    assert out.findings == (down,)
    (aside,) = out.set_aside
    assert (aside.finding, aside.reason, aside.lever) == (up, FIX_UNDONE, "batch_size")
    assert "batch_size fix would undo" in sentence(aside)


def test_fixes_in_the_same_direction_stand_together() -> None:
    job = JobBuilder(balanced(2)).run(10)
    a = _batch("memory_headroom", "info", 64, 256, None)
    b = _batch("batch_split", "warning", 64, 128, 1.3)
    out = review([b, a], job.snapshot())
    assert out.findings == (b, a)


def test_fixes_on_other_ranks_do_not_clash() -> None:
    job = JobBuilder(balanced(2)).run(10)
    a = _batch("memory_headroom", "info", 64, 256, None)
    b = Finding(
        "memory_pressure",
        "warning",
        (1,),
        fixes=(Fix("batch_size", 1, 64, 32, None, ("memory_pressure",)),),
    )
    assert review([b, a], job.snapshot()).findings == (b, a)


def test_no_larger_batch_on_a_rank_whose_memory_climbs() -> None:
    job = JobBuilder(balanced(2)).run(10)
    growth = Finding("memory_growth", "warning", (0,))
    split = _batch("batch_split", "critical", 32, 48, 1.4)
    # A smaller batch on the climbing rank stands (it makes room).
    smaller = Finding(
        "memory_pressure",
        "warning",
        (0,),
        fixes=(Fix("batch_size", 0, 48, 32, None, ("memory_pressure",)),),
    )
    out = review([growth, smaller, split], job.snapshot())
    assert out.findings == (growth, smaller)
    (aside,) = out.set_aside
    assert (aside.finding, aside.reason, aside.by_kind) == (split, MEMORY_CLIMBS, "memory_growth")
    assert "memory that already climbs (memory_growth on rank 0)" in sentence(aside)


def test_balanced_while_a_rank_waits_for_one_peer_is_not_shown() -> None:
    # Rank 0 waits ~64 ms of a ~199 ms step for rank 1 over the whole run; the window's rules
    # are handed nothing (as if a noisy window had explained the straggler away).
    snap = JobBuilder(backward_straggler()).run(60).snapshot()
    stall = Finding("stall", "info", (1,), predicted_speedup=1.1)
    out = review([stall], snap)
    top = out.findings[0]
    assert top.kind == "utilization_imbalance"
    assert top.ranks == (1,)
    assert top.severity == "warning"
    assert top.cause == "stall"
    assert isinstance(top.facts, Facts) and top.facts.run
    assert top.predicted_speedup is not None and top.predicted_speedup > 1.25
    assert top.evidence["collective_wait_share"]["0"] >= 0.25
    assert out.findings[1:] == (stall,)


def test_eight_ranks_waiting_for_one() -> None:
    snap = JobBuilder(with_rank(balanced(8), 5, forward=0.090)).run(60).snapshot()
    out = review([], snap)
    assert [(f.kind, f.ranks) for f in out.findings] == [("utilization_imbalance", (5,))]


def test_a_replaced_info_finding_says_why() -> None:
    snap = JobBuilder(backward_straggler()).run(60).snapshot()
    weak = Finding("utilization_imbalance", "info", (1,), predicted_speedup=1.05)
    out = review([weak], snap)
    # Not its own cause: the run's finding stands on its own speed-up.
    assert [(f.kind, f.cause, f.severity) for f in out.findings] == [
        ("utilization_imbalance", None, "critical")
    ]
    assert out.set_aside[0].finding == weak
    assert out.set_aside[0].reason == ACCOUNT_WAIT


def test_a_balanced_job_stays_balanced() -> None:
    snap = JobBuilder(balanced(2)).run(60).snapshot()
    assert review([], snap).findings == ()
    snap8 = JobBuilder(balanced(8)).run(60).snapshot()
    assert review([], snap8).findings == ()


def test_a_real_warning_needs_no_check() -> None:
    snap = JobBuilder(backward_straggler()).run(60).snapshot()
    out = engine_review(snap)
    assert [f.kind for f in out.findings if f.severity != "info"][:1] == ["compute_straggler"]
    assert all(s.reason != ACCOUNT_WAIT for s in out.set_aside)


def test_an_info_finding_of_no_cause_kind_is_not_the_cause() -> None:
    snap = JobBuilder(backward_straggler()).run(60).snapshot()
    headroom = Finding("memory_headroom", "info", (0, 1))
    (top, rest) = review([headroom], snap).findings
    assert (top.kind, top.ranks, top.cause) == ("utilization_imbalance", (1,), None)
    assert rest == headroom


def test_no_history_no_check() -> None:
    snap = JobBuilder(backward_straggler()).run(60).snapshot()
    snap.history.clear()
    assert review([], snap).findings == ()
