"""What the rebuild keeps from one evaluation to the next (auditor.service.promsnapshot): the
parts that depend on labels alone are reused while the client hands the same label tuples, and
never change a result. Every evaluation here is checked against a cold one (nothing kept) of
the same answers, object by object; and the column helpers' shortcuts against their long way."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from auditor.analysis.snapshot import Snapshot
from auditor.analysis.stats import rank_stats_from_columns
from auditor.metrics.promvector import LabelCache, decode_vector
from auditor.metrics.query import Series, Vector
from auditor.service import promsnapshot
from auditor.service.promsnapshot import _ones, _per_worker, build_snapshots
from tests.helpers import servejob

NOW = servejob.NOW
WINDOW = servejob.WINDOW_S
JOB = servejob.JOB


def decoded(answers: Mapping[str, Sequence[Series]], cache: LabelCache) -> dict[str, Vector]:
    """The answers as the service reads them: JSON bodies decoded by the client's decoder, the
    label tuples shared through ``cache`` (as from one evaluation to the next)."""
    out = {}
    for key, body in servejob.as_prometheus_json(answers).items():
        found = decode_vector(body, cache)
        assert found is not None
        out[key] = Vector(*found)
    return out


def cold(answers: Mapping[str, Vector]) -> dict[str, Snapshot]:
    promsnapshot.forget()
    try:
        return build_snapshots(answers, NOW, WINDOW)
    finally:
        promsnapshot.forget()


def fields(x: Any) -> Any:
    """Every field of every object, compare=False ones included, floats by their bits."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, {k: fields(v) for k, v in vars(x).items() if k[0] != "_"})
    if isinstance(x, dict):
        return [(fields(k), fields(v)) for k, v in x.items()]
    if isinstance(x, (list, tuple)):
        return [fields(v) for v in x]
    if isinstance(x, float):
        return x.hex()
    return x


def same(a: Mapping[str, Snapshot], b: Mapping[str, Snapshot]) -> None:
    assert list(a) == list(b)
    for job in a:
        assert fields(a[job]) == fields(b[job]), job
        assert fields(a[job].precomputed_stats) == fields(b[job].precomputed_stats), job


def with_answer(
    answers: dict[str, list[Series]], key: str, change: dict[str, float]
) -> dict[str, list[Series]]:
    """``answers`` with the values of ``key`` by rank label changed."""
    out = dict(answers)
    out[key] = [
        Series(s.labels, ((s.samples[-1][0], change.get(s.labels.get("rank", ""), s.last[1])),))
        if s.last is not None
        else s
        for s in answers[key]
    ]
    return out


def test_new_values_under_the_same_labels_reuse_the_identities() -> None:
    cache = LabelCache()
    first = decoded(servejob.answers(64, scrape_s=15.0), cache)
    promsnapshot.forget()
    one = build_snapshots(first, NOW, WINDOW)
    # The next evaluation: every figure moved, the same series.
    later = decoded(servejob.answers(64, scrape_s=15.0, seed=1), cache)
    assert later["rank_info"].labels is first["rank_info"].labels
    two = build_snapshots(later, NOW, WINDOW)
    same(two, cold(later))
    # Kept: the same identity objects; the figures are the new ones.
    assert two[JOB].ranks[5].info is one[JOB].ranks[5].info
    assert two[JOB].ranks[5].steps != one[JOB].ranks[5].steps


def test_what_the_labels_do_not_say_is_never_kept() -> None:
    """Each input of a kept part that is a value, not a label, changed alone: the rebuild
    follows it as a cold one does."""
    cache = LabelCache()
    base = servejob.answers(64, scrape_s=15.0)
    changes = [
        ("config_workers", {"3": 6.0}),  # a loader's configured workers
        ("steps", {"7": math.nan}),  # a rank that counted no step
        ("gpu_samples", {}),  # a GPU that never answered (below)
        ("workers", {"2": 3.0, "9": 0.0}),  # uneven workers: the long way per rank
    ]
    for key, change in changes:
        answers = with_answer(base, key, change)
        if key == "gpu_samples":
            answers[key] = [
                Series(s.labels, ((NOW, 0.0),)) if i == 4 else s for i, s in enumerate(base[key])
            ]
        # After the base evaluation (what it keeps), the change; and the other way round.
        for before, after in ((base, answers), (answers, base)):
            build_snapshots(decoded(before, cache), NOW, WINDOW)
            now = decoded(after, cache)
            same(build_snapshots(now, NOW, WINDOW), cold(now))


