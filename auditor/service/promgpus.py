"""PromQL answers -> each GPU's :class:`DeviceStats` for ``auditor serve``: from the auditor's own
GPU monitors and from dcgm-exporter, with the job, rank and node that own each GPU; what depends
on the GPUs' labels alone is kept between evaluations (:mod:`.kept`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from itertools import compress
from operator import methodcaller
from typing import Any

import numpy as np

from auditor.analysis.devices import IDLE_REASONS, DeviceStats
from auditor.analysis.frozen import from_columns
from auditor.metrics import catalog as C
from auditor.metrics.query import Vector

from .columns import (
    GPU,
    Answers,
    Columns,
    as_vector,
    int_label_or_0,
    optional,
    optional_ints,
    rounded,
)
from .kept import LAST
from .promqueries import DCGM, GPU_FIGURES

_MHZ = 1e6
MODEL = "modelName"  # dcgm-exporter's model label (the highest SM clock per model is by it)


def gpu_stats(
    answers: Answers, wanted: Collection[str] | None = None
) -> dict[str, tuple[DeviceStats, str, str]]:
    """Every GPU that answered in the window (see :func:`_gpu_stats`), from the auditor's own
    monitors and from dcgm-exporter (answers prefixed :data:`~.promqueries.DCGM`): a GPU both
    export is read from the monitors. dcgm-exporter's GPUs take their job, rank and node from the
    rank that reported using them (``auditor_gpu_owner_info``, joined by UUID)."""
    return all_gpus(answers, wanted)[0]


def all_gpus(
    answers: Answers, wanted: Collection[str] | None
) -> tuple[dict[str, tuple[DeviceStats, str, str]], tuple[_GpuIdentity, ...]]:
    """:func:`gpu_stats`, and the identities of each source's GPUs it read."""
    out, monitors = _gpu_stats(answers, wanted)
    used: tuple[_GpuIdentity, ...] = (monitors,)
    if as_vector(answers.get(DCGM + "gpu_up")).labels:
        owners: dict[str, Mapping[str, str]] = {}
        for series in as_vector(answers.get(DCGM + "gpu_owner")).labels:
            uuid = series.get("uuid", "")
            had = owners.get(uuid)
            # Two ranks naming one GPU: the lowest rank owns it, as the node agent decides.
            if uuid and (
                had is None or int_label_or_0(series.get("rank")) < int_label_or_0(had.get("rank"))
            ):
                owners[uuid] = series
        dcgm, exporter = _gpu_stats(answers, wanted, prefix=DCGM, owners=owners)
        used += (exporter,)
        for uuid, found in dcgm.items():
            out.setdefault(uuid, found)
    return out, used


