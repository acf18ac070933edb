"""batch_split for nn.DataParallel: a batch that does not divide by the GPU count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auditor.analysis import analyze
from auditor.analysis.fixes import Fix
from auditor.analysis.rules import batch_split
from auditor.analysis.rules.batch_split import KIND, SAMPLES_PER_SECOND, ShortGpu
from auditor.analysis.snapshot import Snapshot
from auditor.samples import Batch
from tests.helpers.gpus import GpuSpec, attach_gpus, gpu_uuid
from tests.helpers.jobs import JobBuilder, RankSpec


def dp_batch(batch: int, n: int = 4, *, gpus: bool = True, steps: int = 24) -> Snapshot:
    """One DataParallel process over ``n`` GPUs; 100 ms of compute for a batch of 32."""
    spec = RankSpec(batch_size=batch).scaled(batch / 32)
    job = JobBuilder([spec], parallel_mode="dataparallel").run(steps)
    if gpus:
        attach_gpus(job, [GpuSpec()] * n, owners=[[0]] * n)
    else:  # only the rank's own word: devices (0..n-1), no NVML
        info = job.store.infos[0]
        job.store.add(Batch(infos=(replace(info, devices=tuple(range(n))),)))
    return job.snapshot()


RULE = batch_split.RULE


def test_30_over_4_names_the_short_gpu_and_the_nearest_batches() -> None:
    (f,) = RULE(dp_batch(30))
    assert f.kind == "batch_split"
    assert f.ranks == (0,)
    assert f.evidence["chunk_sizes"] == [8, 8, 8, 6]
    assert f.evidence["gpu_count"] == 4
    assert [(g["index"], g["uuid"]) for g in f.evidence["gpus"]] == [(3, gpu_uuid("node0", 3))]
    assert f.gpus == (gpu_uuid("node0", 3),)
    assert [v["chunk"] for v in f.evidence["per_gpu"].values()] == [8, 8, 8, 6]
    # 32 keeps the step (chunks of 8) and does 2 more samples; 28 saves an eighth of the
    # compute but not of the rest of the step: 32 first.
    assert f.evidence["nearest_batches"] == [32, 28]
    assert f.evidence["even_chunk_sizes"] == [8, 8, 7, 7]
    assert f.evidence["speedup_model"] == SAMPLES_PER_SECOND
    assert (f.facts.chunks, f.facts.short) == ((8, 8, 8, 6), (ShortGpu(3, 6),))
    assert (f.facts.nearest, f.facts.even) == ((32, 28), (8, 8, 7, 7))
    # The nearest batches best first, or the batch kept with explicit per-GPU chunks.
    speedup = f.predicted_speedup
    assert f.fixes == (
        Fix("batch_size", 0, 30, 32, speedup, (KIND,)),
        Fix("batch_size", 0, 30, 28, speedup, (KIND,)),
        Fix("scatter_chunks", 0, "8,8,8,6", "8,8,7,7", speedup, (KIND,)),
    )
    # Samples per second: 32 samples in the step that did 30.
    assert f.predicted_speedup == pytest.approx(32 / 30, rel=0.01)
    assert f.severity == "info"


@pytest.mark.parametrize(
    ("batch", "n", "chunks", "short", "speedup"),
    [
        pytest.param(30, 4, [8, 8, 8, 6], [3], 32 / 30, id="30-over-4"),
        pytest.param(31, 4, [8, 8, 8, 7], [3], 32 / 31, id="31-over-4"),
        pytest.param(33, 4, [9, 9, 9, 6], [3], 36 / 33, id="33-over-4"),
        # ceil(5 / 4) = 2: 2, 2, 1 and GPU 3 gets nothing: 8 samples would fill the step.
        pytest.param(5, 4, [2, 2, 1, 0], [2, 3], 8 / 5, id="5-over-4"),
        pytest.param(3, 4, [1, 1, 1, 0], [3], 4 / 3, id="3-over-4"),
        pytest.param(7, 2, [4, 3], [1], 8 / 7, id="7-over-2"),
        pytest.param(32, 4, None, [], None, id="divides"),
        pytest.param(24, 8, None, [], None, id="divides-8"),
    ],
)
def test_decision_table(
    batch: int, n: int, chunks: list[int] | None, short: list[int], speedup: float | None
) -> None:
    findings = RULE(dp_batch(batch, n))
    if chunks is None:
        assert findings == []
        return
    (f,) = findings
    assert f.ranks == (0,)
    assert f.evidence["chunk_sizes"] == chunks
    assert [g["index"] for g in f.evidence["gpus"]] == short
    assert f.gpus == tuple(gpu_uuid("node0", g) for g in short)
    assert f.predicted_speedup == pytest.approx(speedup, rel=0.01)
    assert f.fixes[0].lever == "batch_size" and f.fixes[-1].lever == "scatter_chunks"


def test_gpu_count_from_the_ranks_devices_without_nvml() -> None:
    (f,) = RULE(dp_batch(30, gpus=False))
    assert f.evidence["chunk_sizes"] == [8, 8, 8, 6]
    assert [(g["index"], g["uuid"]) for g in f.evidence["gpus"]] == [(3, None)]
    assert f.gpus == ()  # no UUID to name


def test_silent_below_min_steps_and_for_a_single_gpu() -> None:
    assert RULE(dp_batch(30, steps=7)) == []
    assert RULE(dp_batch(30), min_steps=25) == []
    assert RULE(dp_batch(31, 1)) == []


def test_engine_reports_only_the_split_for_an_otherwise_balanced_dp_job() -> None:
    findings = analyze(dp_batch(30))
    assert [(f.kind, f.ranks) for f in findings] == [("batch_split", (0,))]
