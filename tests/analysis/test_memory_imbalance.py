"""memory_imbalance: a rank's GPU holding far more memory than its peers', and who to blame."""

from __future__ import annotations

import pytest

from auditor.analysis import analyze
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import dataparallel_gather, memory_imbalance
from auditor.analysis.rules.memory_imbalance import KIND, HeavyDataParallelGpu, HeavyGpu
from auditor.analysis.snapshot import SampleStore, Snapshot
from auditor.samples import Batch, GpuProcess, RankInfo, StepSample
from tests.helpers.gpus import GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, RankSpec, balanced
from tests.helpers.snapshots import dp_snapshot
from tests.helpers.units import GIB


def ddp_mem_snapshot(
    mem_gib: list[float], *, link: str = "uuid", gpu0_procs: dict[int, float] | None = None
) -> Snapshot:
    """A balanced 4-rank DDP job, rank ``i`` on GPU ``i`` holding ``mem_gib[i]``.

    ``gpu0_procs`` lists what each rank's process holds on GPU 0 (stray allocations).
    """
    job = JobBuilder(balanced(len(mem_gib))).run(24)
    gpus = [GpuSpec(mem_used=int(m * GIB)) for m in mem_gib]
    if gpu0_procs is not None:
        procs = tuple(
            GpuProcess(pid=10_000 + r, used_bytes=int(b * GIB)) for r, b in gpu0_procs.items()
        )
        gpus[0] = GpuSpec(mem_used=int(sum(gpu0_procs.values()) * GIB), processes=procs)
    attach_gpus(job, gpus, link=link)
    return job.snapshot()


@pytest.mark.parametrize(
    ("mem", "kwargs", "expected"),
    [
        pytest.param([36, 36, 60, 36], {}, [((2,), 2, "info")], id="rank2-1.67x"),
        pytest.param([36, 36, 70, 36], {}, [((2,), 2, "warning")], id="rank2-near-full"),
        pytest.param([60, 36, 36, 36], {}, [((0,), 0, "info")], id="rank0"),
        pytest.param([36, 50.4, 36, 36], {}, [], id="1.4x-under-threshold"),
        pytest.param([36, 50.4, 36, 36], {"min_ratio": 1.3}, [((1,), 1, "info")], id="1.3"),
        # Twice the memory of a small model, but only 0.5 GiB more.
        pytest.param([1, 0.5, 0.5, 0.5], {}, [], id="small-model"),
        pytest.param([36, 60], {}, [((1,), 1, "info")], id="two-ranks"),
        pytest.param([36, 36, 60, 36], {"min_steps": 25}, [], id="too-few-steps"),
        pytest.param([36, 36, 36, 36], {}, [], id="balanced"),
    ],
)
def test_decision_table(mem: list[float], kwargs: dict, expected: list) -> None:
    for link in ("uuid", "pid"):
        findings = memory_imbalance.RULE(ddp_mem_snapshot(mem, link=link), **kwargs)
        got = [(f.ranks, f.evidence["gpus"][0]["index"], f.severity) for f in findings]
        assert got == expected, link
        for f in findings:
            uuid = gpu_uuid("node0", f.evidence["gpus"][0]["index"])
            assert f.evidence["gpus"][0]["uuid"] == uuid
            assert f.gpus == (uuid,)
            assert f.predicted_speedup is None
            assert f.evidence["speedup_model"] == "not_predicted"
            # One fix per blamed rank, on the heavy GPU.
            assert [(x.lever, x.rank, x.gpu) for x in f.fixes] == [
                ("memory_release", r, uuid) for r in f.ranks
            ]


def test_owner_blamed_with_evidence_and_fix() -> None:
    (f,) = memory_imbalance.RULE(ddp_mem_snapshot([36, 36, 60, 36]))
    assert f.ranks == (2,)
    assert f.evidence["ratio_to_peers"] == pytest.approx(60 / 36, abs=0.01)
    assert f.evidence["excess_bytes"] == pytest.approx(24 * GIB, rel=0.01)
    assert f.evidence["per_gpu"][gpu_uuid("node0", 2)]["ranks"] == [2]
    assert isinstance(f.facts, HeavyGpu)
    assert (f.facts.rank, f.facts.gpu, f.facts.strays) == (2, "node0 GPU 2", {})
    assert f.facts.mem_bytes - f.facts.peer_bytes == pytest.approx(24 * GIB, rel=0.01)
    # The owner frees its 24 GiB over its peers' median.
    (fix,) = f.fixes
    assert (fix.lever, fix.rank, fix.proposed, fix.gpu) == (
        "memory_release",
        2,
        0,
        gpu_uuid("node0", 2),
    )
    assert fix.current == f.evidence["excess_bytes"]
    assert (fix.speedup, fix.answers) == (None, (KIND,))