def _gpu_stats(
    answers: Answers,
    wanted: Collection[str] | None = None,
    *,
    prefix: str = "",
    owners: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[dict[str, tuple[DeviceStats, str, str]], _GpuIdentity]:
    """Every GPU that answered in the window: its figures, owning job and rank ("" if none),
    and the identity of the GPUs read (:func:`_gpu_identity`); with ``wanted``, only the GPUs
    of those jobs and the GPUs no job owns. ``prefix``: whose answers
    (:data:`~.promqueries.DCGM`: dcgm-exporter's); ``owners``: the owning rank's labels (job,
    rank, node) by UUID, for a source whose series do not carry them.

    A GPU whose monitor never answered (``sum_over_time(auditor_gpu_up)`` 0) is left out: a
    missing GPU must not read as an idle one.
    """
    up = as_vector(answers.get(prefix + "gpu_up"))
    known = _gpu_identity(up, wanted, owners)
    identity, by_gpu = known.labels, known.columns
    v = {key: by_gpu.column(as_vector(answers.get(prefix + key))) for key in GPU_FIGURES}
    clock_max = v["gpu_sm_clock_max"]
    peak = as_vector(answers.get(prefix + "gpu_sm_clock_peak"))
    if len(peak.values) and np.isnan(clock_max).any():
        # No maximum exported (dcgm-exporter's default fields): the highest SM clock a GPU of the
        # same model reached in the last hour stands for it, so a GPU clocked below its peers'
        # still reads low.
        top = dict(zip(peak.label(MODEL), peak.values.tolist(), strict=True))
        models = known.models
        fill = np.array([top.get(m, np.nan) for m in models], dtype=np.float64) * _MHZ
        clock_max = np.where(np.isnan(clock_max), fill, clock_max)
    with np.errstate(divide="ignore", invalid="ignore"):
        used, total = v["gpu_mem_used"], v["gpu_mem_total"]
        clock = v["gpu_sm_clock"]
        # x / y where both are known and y is not 0 (nor NaN), else None.
        mem_ratio = optional(np.where(total != 0, used / total, np.nan))
        clock_ratio = optional(np.where(clock_max != 0, clock / clock_max, np.nan))
    # Every figure as one list over the GPUs, by DeviceStats field; each GPU's fields are then
    # one dict(zip(...)) (C-level), not a dict built field by field.
    figures: dict[str, list[Any]] = {
        "samples": rounded(v["gpu_samples"], 0),
        "lost": (v["gpu_lost"] == 1).tolist(),
        "span_s": [max(0.0, x) if x == x else 0.0 for x in v["gpu_span"].tolist()],
    }
    for field, key in (
        ("gpu_util", "gpu_util"),
        ("mem_used_bytes", "gpu_mem_used"),
        ("mem_trend_bytes_per_s", "gpu_mem_trend"),
        ("mem_recent_trend_bytes_per_s", "gpu_mem_recent"),
        ("temperature_c", "gpu_temperature"),
        ("power_w", "gpu_power"),
        ("power_limit_w", "gpu_power_limit"),
    ):
        figures[field] = optional(v[key])
    figures["sm_clock_mhz"] = optional(clock / _MHZ)
    figures["sm_clock_max_mhz"] = optional(clock_max / _MHZ)
    for field, key in (
        ("mem_used_max_bytes", "gpu_mem_used_max"),
        ("mem_total_bytes", "gpu_mem_total"),
        ("pcie_gen", "gpu_pcie_gen"),
        ("pcie_gen_max", "gpu_pcie_gen_max"),
        ("pcie_width", "gpu_pcie_width"),
        ("pcie_width_max", "gpu_pcie_width_max"),
    ):
        figures[field] = optional_ints(v[key])
    figures["mem_ratio"] = mem_ratio
    figures["sm_clock_ratio"] = clock_ratio
    throttle: dict[str, dict[str, float]] = defaultdict(dict)
    answer = as_vector(answers.get(prefix + "gpu_throttle"))
    for labels, value in zip(answer.labels, answer.values.tolist(), strict=True):
        if value == value:
            throttle[labels.get("uuid", "")][labels.get("reason", "other")] = value
    # GPUs whose driver reports reasons at all: the others' throttle share is unknown, not 0.
    at = by_gpu.rows(as_vector(answers.get(prefix + "gpu_throttle_read")))
    read = np.zeros(len(identity), dtype=bool)
    read[at[at >= 0]] = True
    share = np.where(read, 0.0, np.nan)
    ordered: dict[str, tuple[str, ...]] = {}
    for uuid, mine in throttle.items():
        i = by_gpu.index.get(uuid)
        if i is None:
            continue
        reasons = {r: x for r, x in mine.items() if r not in IDLE_REASONS}
        if read[i]:
            share[i] = max(reasons.values(), default=0.0)
        ordered[uuid] = tuple(
            sorted((r for r, x in reasons.items() if x > 0), key=lambda r: -reasons[r])
        )

    uuids = known.uuids
    count = len(uuids)
    figures |= {
        "uuid": uuids,
        "node": known.nodes,
        "index": known.indexes,
        "model": known.models,
        "throttle_share": optional(share),
        "throttle_reasons": [ordered.get(u, ()) for u in uuids] if ordered else [()] * count,
        "process_count": [0] * count,  # no rule reads it; the dashboards have auditor_gpu_processes
        "processes": [()] * count,
    }
    jobs, ranks = known.jobs, known.ranks
    samples = v["gpu_samples"]
    answered = np.isfinite(samples) & (samples > 0.5)  # "samples" (rounded) at least 1
    if not answered.all():
        keep = answered.tolist()
        figures = {k: list(compress(v, keep)) for k, v in figures.items()}
        uuids, jobs, ranks = (list(compress(v, keep)) for v in (uuids, jobs, ranks))
    stats = from_columns(DeviceStats, figures)
    return dict(zip(uuids, zip(stats, jobs, ranks, strict=True), strict=True)), known


@dataclass(frozen=True, eq=False)
class _GpuIdentity:
    """The GPUs that answered ``gpu_up`` (of the jobs wanted, and of none), in its order: their
    labels by UUID, the answers' columns over them, and their labels as columns. ``kept``:
    reusable by the next evaluation (its inputs were the client's shared labels)."""

    labels: dict[str, Mapping[str, str]]
    columns: Columns
    uuids: list[str]
    nodes: list[str]
    indexes: list[int]
    models: list[str]
    jobs: list[str]
    ranks: list[str]
    kept: bool


def _gpu_identity(
    up: Vector, wanted: Collection[str] | None, owners: Mapping[str, Mapping[str, str]] | None
) -> _GpuIdentity:
    """The GPUs that answered ``gpu_up``, with their owner's labels where the source's series do
    not carry them (``owners``); kept while the labels are the same (:data:`LAST`)."""
    inputs = (up.labels, wanted, owners or {})
    kept = LAST.get("gpus" if owners is None else "dcgm_gpus", inputs)
    if kept is not None:
        return kept
    identity: dict[str, Mapping[str, str]] = {}
    uuids = GPU.all(up)
    if not owners and "" not in uuids and len(set(uuids)) == len(uuids):
        # The usual answer: a series per GPU, nothing to join (built in C).
        identity.update(zip(uuids, up.labels, strict=True))
    for series in () if identity else up.labels:
        uuid = series.get("uuid", "")
        owner = (owners or {}).get(uuid)
        if owner is not None and not series.get(C.JOB_LABEL):
            series = {**series, **owner}
        # A GPU that changed owner in the window has a series per owner; an owner beats none.
        if uuid and (uuid not in identity or series.get(C.JOB_LABEL)):
            identity[uuid] = series
    if wanted is not None:
        identity = {
            u: x
            for u, x in identity.items()
            if x.get(C.JOB_LABEL, "") in wanted or not x.get(C.JOB_LABEL)
        }
    identities = list(identity.values())

    def label(name: str) -> list[str]:
        return list(map(methodcaller("get", name, ""), identities))

    found = _GpuIdentity(
        labels=identity,
        columns=Columns({uuid: i for i, uuid in enumerate(identity)}, GPU),
        uuids=list(identity),
        nodes=label("node"),
        indexes=list(map(int_label_or_0, label("gpu"))),
        models=label("model"),
        jobs=label(C.JOB_LABEL),
        ranks=label("rank"),
        kept=type(up.labels) is tuple,
    )
    LAST.keep("gpus" if owners is None else "dcgm_gpus", inputs, found)
    return found
