"""dataparallel_gather: GPU 0 of an nn.DataParallel job holding the gathered outputs."""

from __future__ import annotations

import pytest

from auditor.analysis import analyze
from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import dataparallel_gather
from auditor.analysis.rules.dataparallel_gather import KIND, balanced_chunks, torch_chunks
from tests.helpers.gpus import GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, balanced
from tests.helpers.snapshots import dp_snapshot
from tests.helpers.units import GIB


def _kind(findings: list[Finding], kind: str) -> list[Finding]:
    return [f for f in findings if f.kind == kind]


def test_gpu0_gathering_is_found_with_its_memory_imbalance() -> None:
    findings = analyze(dp_snapshot([48, 32, 32, 32]))
    assert {f.kind for f in findings} == {
        "dataparallel_gather",
        "memory_imbalance",
        "utilization_imbalance",
    }
    for f in findings:
        assert f.ranks == (0,), f.to_dict()
        # The gather names GPU 0; the symptom names the blamed rank's GPUs (all four).
        named = (
            [gpu_uuid("node0", i) for i in range(4)]
            if f.kind == "utilization_imbalance"
            else [gpu_uuid("node0", 0)]
        )
        assert [g["uuid"] for g in f.evidence["gpus"]] == named, f.to_dict()
    (gather,) = _kind(findings, "dataparallel_gather")
    assert gather.severity == "warning"
    assert gather.predicted_speedup is None
    assert gather.evidence["speedup_model"] == "not_predicted"
    assert gather.gpus == (gpu_uuid("node0", 0),)
    assert gather.evidence["mem_ratio"] == pytest.approx(1.5, abs=0.01)
    assert gather.evidence["busy_ratio"] == pytest.approx(0.95 / 0.60, abs=0.05)
    assert gather.evidence["chunk_sizes"] == [8, 8, 8, 8]
    assert gather.evidence["balanced_chunk_sizes"] == [5, 9, 9, 9]
    assert gather.evidence["ddp_command"] == "torchrun --nproc_per_node=4 train.py"
    assert gather.evidence["script"] == "train.py"
    assert gather.evidence["script_note"] == "placeholder"
    assert gather.facts.placeholder
    per_gpu = gather.evidence["per_gpu"]
    assert [per_gpu[gpu_uuid("node0", i)]["index"] for i in range(4)] == [0, 1, 2, 3]
    assert [per_gpu[gpu_uuid("node0", i)]["chunk"] for i in range(4)] == [8, 8, 8, 8]
    assert gather.facts.command == "torchrun --nproc_per_node=4 train.py"
    assert (gather.facts.batch, gather.facts.per_process) == (32, 8)
    assert gather.facts.chunks == (8, 8, 8, 8)
    assert gather.facts.balanced == (5, 9, 9, 9)
    # DDP with the batch per process, or a scatter that gives the primary a smaller chunk.
    assert gather.fixes == (
        Fix("parallel_mode", 0, "dataparallel", "ddp", None, (KIND,)),
        Fix("batch_size", 0, 32, 8, None, (KIND,)),
        Fix("scatter_chunks", 0, "8,8,8,8", "5,9,9,9", None, (KIND,)),
    )

    (mem,) = _kind(findings, "memory_imbalance")
    assert mem.cause == "dataparallel_gather"
    assert mem.gpus == (gpu_uuid("node0", 0),)
    # A smaller chunk for GPU 0 first, else DDP: answering the gather and the memory alike.
    answers = (KIND, "memory_imbalance")
    assert mem.fixes == (
        Fix("scatter_chunks", 0, "8,8,8,8", "5,9,9,9", None, answers),
        Fix("parallel_mode", 0, "dataparallel", "ddp", None, answers),
    )
    assert mem.facts.gather == gather.facts
    assert mem.evidence["ratio_to_peers"] == pytest.approx(1.5, abs=0.01)
    assert mem.evidence["speedup_model"] == "not_predicted"
    # 48 GiB of 79.7 GiB is under the 80% near-full mark.
    assert mem.severity == "info"

    (util,) = _kind(findings, "utilization_imbalance")
    assert util.cause == "dataparallel_gather"
    # The symptom carries its cause's fixes.
    assert [(x.lever, x.rank, x.current, x.proposed) for x in util.fixes] == [
        (x.lever, x.rank, x.current, x.proposed) for x in gather.fixes
    ]
    assert util.evidence["gpu_spread"] == pytest.approx(0.35, abs=0.05)


def test_without_a_balanced_split_the_memory_fix_is_ddp_alone() -> None:
    # 1.05x is too small to shift a chunk: with min_ratio lowered the gather is found, and its
    # memory finding offers DDP alone.
    snap = dp_snapshot([33.6, 32, 32, 32])
    gather, mem = dataparallel_gather.RULE(snap, min_ratio=1.04, min_extra_bytes=GIB)
    assert gather.facts.balanced is None
    assert [x.lever for x in gather.fixes] == ["parallel_mode", "batch_size"]
    assert mem.fixes == (
        Fix("parallel_mode", 0, "dataparallel", "ddp", None, (KIND, "memory_imbalance")),
    )


