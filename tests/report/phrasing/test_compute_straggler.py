"""compute_straggler in words: the slow phase against the peers', where the others wait, and the
batch alternative for a slower device."""

from __future__ import annotations

from auditor.analysis.rules import compute_straggler
from auditor.report.phrasing import phrase
from tests.helpers.jobs import accumulating, ddp_snapshot, forward_straggler
from tests.helpers.snapshots import collective_ops


def test_the_fix_names_the_phase_and_the_batch_that_fits() -> None:
    (f,) = compute_straggler.RULE(ddp_snapshot(forward_straggler()))
    words = phrase(f)
    assert set(words.fixes) == {2}
    assert words.fixes[2].startswith("forward takes ")
    assert "remove the rank-specific work in forward" in words.fixes[2]
    assert "batch_size 32 -> 23" in words.fixes[2]
    assert words.summary.endswith("the others wait for it at the all-reduce")


def test_the_summary_names_the_collectives_the_others_wait_in() -> None:
    snap = ddp_snapshot(forward_straggler())
    for r in (0, 1, 3):
        snap = collective_ops(snap, r, {"ddp_allreduce": 30, "all_gather_object": 10})
    snap = collective_ops(snap, 2, {"ddp_allreduce": 1})
    (f,) = compute_straggler.RULE(snap)
    assert phrase(f).summary.endswith("the others wait for it in ddp_allreduce/all_gather_object")


def test_under_accumulation_the_batch_is_per_micro_batch() -> None:
    (f,) = compute_straggler.RULE(ddp_snapshot(accumulating(forward_straggler())))
    fix = phrase(f).fixes[2]
    assert "batch_size 8 -> 6 (per micro-batch; 4 accumulated per step)" in fix
    assert "32" not in fix


def test_work_in_no_phase_is_named_as_the_loops_own_code() -> None:
    from tests.analysis.test_compute_straggler import other_work_snapshot

    (f,) = compute_straggler.RULE(other_work_snapshot(2))
    words = phrase(f)
    assert words.summary.startswith(
        "rank 1 computes slower than peers (its own code outside forward/backward/optimizer 8 ms"
    )
    fix = words.fixes[1]
    assert fix.startswith(
        "the loop's own code outside forward/backward/optimizer takes 8 ms a step vs 0 ms"
    )
    assert "a metric, a debug check, a host-side transform" in fix
    assert "batch_size" not in fix  # a smaller batch does not shrink it


def test_a_rank_short_of_cores_is_told_to_get_cores_not_to_cut_work() -> None:
    from tests.analysis.test_compute_straggler import _on_cpus

    (f,) = compute_straggler.RULE(_on_cpus(0.55, 0.25))
    words = phrase(f)
    assert "waiting for a core" in words.summary
    fix = words.fixes[2]
    assert fix.startswith("its process waited for a core ")
    assert "its host's CPU is short, not its work" in fix and "batch_size" not in fix
