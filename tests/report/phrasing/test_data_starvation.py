"""data_starvation in words: the worst wait and who waits for it, the loader change per starved
rank (more workers and why not more, or cheaper loading where none fit, with the speed-up to
expect), and the evidence's codes put back in words where the JSON report has always carried
them (the loading's verdict, what capped the workers, what the speed-up assumes, what was not
measured)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.loading import loading_cost
from auditor.analysis.rules import data_starvation
from auditor.analysis.snapshot import Snapshot
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.report.phrasing.data_starvation import loading_why
from tests.helpers.jobs import (
    CPU_RANK,
    TWO_CORES_BUSY,
    TWO_CORES_ONE_IDLE,
    NodeSpec,
    balanced,
    ddp_snapshot,
    starved_rank3,
    with_rank,
)
from tests.helpers.snapshots import collective_ops, data_cpu, host_available, process_memory
from tests.helpers.units import GIB

RULE = data_starvation.RULE


def _starved_cpu_job(*, cpu_share: float | None, nodes: dict | None = None) -> Snapshot:
    """Two ranks on one host; rank 1 waits 160 ms a step for its main process to load, using
    ``cpu_share`` of that wait in CPU (None: not measured)."""
    specs = [CPU_RANK, replace(CPU_RANK, data_wait=0.160, main_cpu=0.6)]
    snap = ddp_snapshot(specs, nodes=nodes or TWO_CORES_BUSY)
    return snap if cpu_share is None else data_cpu(snap, 1, cpu_share)


def _only(findings: list[Finding]) -> Finding:
    (f,) = [f for f in findings if f.kind == "data_starvation"]
    return f


def test_summary_and_the_fix_that_keeps_up() -> None:
    f = _only(RULE(ddp_snapshot(starved_rank3())))
    words = phrase(f)
    assert set(words.fixes) == {3}
    assert re.fullmatch(
        r"rank 3 waits for data: 15\d ms of a 26\d ms step \(60%\); its peers wait 1\d\d ms a step "
        r"for it at the collectives",
        words.summary,
    ), words.summary
    # 2 -> 7 workers, nothing capped it; the speed-up to expect.
    assert words.fixes[3] == f"num_workers 2 -> 7; expect about {f.predicted_speedup:.1f}x"


def test_capped_by_the_free_cores() -> None:
    snap = ddp_snapshot(
        starved_rank3(worker_cpu=None), nodes={"node0": NodeSpec(cores=32, busy_cores=31)}
    )
    assert (
        phrase(_only(RULE(snap)))
        .fixes[3]
        .startswith("num_workers 2 -> 3 (as many as the free cores allow)")
    )


def test_no_free_cpu_on_a_saturated_host() -> None:
    snap = ddp_snapshot(starved_rank3(), nodes={"node0": NodeSpec(cores=16, busy_cores=16)})
    fix = phrase(_only(RULE(snap))).fixes[3]
    assert fix.startswith("no free CPU on this host for more DataLoader workers")
    assert "num_workers" not in fix


def test_loader_settings_follow_the_workers() -> None:
    snap = ddp_snapshot(starved_rank3(pin_memory=False, persistent_workers=False))
    fix = phrase(_only(RULE(snap))).fixes[3]
    assert fix.startswith("num_workers 2 -> 7, pin_memory=True, persistent_workers=True; expect")


@pytest.mark.parametrize(
    ("nodes", "edit", "thresholds", "says"),
    [
        pytest.param(
            TWO_CORES_BUSY,
            None,
            {},
            "num_workers 0 -> 3 (loading waits on I/O: the workers need memory, not free cores)",
            id="io",
        ),
        pytest.param(
            TWO_CORES_BUSY,
            lambda s: host_available(process_memory(s, 1, rss=GIB), 1, 4 * GIB),
            {},
            "num_workers 0 -> 2 (as many as the host's available memory allows)",
            id="memory-bound",
        ),
        pytest.param(
            TWO_CORES_BUSY,
            None,
            {"max_workers": 2},
            "num_workers 0 -> 2 (capped at 2; for more, make reads faster)",
            id="cap",
        ),
    ],
)
def test_io_bound_workers_in_words(nodes: dict, edit: object, thresholds: dict, says: str) -> None:
    snap = _starved_cpu_job(cpu_share=0.03, nodes=nodes)
    if callable(edit):
        snap = edit(snap)
    fix = phrase(_only(RULE(snap, **thresholds))).fixes[1]
    assert fix.startswith(says + ", persistent_workers=True"), fix
    assert "no free CPU" not in fix and "free cores allow" not in fix


def test_io_bound_expectation() -> None:
    # A saturated host: the range reaches down to what its cores allow.
    f = _only(RULE(_starved_cpu_job(cpu_share=0.03)))
    assert phrase(f).fixes[1].endswith("expect 2.6x (2.1-2.6x)")


def test_cheaper_loading_in_words() -> None:
    f = _only(RULE(_starved_cpu_job(cpu_share=0.90)))
    fix = phrase(f).fixes[1]
    assert fix.startswith(
        "no free CPU on this host for more DataLoader workers and loading is CPU-bound "
        "(0.90 cores while it loads): make loading cheaper"
    ), fix
    assert fix.endswith(f"at half the loading time expect about {f.predicted_speedup:.1f}x")
    f = _only(RULE(_starved_cpu_job(cpu_share=0.90), cheaper_factor=4.0))
    assert "at 1/4 of the loading time" in phrase(f).fixes[1]


def test_no_memory_for_io_bound_workers_gets_faster_reads() -> None:
    snap = host_available(process_memory(_starved_cpu_job(cpu_share=0.03), 1, rss=GIB), 1, GIB)
    assert (
        phrase(_only(RULE(snap)))
        .fixes[1]
        .startswith(
            "no memory on this host for more DataLoader workers: make reads faster (overlap them "
            "inside the dataset with threads or async I/O"
        )
    )


def test_cheaper_loading_on_a_flagged_host_even_with_an_idle_core() -> None:
    snap = _starved_cpu_job(cpu_share=0.90, nodes=TWO_CORES_ONE_IDLE)
    prior = Finding(kind="cpu_oversubscription", severity="warning", ranks=(1,))
    assert (
        phrase(_only(RULE(snap, explained=[prior]))).fixes[1].startswith("no free CPU on this host")
    )
    assert (
        phrase(_only(RULE(snap)))
        .fixes[1]
        .startswith("num_workers 0 -> 1 (as many as the free cores allow)")
    )


def test_peers_wait_by_operation_in_the_summary() -> None:
    snap = _starved_cpu_job(cpu_share=0.03, nodes={"node0": NodeSpec(cores=16)})
    snap = collective_ops(snap, 0, {"all_gather": 160, "ddp_allreduce": 4})
    assert re.search(
        r"; rank 0 waits 16\d ms a step for it in all_gather/ddp_allreduce$",
        phrase(_only(RULE(snap))).summary,
    )


def test_evidence_words_of_a_rank_row() -> None:
    snap = host_available(process_memory(_starved_cpu_job(cpu_share=0.03), 1, rss=GIB), 1, 4 * GIB)
    f = _only(RULE(snap))
    row = ReportFinding.of(f).evidence["per_rank"]["1"]
    assert row["loading"]["why"].startswith("I/O-bound: the main process used 0.03 cores while")
    assert list(row["loading"])[-1] == "why"
    assert row["memory"]["per_worker_basis"] == (
        "the main process's RSS (at most what a forked worker holds)"
    )
    assert row["limited_by"] == "memory"
    assert row["speedup_basis"] == "workers keep up"
    # Every key in the order the rule wrote it: the report only words the codes.
    assert list(row) == list(f.evidence["per_rank"]["1"])
    cheaper = ReportFinding.of(_only(RULE(_starved_cpu_job(cpu_share=0.90))))
    assert cheaper.evidence["per_rank"]["1"]["speedup_basis"] == (
        "loading 2x cheaper (an assumption: the fix sets how much)"
    )


def test_the_assumed_core_in_words() -> None:
    snap = replace(ddp_snapshot(starved_rank3(worker_cpu=0.5)), nodes=())
    row = ReportFinding.of(_only(RULE(snap))).evidence["per_rank"]["3"]
    assert row["limited_by"] == "cores (host not sampled: 1 assumed)"


def test_unmeasured_loading_cpu_in_words() -> None:
    f = _only(RULE(_starved_cpu_job(cpu_share=None)))
    assert phrase(f).fixes[1].startswith("no free CPU on this host for more DataLoader workers: ")
    evidence = ReportFinding.of(f).evidence
    assert evidence["not_measured"] == [
        "loading CPU of rank 1 (the main thread's CPU during the data wait): no workers added"
    ]
    assert evidence["per_rank"]["1"]["loading"]["why"] == (
        "not known whether loading waits on I/O or the CPU: the main thread's CPU during the "
        "data wait"
    )


def test_unmeasured_host_memory_in_words() -> None:
    f = _only(RULE(ddp_snapshot(starved_rank3())))
    # The job's ranks measured no memory budget: the workers were not bounded by memory.
    assert f.evidence["not_measured"] == [data_starvation.HOST_MEMORY]
    assert ReportFinding.of(f).evidence["not_measured"] == [
        "available memory on node0 of rank 3: workers not bounded by memory"
    ]


def test_unmeasured_collective_wait_in_words() -> None:
    rank = replace(CPU_RANK, measure_wait=False)
    snap = ddp_snapshot(
        [rank, replace(rank, data_wait=0.170)],
        parallel_mode="fsdp",
        nodes={"node0": NodeSpec(cores=16)},
    )
    findings = analyze(snap)
    f = _only(findings)
    evidence = ReportFinding.of(f).evidence
    first = evidence["not_measured"][0]
    assert first.startswith("collective wait on rank 0: its waiting for rank 1 counts as work")
    assert "no speed-up is predicted" in first
    assert f"(at most {f.facts.at_most:.1f}x with the data wait removed)" in first
    assert evidence["speedup_model"] == f"not predicted; at most {f.facts.at_most:.2f}x"
    # The symptom the starved rank causes says the same of the waits it reads.
    (imbalance,) = [x for x in findings if x.kind == "utilization_imbalance"]
    assert ReportFinding.of(imbalance).evidence["not_measured"] == [
        "collective wait on ranks 0, 1: their waiting may read as busy time"
    ]


@pytest.mark.parametrize(
    ("snap", "rank", "starts"),
    [
        pytest.param(
            data_cpu(ddp_snapshot([CPU_RANK, replace(CPU_RANK, data_wait=0.160)]), 1, 0.03),
            1,
            "I/O-bound: the main process used 0.03 cores while loading (5 ms CPU per 16",
            id="io",
        ),
        pytest.param(
            data_cpu(ddp_snapshot([CPU_RANK, replace(CPU_RANK, data_wait=0.160)]), 1, 0.9),
            1,
            "CPU-bound: the main process used 0.90 cores while loading",
            id="cpu",
        ),
        pytest.param(
            ddp_snapshot(with_rank(balanced(8), 3, data_wait=0.156, worker_cpu=None)),
            3,
            "not known whether loading waits on I/O or the CPU: the DataLoader workers' CPU",
            id="workers-unmeasured",
        ),
    ],
)
def test_loading_verdict_in_words(snap: Snapshot, rank: int, starts: str) -> None:
    words = loading_why(loading_cost(snap, snap.stats[rank]))
    assert words.startswith(starts), words
    if words.startswith("I/O-bound"):
        assert words.endswith(
            "of the 1.00 core a CPU-bound loader gets on this host; more workers cost memory, "
            "not cores"
        )


def test_workers_short_of_cores_are_told_to_free_cores_not_to_add_workers() -> None:
    snap = ddp_snapshot(with_rank(balanced(8), 3, data_wait=0.156, worker_cpu=0.09))
    starved = replace(snap.stats[3], worker_wait=2 * 0.1)
    words = loading_why(loading_cost(snap, starved))
    assert words.startswith("CPU-bound, short of cores: each of 2 workers used 0.09 cores"), words
    assert "ms a batch for a core" in words and "free cores on this host" in words