def test_script_threshold_names_the_command() -> None:
    (f, _) = dataparallel_gather.RULE(dp_snapshot([48, 32, 32, 32]), script="imagenet.py")
    assert f.evidence["ddp_command"] == "torchrun --nproc_per_node=4 imagenet.py"
    assert f.facts.command == "torchrun --nproc_per_node=4 imagenet.py"
    assert f.evidence["script_note"] == "given"
    assert not f.facts.placeholder


@pytest.mark.parametrize(
    ("mem", "util", "kwargs", "expected"),
    [
        pytest.param([48, 32, 32, 32], None, {}, ["dataparallel_gather", "memory_imbalance"]),
        pytest.param([40, 32, 32, 32], None, {}, ["dataparallel_gather", "memory_imbalance"]),
        # 1.2x: under the 1.25 default.
        pytest.param([38.4, 32, 32, 32], None, {}, [], id="ratio-1.2"),
        pytest.param([48, 32, 32, 32], None, {"min_ratio": 1.6}, [], id="threshold-raised"),
        # 1.5x of a tiny model: 0.3 GiB extra is under min_extra_bytes.
        pytest.param([0.9, 0.6, 0.6, 0.6], None, {}, [], id="small-model"),
        # Memory not readable: utilisation decides, no memory finding.
        pytest.param([None] * 4, None, {}, ["dataparallel_gather"], id="busy-only"),
        pytest.param([None] * 4, [0.9, 0.85, 0.85, 0.85], {}, [], id="busy-only-even"),
        pytest.param([48, 32], [0.95, 0.6], {}, ["dataparallel_gather", "memory_imbalance"]),
        pytest.param([32, 32, 32, 32], [0.9] * 4, {}, [], id="balanced"),
        # The heavy GPU is not the primary: not the gather (memory_imbalance judges it).
        pytest.param([32, 32, 48, 32], None, {}, [], id="heavy-gpu-2"),
        pytest.param([48, 32, 32, 32], None, {"min_steps": 25}, [], id="too-few-steps"),
    ],
)
def test_decision_table(
    mem: list[float | None], util: list[float] | None, kwargs: dict, expected: list[str]
) -> None:
    findings = dataparallel_gather.RULE(dp_snapshot(mem, util), **kwargs)
    assert [f.kind for f in findings] == expected
    for f in findings:
        assert f.ranks == (0,)
        assert f.evidence["gpus"][0]["uuid"] == gpu_uuid("node0", 0)
        assert f.gpus == (gpu_uuid("node0", 0),)
        assert {x.rank for x in f.fixes} == {0}


def test_primary_found_from_nvml_processes_alone() -> None:
    findings = dataparallel_gather.RULE(dp_snapshot([48, 32, 32, 32], link="pid"))
    assert [(f.kind, f.ranks, f.evidence["gpus"][0]["index"]) for f in findings] == [
        ("dataparallel_gather", (0,), 0),
        ("memory_imbalance", (0,), 0),
    ]


def test_primary_is_the_first_of_device_ids() -> None:
    # device_ids=[3, 2, 1, 0]: GPU 3 gathers.
    snap = dp_snapshot([32, 32, 32, 48], util=[0.6, 0.6, 0.6, 0.95], order=[3, 2, 1, 0])
    findings = dataparallel_gather.RULE(snap)
    assert [f.gpus for f in findings] == [(gpu_uuid("node0", 3),)] * 2
    assert [(f.kind, f.evidence["gpus"][0]["index"]) for f in findings] == [
        ("dataparallel_gather", 3),
        ("memory_imbalance", 3),
    ]


def test_ddp_jobs_are_not_judged() -> None:
    job = JobBuilder(balanced(4)).run(24)
    attach_gpus(job, [GpuSpec(mem_used=48 * GIB)] + [GpuSpec(mem_used=32 * GIB)] * 3)
    assert dataparallel_gather.RULE(job.snapshot()) == []


@pytest.mark.parametrize(
    ("batch", "n", "expected"),
    [
        (30, 4, [8, 8, 8, 6]),
        (32, 4, [8, 8, 8, 8]),
        (5, 4, [2, 2, 1, 0]),
        (3, 4, [1, 1, 1, 0]),
        (7, 2, [4, 3]),
        (1, 1, [1]),
    ],
)
def test_torch_chunks(batch: int, n: int, expected: list[int]) -> None:
    assert torch_chunks(batch, n) == expected


@pytest.mark.parametrize(
    ("batch", "n", "ratio", "expected"),
    [
        pytest.param(32, 4, 1.5, [5, 9, 9, 9], id="doc-example"),
        # Chunks 8: extra 8 * 2 - 8 = 8 samples; (32 - 24) / 4 = 2.
        pytest.param(32, 4, 2.0, [2, 10, 10, 10], id="twice"),
        # 30 -> 8, 8, 8, 6; extra 8 * 1.5 - 8 = 4; (30 - 12) / 4 = 4.5 -> 4 (even rounding).
        pytest.param(30, 4, 1.5, [4, 9, 9, 8], id="uneven-batch"),
        pytest.param(32, 4, 1.05, None, id="too-small-to-shift"),
        pytest.param(3, 4, 1.5, None, id="batch-below-gpus"),
    ],
)
def test_balanced_chunks(batch: int, n: int, ratio: float, expected: list[int] | None) -> None:
    out = balanced_chunks(batch, n, ratio)
    assert out == expected
    if out is not None:
        assert sum(out) == batch
