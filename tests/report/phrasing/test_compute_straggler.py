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
