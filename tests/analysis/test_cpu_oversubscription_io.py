"""cpu_oversubscription leaves I/O-bound workers alone (issue 11): the workers of a rank that
waits for data and that use well under the CPU they could get wait on storage; they hold memory,
not cores, and lowering them would starve the rank further."""

from __future__ import annotations

import pytest

from auditor.analysis import analyze
from auditor.analysis.fixes import Fix
from auditor.analysis.loading import IO
from auditor.analysis.rules import cpu_oversubscription
from auditor.analysis.workers import MAX_WORKERS
from tests.helpers.jobs import NodeSpec, RankSpec, ddp_snapshot

TWO_CORES = {"node0": NodeSpec(cores=2.0, busy_cores=2.0)}


def _job(worker_cpu: float, data_wait: float) -> list[RankSpec]:
    """A saturated 2-core host: rank 0 with 1 light worker, rank 1 with 16 workers of
    ``worker_cpu`` cores each, waiting ``data_wait`` a step for them."""
    return [
        RankSpec(num_workers=1, main_cpu=0.15, worker_cpu=0.2),
        RankSpec(num_workers=16, main_cpu=0.15, worker_cpu=worker_cpu, data_wait=data_wait),
    ]


@pytest.mark.parametrize(
    ("worker_cpu", "data_wait", "expected"),
    [
        # 16 workers at 0.02 cores while rank 1 waits 60% of its step for them. A CPU-bound
        # worker would get 2 cores / 20.2 competitors (19 job processes and the 1.18 busy cores
        # they do not explain) = 0.099 cores; 0.02 is 20% of it: I/O-bound, not counted.
        pytest.param(0.02, 0.150, (), id="io-bound-starved"),
        # 0.12 cores each, more than the 2 / 19 = 0.105 a CPU-bound worker gets: lowered.
        pytest.param(0.12, 0.150, (1,), id="cpu-bound-starved"),
        # The same 0.02 cores each on a rank that does not wait for data: the workers keep up
        # and sleep on a full queue, so their CPU says nothing about I/O; 16 workers for 1.7
        # free cores are still too many.
        pytest.param(0.02, 0.001, (1,), id="idle-workers-of-a-fed-rank"),
    ],
)
def test_io_bound_workers_of_a_starved_rank_are_not_oversubscribing(
    worker_cpu: float, data_wait: float, expected: tuple[int, ...]
) -> None:
    snap = ddp_snapshot(_job(worker_cpu, data_wait), nodes=TWO_CORES)
    findings = cpu_oversubscription.RULE(snap, min_worker_cpu=0.3)
    assert tuple(r for f in findings for r in f.ranks) == expected
    for f in findings:
        (fix,) = f.fixes
        assert (fix.lever, fix.rank, fix.current) == ("num_workers", 1, 16)
        assert isinstance(fix.proposed, int) and fix.proposed < 16


def test_engine_raises_io_bound_workers_instead_of_lowering_them() -> None:
    snap = ddp_snapshot(_job(0.02, 0.150), nodes=TWO_CORES)
    findings = analyze(snap, {"cpu_oversubscription": {"min_worker_cpu": 0.3}})
    assert "cpu_oversubscription" not in {f.kind for f in findings}
    (starved,) = [f for f in findings if f.kind == "data_starvation"]
    assert starved.ranks == (1,)
    # Load per batch 16 x 254 ms against 100 ms of work wants 51 workers: the named cap, 32.
    assert starved.fixes[0] == Fix(
        "num_workers", 1, 16, 32, starved.predicted_speedup, ("data_starvation",)
    )
    rank = starved.facts.ranks[1]
    assert (rank.workers, rank.limited_by, rank.loading) == (32, MAX_WORKERS, IO)
    assert starved.evidence["per_rank"]["1"]["loading"]["kind"] == "io"
