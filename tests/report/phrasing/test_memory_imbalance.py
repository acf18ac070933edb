"""memory_imbalance in words: the heavy GPU against its peers, the ranks allocating on another
rank's GPU, a DataParallel GPU's stray tensors, a rank's extra measured parts; the evidence's
codes in words."""

from __future__ import annotations

import pytest

from auditor.analysis.rules import memory_imbalance
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.analysis.test_budget import adam, snap, view
from tests.analysis.test_memory_imbalance import _probe_only, ddp_mem_snapshot
from tests.helpers.snapshots import dp_snapshot
from tests.helpers.units import MIB


@pytest.mark.parametrize(
    "mem", [[36, 36, 60, 36], [36, 36, 70, 36], [60, 36, 36, 36], [36, 60]], ids=str
)
def test_one_fix_per_blamed_rank(mem: list[float]) -> None:
    for link in ("uuid", "pid"):
        (f,) = memory_imbalance.RULE(ddp_mem_snapshot(mem, link=link))
        assert set(phrase(f).fixes) == set(f.ranks)


def test_the_owner_is_told_what_it_holds_more() -> None:
    (f,) = memory_imbalance.RULE(ddp_mem_snapshot([36, 36, 60, 36]))
    assert phrase(f).fixes[2].startswith("rank 2 holds 24.0 GiB more than its peers on node0 GPU 2")
    assert (
        phrase(f).summary
        == "rank 2 holds 1.7x its peers' GPU memory on node0 GPU 2 (60.0 GiB vs 36.0 GiB)"
    )


def test_stray_ranks_are_told_to_set_their_device() -> None:
    snap_ = ddp_mem_snapshot([36, 36, 36, 36], gpu0_procs={0: 36, 1: 6, 2: 6, 3: 6})
    (f,) = memory_imbalance.RULE(snap_)
    for r in (1, 2, 3):
        fix = phrase(f).fixes[r]
        assert fix.startswith(f"rank {r} holds 6.0 GiB on node0 GPU 0, which is rank 0's")
        assert "torch.cuda.set_device(local_rank)" in fix
        assert "map_location" in fix


def test_a_dataparallel_gpu_names_its_device() -> None:
    (f,) = memory_imbalance.RULE(dp_snapshot([32, 32, 48, 32]))
    assert "cuda:2" in phrase(f).fixes[0]


def test_an_extra_copy_of_the_model_is_named() -> None:
    (f,) = memory_imbalance.RULE(
        snap(view(0, adam()), view(1, adam(rank=1, other_module_bytes=100 * MIB)))
    )
    assert "EMA" in phrase(f).fixes[1]
    evidence = ReportFinding.of(f).evidence
    assert evidence["source"] == "measured budget (probe)"
    assert list(evidence) == list(f.evidence)


def test_the_evidence_codes_are_worded_in_the_report() -> None:
    (f,) = memory_imbalance.RULE(ddp_mem_snapshot([36, 36, 60, 36]))
    evidence = ReportFinding.of(f).evidence
    assert evidence["speedup_model"] == (
        "not predicted: memory does not set the step time; it caps the batch every rank can use"
    )
    assert list(evidence) == list(f.evidence)
    (peak,) = memory_imbalance.RULE(_probe_only([20, 20, 34, 20]))
    assert ReportFinding.of(peak).evidence["source"] == (
        "probe: torch.cuda.max_memory_allocated per step"
    )
    assert phrase(peak).fixes[2].startswith("rank 2 allocates 14.0 GiB more than its peers")
