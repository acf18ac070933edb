"""slow_collective: every rank spends a large share of its step in a collective after the last
rank arrived -> the transfer itself is named, with its bytes and bandwidth, and no rank is
blamed; a rank the others wait for, a fast collective, or an unmeasured wait give nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.rules import slow_collective
from auditor.analysis.rules.slow_collective import Facts, bus_factor
from auditor.analysis.snapshot import Snapshot
from auditor.samples import StepSample
from tests.helpers.jobs import RankSpec, balanced, ddp_snapshot, forward_straggler
from tests.helpers.snapshots import collective_ops, steps_of
from tests.helpers.units import MIB

GATHERED = 64 * MIB


def _named(snap: Snapshot, op: str, nbytes: int | None) -> Snapshot:
    """Every rank's collective wait booked to ``op``, carrying ``nbytes`` a step."""
    for r in range(len(snap.ranks)):
        snap = collective_ops(snap, r, {op: 1.0})
        if nbytes is not None:
            snap = steps_of(snap, r, lambda s: replace(s, collective_bytes={op: nbytes}))
    return snap


def _facts(snap: Snapshot) -> tuple[list, Facts | None]:
    found = slow_collective.RULE(snap)
    return found, (found[0].facts if found else None)


def test_a_slow_all_gather_on_every_rank_is_named_with_its_bandwidth() -> None:
    # 60 ms of transfer after the barrier, on a 101 ms local step: 37% of the step.
    snap = _named(ddp_snapshot(balanced(2), steps=24, comm=0.060), "all_gather", GATHERED)
    found, facts = _facts(snap)
    assert len(found) == 1 and isinstance(facts, Facts)
    f = found[0]
    assert f.ranks == () and f.severity == "warning" and f.predicted_speedup is None
    (op,) = facts.ops
    assert op.op == "all_gather" and op.nbytes == GATHERED
    assert op.transfer_s == pytest.approx(0.060, rel=0.05)
    assert op.algbw == pytest.approx(GATHERED / 0.060, rel=0.05)
    assert op.busbw == pytest.approx(op.algbw / 2)  # (n - 1) / n of two ranks
    assert facts.share == pytest.approx(0.060 / (0.101 + 0.060), rel=0.08)
    assert facts.same_host and facts.ranks == 2
    # The slower rank waits for nobody; the other's wait for it is its own, apart.
    assert min(op.wait_s.values()) == 0.0
    assert [x.lever for x in f.fixes] == [
        "collective_network",
        "collective_overlap",
        "fewer_collectives",
    ]
    assert all(x.rank is None for x in f.fixes)
    assert f.evidence["ops"][0]["busbw_gbps"] == pytest.approx(op.busbw / 1e9, rel=1e-3)


def test_the_gradient_all_reduce_of_four_ranks_uses_the_all_reduce_bus_factor() -> None:
    snap = _named(ddp_snapshot(balanced(4), steps=24, comm=0.080), "ddp_allreduce", GATHERED)
    _, facts = _facts(snap)
    assert facts is not None
    (op,) = facts.ops
    assert op.busbw == pytest.approx(op.algbw * 1.5)  # 2 (n - 1) / n
    assert op.busbw == pytest.approx(GATHERED / 0.080 * 1.5, rel=0.05)
    assert bus_factor("broadcast", 4) == 1.0 and bus_factor("barrier", 4) is None


def test_a_rank_the_others_wait_for_is_no_slow_collective() -> None:
    # Rank 1's forward is slow: rank 0 waits ~60 ms in the all-reduce, rank 1 a few ms.
    snap = _named(ddp_snapshot(forward_straggler(), steps=24), "all_reduce", 4 * MIB)
    assert _facts(snap) == ([], None)


def test_a_fast_collective_or_one_not_measured_gives_nothing() -> None:
    assert slow_collective.RULE(_named(ddp_snapshot(balanced(2)), "all_reduce", MIB)) == []
    unmeasured = ddp_snapshot([RankSpec(measure_wait=False)] * 2, comm=0.06)
    assert slow_collective.measure(unmeasured, slow_collective.Thresholds()) is None


