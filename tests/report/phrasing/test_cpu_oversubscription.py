"""cpu_oversubscription in words: the host's load and its workers against the free cores, the
worker count each blamed rank drops to, and why no speed-up is predicted."""

from __future__ import annotations

from auditor.analysis import analyze
from auditor.analysis.rules import cpu_oversubscription
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from tests.helpers.jobs import NodeSpec, RankSpec, balanced, ddp_snapshot, oversubscribed_2core

TWO_CORES = {"node0": NodeSpec(cores=2.0, busy_cores=2.0)}


def test_summary_and_the_lowered_workers() -> None:
    specs, nodes = oversubscribed_2core()
    (f,) = cpu_oversubscription.RULE(ddp_snapshot(specs, nodes=nodes))
    words = phrase(f)
    assert words.summary == (
        "node0 is 100% busy and runs 8 DataLoader workers for 1.7 free cores: rank 1 starts "
        "more than the data needs"
    )
    assert dict(words.fixes) == {
        1: "num_workers 8 -> 1 (its workers use 3.20 cores together; 1.7 of 2 cores are free "
        "on node0)"
    }


def test_both_ranks_lowered() -> None:
    snap = ddp_snapshot(balanced(2, num_workers=4, main_cpu=0.15, worker_cpu=0.4), nodes=TWO_CORES)
    (f,) = cpu_oversubscription.RULE(snap)
    words = phrase(f)
    assert words.summary.endswith("ranks 0, 1 start more than the data needs")
    assert {r: fix.split(" (")[0] for r, fix in words.fixes.items()} == {
        0: "num_workers 4 -> 1",
        1: "num_workers 4 -> 1",
    }


def test_no_speedup_predicted_in_words() -> None:
    specs, nodes = oversubscribed_2core()
    (f,) = cpu_oversubscription.RULE(ddp_snapshot(specs, nodes=nodes))
    evidence = ReportFinding.of(f).evidence
    assert evidence["speedup_model"] == (
        "not predicted: the same decoding work runs on fewer processes"
    )
    assert list(evidence) == list(f.evidence)  # in place: the JSON's order


def test_io_bound_workers_are_raised_to_the_named_cap_instead() -> None:
    # The workers of a starved rank that wait on I/O are left to data_starvation, which raises
    # them: load per batch 16 x 254 ms against 100 ms of work wants 51 workers, capped at 32.
    specs = [
        RankSpec(num_workers=1, main_cpu=0.15, worker_cpu=0.2),
        RankSpec(num_workers=16, main_cpu=0.15, worker_cpu=0.02, data_wait=0.150),
    ]
    findings = analyze(
        ddp_snapshot(specs, nodes=TWO_CORES), {"cpu_oversubscription": {"min_worker_cpu": 0.3}}
    )
    (starved,) = [f for f in findings if f.kind == "data_starvation"]
    fix = phrase(starved).fixes[1]
    assert fix.startswith("num_workers 16 -> 32 (capped at 32; for more, make reads"), fix
    assert "no free CPU" not in fix