@pytest.mark.parametrize("link", ["uuid", "pid"])
def test_stray_allocations_blame_the_ranks_that_make_them(link: str) -> None:
    # Every rank loaded a 6 GiB checkpoint onto cuda:0: GPU 0 holds 36 + 3 x 6 = 54 GiB.
    snap = ddp_mem_snapshot([36, 36, 36, 36], link=link, gpu0_procs={0: 36, 1: 6, 2: 6, 3: 6})
    (f,) = memory_imbalance.RULE(snap)
    assert f.ranks == (1, 2, 3)
    assert f.evidence["gpus"][0]["index"] == 0
    assert set(f.evidence["stray_processes"]) == {"1", "2", "3"}
    assert f.facts.rank == 0 and set(f.facts.strays) == {1, 2, 3}
    # Each stray rank stops allocating its 6 GiB on rank 0's GPU.
    gpu0 = gpu_uuid("node0", 0)
    assert f.fixes == tuple(
        Fix("stray_process", r, 6 * GIB, 0, None, (KIND,), gpu0) for r in (1, 2, 3)
    )


def test_small_stray_contexts_leave_the_owner_blamed() -> None:
    # 0.5 GiB contexts of the other ranks are not what makes GPU 0 hold 24 GiB more.
    snap = ddp_mem_snapshot([36, 36, 36, 36], gpu0_procs={0: 58.5, 1: 0.5, 2: 0.5, 3: 0.5})
    (f,) = memory_imbalance.RULE(snap)
    assert f.ranks == (0,)
    assert [(x.lever, x.rank) for x in f.fixes] == [("memory_release", 0)]


def test_dataparallel_gpu_other_than_the_primary() -> None:
    (f,) = memory_imbalance.RULE(dp_snapshot([32, 32, 48, 32]))
    assert f.ranks == (0,)
    assert f.evidence["gpus"][0]["index"] == 2
    assert isinstance(f.facts, HeavyDataParallelGpu)
    assert (f.facts.rank, f.facts.index) == (0, 2)
    (fix,) = f.fixes
    assert (fix.lever, fix.rank, fix.current, fix.proposed, fix.gpu) == (
        "memory_release",
        0,
        16 * GIB,
        0,
        gpu_uuid("node0", 2),
    )


def test_gpus_named_by_the_gather_are_not_repeated() -> None:
    snap = dp_snapshot([56, 32, 32, 32])
    prior = dataparallel_gather.RULE(snap)
    assert [f.kind for f in prior] == ["dataparallel_gather", "memory_imbalance"]
    assert memory_imbalance.RULE(snap, explained=prior) == []
    # Without the gather's finding, this rule names GPU 0 itself (1.75x >= 1.5x).
    (alone,) = memory_imbalance.RULE(snap)
    assert alone.evidence["gpus"][0]["index"] == 0
    assert alone.gpus == prior[1].gpus == (gpu_uuid("node0", 0),)
    # Only a memory_imbalance finding on the same GPU explains it away.
    assert memory_imbalance.RULE(snap, explained=prior[:1]) == [alone]
    # Through the engine: exactly one memory_imbalance, from the gather.
    mems = [f for f in analyze(snap) if f.kind == "memory_imbalance"]
    assert [f.cause for f in mems] == ["dataparallel_gather"]


def _probe_only(peaks_gib: list[float], steps: int = 12) -> Snapshot:
    store = SampleStore()
    store.add(
        Batch(
            infos=tuple(
                RankInfo(rank=r, world_size=len(peaks_gib), parallel_mode="ddp")
                for r in range(len(peaks_gib))
            )
        )
    )
    for i in range(steps):
        store.add(
            Batch(
                steps=tuple(
                    StepSample(
                        rank=r,
                        step=i,
                        time=100.0 + i * 0.1,
                        step_s=0.1,
                        forward_s=0.05,
                        backward_s=0.05,
                        batch_size=32,
                        mem_peak_bytes=int(p * GIB),
                    )
                    for r, p in enumerate(peaks_gib)
                )
            )
        )
    return store.snapshot(now=200.0, window_s=None)


def test_without_nvml_the_probe_peaks_are_compared() -> None:
    (f,) = memory_imbalance.RULE(_probe_only([20, 20, 34, 20]))
    assert f.ranks == (2,)
    assert f.evidence["gpus"] == []
    assert f.gpus == ()
    assert f.evidence["source"] == "probe_peak"
    assert f.evidence["ratio_to_peers"] == pytest.approx(1.7)
    assert f.fixes == (Fix("memory_release", 2, 14 * GIB, 0, None, (KIND,)),)
    assert memory_imbalance.RULE(_probe_only([20, 20, 24, 20])) == []


def test_lone_rank_or_empty_snapshot() -> None:
    assert memory_imbalance.RULE(ddp_mem_snapshot([60])) == []
    assert memory_imbalance.RULE(JobBuilder([RankSpec()]).snapshot()) == []
