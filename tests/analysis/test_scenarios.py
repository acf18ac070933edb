"""Recorded device scenarios (tests/data/<scenario>/recording.jsonl) through the whole analysis.

Each recording is read as a run would be replayed (read_recording -> SampleStore -> snapshot ->
analyze) and must give exactly the expected finding kinds, naming exactly the expected ranks
and GPUs (index and UUID).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from auditor.analysis import SampleStore, analyze
from auditor.analysis.findings import Finding
from auditor.analysis.snapshot import Snapshot
from auditor.report.model import ReportFinding
from auditor.report.phrasing import phrase
from auditor.telemetry.recorded import read_recording
from tests.helpers.units import GIB, MIB

DATA = Path(__file__).resolve().parents[1] / "data"


def load(name: str, window_s: float | None = None) -> tuple[Snapshot, dict[int, str]]:
    """The scenario's snapshot and its GPUs' UUIDs by NVML index."""
    rec = read_recording(DATA / name / "recording.jsonl")
    assert rec.problems == []
    assert rec.header["meta"]["scenario"] == name
    store = SampleStore(job=rec.job)
    store.add(rec.batch)
    now = store.latest_time()
    assert now is not None
    uuids = {d.index: d.uuid for d in rec.batch.devices}
    return store.snapshot(now=now, window_s=window_s), uuids


def _named(f: Finding) -> tuple[int, ...]:
    return tuple(g["index"] for g in f.evidence.get("gpus", ()))


# (scenario, {(kind, blamed ranks, GPU indices named)})
EXPECTED: list[Any] = [
    pytest.param("balanced_4gpu", set(), id="balanced_4gpu"),
    pytest.param(
        "throttled_gpu",
        {
            ("hardware_straggler", (2,), (2,)),
            ("utilization_imbalance", (2,), (2,)),
        },
        id="throttled_gpu",
    ),
    pytest.param(
        "dataparallel_gather",
        {
            ("dataparallel_gather", (0,), (0,)),
            ("memory_imbalance", (0,), (0,)),
            ("utilization_imbalance", (0,), (0, 1, 2, 3)),
        },
        id="dataparallel_gather",
    ),
    pytest.param("dp_batch_30_over_4", {("batch_split", (0,), (3,))}, id="dp_batch_30_over_4"),
    pytest.param("idle_allocated_gpu", {("idle_device", (), (2,))}, id="idle_allocated_gpu"),
    pytest.param(
        "memory_grows_with_batch",
        # The batch warm-up's last rise (48 -> 64) is told, never blamed (info).
        {("memory_headroom", (0, 1, 2, 3), (0, 1, 2, 3)), ("slowdown", (), ())},
        id="memory_grows_with_batch",
    ),
    pytest.param(
        "input_bound_4gpu", {("data_starvation", (0, 1, 2, 3), ())}, id="input_bound_4gpu"
    ),
]


@pytest.mark.parametrize(("name", "expected"), EXPECTED)
def test_exact_findings(
    name: str, expected: set[tuple[str, tuple[int, ...], tuple[int, ...]]]
) -> None:
    snap, uuids = load(name)
    findings = analyze(snap)
    assert {(f.kind, f.ranks, _named(f)) for f in findings} == expected
    assert len(findings) == len(expected)
    for f in findings:
        for g in f.evidence.get("gpus", ()):
            assert g["uuid"] == uuids[g["index"]], f.to_dict()
            assert g["node"] == "gpu-node-07"
        assert set(phrase(f).fixes) == set(f.ranks), f.to_dict()
        reported = ReportFinding.of(f)
        back = ReportFinding.from_dict(json.loads(json.dumps(reported.to_dict())))
        assert back == reported
        assert reported.evidence == {**f.evidence, **phrase(f).notes}


@pytest.mark.parametrize(("name", "expected"), EXPECTED)
def test_recent_window_agrees(name: str, expected: set) -> None:
    snap, _ = load(name, window_s=5.0)
    assert {(f.kind, f.ranks, _named(f)) for f in analyze(snap)} == expected


def test_balanced_has_no_warning_and_no_finding() -> None:
    snap, _ = load("balanced_4gpu")
    findings = analyze(snap)
    assert [f for f in findings if f.severity_level >= 1] == []
    assert findings == []


def _one(findings: list[Finding], kind: str) -> Finding:
    (f,) = [f for f in findings if f.kind == kind]
    return f


def test_throttled_gpu_details() -> None:
    snap, uuids = load("throttled_gpu")
    findings = analyze(snap)
    f = _one(findings, "hardware_straggler")
    # The facts (the words: tests/report/phrasing/test_hardware_straggler.py).
    assert f.evidence["per_rank"]["2"]["reasons"] == ["throttled", "low_clock"]
    gpu = f.facts.ranks[2]
    assert gpu.slowdowns[0].reasons[0] == "sw_thermal_slowdown"
    assert round(gpu.slowdowns[1].ratio, 2) == 0.68
    assert (gpu.label, gpu.uuid, gpu.thermal) == ("gpu-node-07 GPU 2", uuids[2], True)
    assert [(x.lever, x.rank, x.current, x.gpu) for x in f.fixes[:2]] == [
        ("device", 2, "thermal", uuids[2]),
        ("gpu_assignment", 2, uuids[2], uuids[2]),
    ]
    assert f.gpus == (uuids[2],)
    assert f.predicted_speedup == pytest.approx(1.41, abs=0.05)
    assert _one(findings, "utilization_imbalance").cause == "hardware_straggler"


def test_dataparallel_gather_details() -> None:
    findings = analyze(load("dataparallel_gather")[0])
    f = _one(findings, "dataparallel_gather")
    assert f.evidence["mem_ratio"] == pytest.approx(1.52, abs=0.01)
    assert f.evidence["chunk_sizes"] == [64, 64, 64, 64]
    chunks = f.evidence["balanced_chunk_sizes"]
    assert sum(chunks) == 256
    assert chunks[0] < 64 < min(chunks[1:])
    # DDP with the command (its words: tests/report/phrasing/test_dataparallel_gather.py).
    assert f.facts.command == "torchrun --nproc_per_node=4 train.py"
    assert (f.fixes[0].lever, f.fixes[0].rank, f.fixes[0].proposed) == ("parallel_mode", 0, "ddp")
    assert _one(findings, "memory_imbalance").cause == "dataparallel_gather"
    assert _one(findings, "utilization_imbalance").cause == "dataparallel_gather"


def test_dp_batch_details() -> None:
    snap, uuids = load("dp_batch_30_over_4")
    f = _one(analyze(snap), "batch_split")
    assert f.evidence["chunk_sizes"] == [8, 8, 8, 6]
    assert f.evidence["nearest_batches"] == [32, 28]
    assert f.gpus == (uuids[3],)
    # batch_size 30 -> 32 (8 per GPU) or 28 (7 per GPU), or the chunks kept even.
    assert [(x.lever, x.rank, x.current, x.proposed) for x in f.fixes] == [
        ("batch_size", 0, 30, 32),
        ("batch_size", 0, 30, 28),
        ("scatter_chunks", 0, "8,8,8,6", "8,8,7,7"),
    ]


def test_idle_gpu_details() -> None:
    snap, uuids = load("idle_allocated_gpu")
    f = _one(analyze(snap), "idle_device")
    assert f.evidence["pids"] == [39127]
    assert f.evidence["held_bytes"] == 18 * GIB + 512 * MIB
    # Stop PID 39127 on the GPU no rank owns (the words: the phrasing tests).
    assert [(x.lever, x.rank, x.current, x.gpu) for x in f.fixes] == [
        ("stray_process", None, 39127, uuids[2])
    ]
    assert f.gpus == (uuids[2],)


def test_memory_fit_details() -> None:
    f = _one(analyze(load("memory_grows_with_batch")[0]), "memory_headroom")
    row = f.evidence["per_rank"]["0"]
    assert row["fixed_bytes"] == pytest.approx(5.5 * GIB, rel=0.03)
    assert row["per_sample_bytes"] == pytest.approx(0.42 * GIB, rel=0.03)
    assert row["r2"] > 0.99
    assert row["batch_sizes"] == [16, 32, 48, 64]
    assert row["overhead_bytes"] == pytest.approx(1.2 * GIB, rel=0.1)
    # floor((0.9 * 79.65 - 5.5 - 1.2) / 0.42) = 154.
    assert row["largest_batch"] == pytest.approx(154, abs=2)


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_scenarios", DATA / "make_scenarios.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses resolve the module's annotations through sys.modules.
    sys.modules.setdefault("make_scenarios", module)
    spec.loader.exec_module(module)
    return module


def test_committed_recordings_are_current(tmp_path: Path) -> None:
    gen = _generator()
    assert set(gen.SCENARIOS) == {p.values[0] for p in EXPECTED}
    for name in gen.SCENARIOS:
        fresh = gen.write(name, tmp_path).read_text().splitlines()
        committed = (DATA / name / "recording.jsonl").read_text().splitlines()
        # The header's "created" differs; every record must match.
        assert fresh[1:] == committed[1:], f"{name}: run python tests/data/make_scenarios.py"
        assert (DATA / name / "recording.jsonl").stat().st_size < 300 * 1024