def test_new_labels_are_read_anew() -> None:
    cache = LabelCache()
    for answers in (
        servejob.answers(72, scrape_s=15.0),  # another node joined
        servejob.answers(56, scrape_s=15.0),  # and left
    ):
        build_snapshots(decoded(servejob.answers(64, scrape_s=15.0), cache), NOW, WINDOW)
        now = decoded(answers, cache)
        same(build_snapshots(now, NOW, WINDOW), cold(now))
    # Hand-written answers (lists of labels, not the client's tuples) are never kept.
    listed = {k: Vector.of(v) for k, v in servejob.answers(16, scrape_s=15.0).items()}
    same(build_snapshots(listed, NOW, WINDOW), cold(listed))
    assert build_snapshots(listed, NOW, WINDOW)[JOB].ranks[0].info is not (
        build_snapshots(listed, NOW, WINDOW)[JOB].ranks[0].info
    )


def test_per_worker_cpu_as_each_rank_alone() -> None:
    def long_way(workers: list[int], totals: list[float | None]) -> list[tuple[float, ...]]:
        pairs = zip(workers, totals, strict=True)
        return [() if not w or t is None else (t / w,) * w for w, t in pairs]

    for workers, totals in (
        ([3, 3, 3], [1.0, 0.7, 2.9]),  # every rank alike: the shortcut
        ([2, 0, 3], [1.0, 0.5, 0.9]),
        ([2, 2], [1.0, None]),
        ([0, 0], [1.0, 2.0]),
        ([], []),
    ):
        column = np.array([math.nan if t is None else t for t in totals], dtype=np.float64)
        assert _per_worker(workers, column, totals) == long_way(workers, totals)
    assert _per_worker([3, 3], np.array([0.9, 1.5]), [0.9, 1.5]) == [(0.3,) * 3, (0.5,) * 3]


def test_ones() -> None:
    assert _ones(["a", "b"], np.array([True, True])) == [("a",), ("b",)]
    assert _ones(["a", "b", "c"], np.array([True, False, True])) == [("a",), (), ("c",)]


def test_column_statistics_shortcut_equals_the_long_way() -> None:
    """Every rank stepped and sampled (the columns taken whole) gives what the rank by rank
    path gives the same ranks (here made to run by one more rank that did not step)."""
    nan = math.nan
    columns: dict[str, list[Any]] = dict(
        rank=[0, 1],
        host=["a", "b"],
        device=["cuda:0", "cuda:1"],
        loader=[None, None],
        steps=[10, 12],
        step_s=[0.2, 0.25],
        data_wait_s=[0.05, 0.0],
        h2d_s=[0.0, 0.01],
        forward_s=[0.05, 0.06],
        backward_s=[0.04, 0.05],
        optimizer_s=[0.01, 0.01],
        collective_wait_s=[0.05, None],
        batch_size=[32, 30],
        micro_batches=[2, 1],
        rss_bytes=[1000, 1200],
        mem_allocated_bytes=[None, 5],
        mem_peak_bytes=[2000, 2100],
        cpu_sampled=[True, True],
        main_cpu=[0.5, 0.7],
        worker_cpu=[1.5, 2.0],
        workers=[3, 2],
        main_rss_bytes=[1000, 1100],
    )
    extra = dict(
        rank=2, host="c", device="cpu", loader=None, steps=0, step_s=nan, data_wait_s=nan,
        h2d_s=nan, forward_s=nan, backward_s=nan, optimizer_s=nan, collective_wait_s=None,
        batch_size=None, micro_batches=1, rss_bytes=None, mem_allocated_bytes=None,
        mem_peak_bytes=None, cpu_sampled=False, main_cpu=None, worker_cpu=None, workers=0,
        main_rss_bytes=None,
    )  # fmt: skip
    short = rank_stats_from_columns(**columns)
    long = rank_stats_from_columns(**{k: [*v, extra[k]] for k, v in columns.items()})[:2]
    assert fields(short) == fields(long)
    assert [s.batch_size for s in short] == [32.0, 30.0]
    assert [type(s.main_rss_bytes) for s in short] == [float, float]