def test_unknown_bytes_still_name_the_transfer_without_a_bandwidth() -> None:
    snap = _named(ddp_snapshot(balanced(2), steps=24, comm=0.060), "all_gather_object", None)
    found, facts = _facts(snap)
    assert facts is not None and facts.ops[0].algbw is None and facts.ops[0].busbw is None
    # Objects: less of them first; the network is not their lever.
    assert [x.lever for x in found[0].fixes] == ["fewer_collectives", "collective_overlap"]


def test_serve_per_scrape_means_are_not_judged() -> None:
    snap = _named(ddp_snapshot(balanced(2), steps=24, comm=0.060), "all_gather", GATHERED)
    snap = steps_of(snap, 0, lambda s: replace(s, count=5))
    assert slow_collective.measure(snap, slow_collective.Thresholds()) is None


def test_in_the_whole_analysis_no_rank_is_blamed() -> None:
    snap = _named(ddp_snapshot(balanced(2), steps=40, comm=0.060), "all_gather", GATHERED)
    findings = analyze(snap)
    assert [f.kind for f in findings if f.severity != "info"] == ["slow_collective"]


def test_a_collective_that_began_mid_window_is_judged_on_the_steps_since() -> None:
    # 30 steps without the gather, then 20 with 60 ms of transfer: the window's median step has
    # no gather, but the job pays it in every step now.
    from tests.helpers.jobs import JobBuilder

    job = JobBuilder(balanced(2), comm=0.004).run(30)
    job.comm = 0.064
    snap = job.run(20).snapshot()
    for r in (0, 1):

        def split(s: StepSample) -> StepSample:
            if s.step < 30:
                return replace(s, collective_ops={"ddp_allreduce": s.collective_wait_s or 0.0})
            wait = s.collective_wait_s or 0.0
            ops = {"ddp_allreduce": 0.004, "all_gather": wait - 0.004}
            return replace(s, collective_ops=ops, collective_bytes={"all_gather": GATHERED})

        snap = steps_of(snap, r, split)
    _, facts = _facts(snap)
    assert facts is not None
    op = facts.ops[0]
    assert (op.op, op.since_step) == ("all_gather", 30)
    assert op.transfer_s == pytest.approx(0.060, rel=0.05)
    assert op.share == pytest.approx(0.060 / (0.101 + 0.064), rel=0.08)


def test_a_gather_every_tenth_step_counts_by_its_time_over_the_window() -> None:
    # 0.3 s of transfer every 10th step of 101 ms: 0.03 s a step, ~23% of the time: named
    # below a quarter as nothing, and its figures are the window's mean.
    snap = ddp_snapshot(balanced(2), steps=40, comm=0.0)

    def every_tenth(s: StepSample) -> StepSample:
        if s.step % 10:
            return replace(s, collective_ops={"all_reduce": s.collective_wait_s or 0.0})
        return replace(
            s,
            step_s=s.step_s + 0.3,
            collective_wait_s=(s.collective_wait_s or 0.0) + 0.3,
            collective_ops={"all_reduce": s.collective_wait_s or 0.0, "all_gather": 0.3},
        )

    for r in (0, 1):
        snap = steps_of(snap, r, every_tenth)
    ops = slow_collective.transfers(
        slow_collective.measure(snap, slow_collective.Thresholds()),  # type: ignore[arg-type]
        8,
    )
    gather = next(o for o in ops if o.op == "all_gather")
    assert gather.since_step is None
    assert gather.transfer_s == pytest.approx(0.03, rel=0.01)
    assert gather.share == pytest.approx(1.2 / (40 * 0.101 + 1.2), rel=0.05)
    assert slow_collective.RULE(snap) == []


def test_gloo_on_one_hosts_cpus_gets_no_network_lever() -> None:
    cpu = [RankSpec(device="cpu")] * 2
    snap = _named(ddp_snapshot(cpu, steps=24, comm=0.060), "ddp_allreduce", GATHERED)
    found, facts = _facts(snap)
    assert facts is not None and facts.same_host and not facts.on_gpu
    assert [x.lever for x in found[0].fixes] == ["bucket_cap_mb", "comm_hook"]
