"""Prometheus exporter: a custom collector that renders the latest :class:`ExportState` per scrape.

Rendering at scrape time (instead of updating client-library gauges as samples arrive) keeps
the hot path free of Prometheus work and makes a series disappear when its value is unknown,
which stateful gauges cannot do. Every family is built from a :mod:`auditor.metrics.catalog`
spec, so no metric name or label set is spelled outside the catalog.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from auditor.analysis.findings import Finding
from auditor.analysis.fixes import Value
from auditor.analysis.rules import memory_growth
from auditor.report.phrasing import phrase
from auditor.samples import PHASES, DeviceSample, RankInfo

from . import catalog as C
from .catalog import MetricSpec
from .state import ExportState, GpuStatus, gpu_owner

StateFn = Callable[[], ExportState]


class SeriesSet:
    """Samples per catalog spec, keyed by label values in the spec's label order.

    Checks each sample's label names against the spec (a mismatch is a bug here, not something
    to ship) and merges duplicate label sets by ``max`` -- only findings can collide, e.g. two
    findings of one kind blaming the same rank.
    """

    def __init__(self) -> None:
        self._values: dict[str, dict[tuple[str, ...], float]] = {}

    def add(self, metric: MetricSpec, labels: Mapping[str, str], value: float) -> None:
        if tuple(labels) != metric.labels:
            raise ValueError(f"{metric.name}: labels {tuple(labels)} != catalog {metric.labels}")
        key = tuple(labels.values())
        series = self._values.setdefault(metric.name, {})
        series[key] = max(value, series[key]) if key in series else value

    def families(self) -> Iterator[Metric]:
        """One family per spec that has samples, in catalog order (stable output)."""
        for metric in C.CATALOG:
            series = self._values.get(metric.name)
            if not series:
                continue
            family = family_for(metric)
            for key, value in series.items():
                if isinstance(family, InfoMetricFamily):
                    family.add_metric(list(key), {})  # an info sample is always 1
                else:
                    family.add_metric(list(key), value)
            yield family


Family = CounterMetricFamily | GaugeMetricFamily | InfoMetricFamily


def family_for(metric: MetricSpec) -> Family:
    """An empty prometheus_client family for ``metric``.

    The unit is passed on only when the name already ends in it: prometheus_client appends a
    missing unit to the name, and OpenMetrics requires the suffix wherever ``# UNIT`` is set.
    """
    if metric.type == "counter":
        base = metric.name.removesuffix("_total")
        unit = metric.unit if metric.unit and base.endswith("_" + metric.unit) else ""
        return CounterMetricFamily(base, metric.help, labels=metric.labels, unit=unit)
    if metric.type == "info":
        base = metric.name.removesuffix("_info")
        return InfoMetricFamily(base, metric.help, labels=metric.labels)
    unit = metric.unit if metric.unit and metric.name.endswith("_" + metric.unit) else ""
    return GaugeMetricFamily(metric.name, metric.help, labels=metric.labels, unit=unit)


def render(state: ExportState) -> list[Metric]:
    """All metric families for ``state``; a value that is None yields no series."""
    # Copy the containers first: the owner may update them in place while a scrape runs.
    infos = dict(state.infos)
    totals = dict(state.totals)
    cpu = dict(state.cpu)
    ended = set(state.ended)
    findings = list(state.findings)
    flops = dict(state.flops)
    out = SeriesSet()

    # Only ranks that introduced themselves: label sets (local_rank, node) stay stable. ``rank``
    # below is the key the samples are filed under: the rank number, or (a fleet agent serving
    # several jobs) a key per job and rank; the labels are the rank's own job and rank.
    for rank in sorted(infos):
        info = infos[rank]
        base = {
            C.JOB_LABEL: info.job or state.job,
            "node": info.host or state.node,
            "rank": str(info.rank),
            "local_rank": str(info.local_rank),
        }
        out.add(
            C.RANK_INFO,
            {
                **base,
                "device": info.device,
                "parallel_mode": info.parallel_mode,
                "world_size": str(info.world_size),
            },
            1,
        )
        out.add(C.RANK_UP, base, 0 if rank in ended else 1)
        if info.loader is not None:
            loader = info.loader
            out.add(C.RANK_DATALOADER_CONFIG_WORKERS, base, loader.num_workers)
            out.add(
                C.RANK_DATALOADER_INFO,
                {
                    **base,
                    "pin_memory": _flag(loader.pin_memory),
                    "persistent_workers": _flag(loader.persistent_workers),
                    "prefetch_factor": _optional(loader.prefetch_factor),
                    "batch_size": _optional(loader.batch_size),
                },
                1,
            )

        proc = cpu.get(rank)
        if proc is not None:
            if proc.main_cpu is not None:
                out.add(C.RANK_CPU_CORES, {**base, "process": "main"}, proc.main_cpu)
            out.add(C.RANK_CPU_CORES, {**base, "process": "workers"}, proc.worker_cpu_total)
            out.add(C.RANK_DATALOADER_WORKERS, base, proc.workers)

        tot = totals.get(rank)
        last = tot.last if tot is not None else None
        if tot is not None and tot.steps:
            out.add(C.RANK_STEPS_TOTAL, base, tot.steps)
            out.add(C.RANK_STEP_SECONDS_TOTAL, base, tot.step_seconds)
            for phase in PHASES:
                # A phase the probe could not attach to reads 0.0 in samples: not a measurement.
                if phase in tot.phase_seconds and phase not in info.unmeasured:
                    out.add(
                        C.RANK_PHASE_SECONDS_TOTAL,
                        {**base, "phase": phase},
                        tot.phase_seconds[phase],
                    )
            if tot.samples is not None:
                out.add(C.RANK_SAMPLES_TOTAL, base, tot.samples)
            out.add(C.RANK_MICRO_BATCHES_TOTAL, base, tot.micro_batches)
        if last is not None:
            out.add(C.RANK_LAST_STEP_SECONDS, base, last.step_s)
            out.add(C.RANK_LAST_STEP_TIMESTAMP_SECONDS, base, last.time)
            if last.batch_size is not None:
                out.add(C.RANK_BATCH_SIZE, base, last.batch_size)

        # rss from the probe's step; the node-side process sample when the step has none.
        rss = last.rss_bytes if last is not None else None
        if rss is None and proc is not None:
            rss = proc.rss_bytes
        memory = {
            "rss": rss,
            "allocated": last.mem_allocated_bytes if last is not None else None,
            "reserved": last.mem_reserved_bytes if last is not None else None,
            "peak": last.mem_peak_bytes if last is not None else None,
        }
        for kind in C.MEMORY_KINDS:
            value = memory[kind]
            if value is not None:
                out.add(C.RANK_MEMORY_BYTES, {**base, "memory": kind}, value)
        budget = state.memory.get(rank)
        if budget is not None:
            parts = budget.parts()
            for part in C.MEMORY_PARTS:
                value = parts[part]
                if value is not None:
                    out.add(C.RANK_MEMORY_BUDGET_BYTES, {**base, "part": part}, value)

        # The counted work is filed by rank number: only a rank keyed by it (not a fleet
        # agent's key per job and rank) is the verdict's rank of that number.
        work = flops.get(rank) if rank == info.rank else None
        if work is not None:
            out.add(C.RANK_FLOPS_PER_STEP, base, work.flops_per_step)
            # The rank's pace and MFU are its present, which an ended rank no longer has.
            if rank not in ended:
                if work.flops_per_s is not None:
                    out.add(C.RANK_FLOPS_PER_SECOND, base, work.flops_per_s)
                if work.mfu is not None:
                    out.add(C.RANK_MFU_RATIO, base, work.mfu)

    node_cpu = state.node_cpu
    if node_cpu is not None:
        node = {C.JOB_LABEL: state.job, "node": node_cpu.host or state.node}
        out.add(C.NODE_CPU_CORES, node, node_cpu.cores)
        out.add(C.NODE_CPU_BUSY_CORES, node, node_cpu.busy_cores)
        out.add(C.NODE_LOAD1, node, node_cpu.load1)

    if state.job_mfu is not None:
        out.add(C.JOB_MFU_RATIO, {C.JOB_LABEL: state.job}, state.job_mfu)

    gpus = dict(state.gpus)
    live_ranks = {r: i for r, i in infos.items() if r not in ended}
    for uuid in sorted(gpus, key=lambda u: (gpus[u].index, u)):
        _render_gpu(out, state, gpus[uuid], live_ranks)
    _render_owners(out, state, live_ranks)

    def node_of(rank: int) -> str:
        info = infos.get(rank)
        return (info.host or state.node) if info is not None else ""

    add_findings(out, state.job, findings, node_of)
    return list(out.families())


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _optional(value: int | None) -> str:
    return "" if value is None else str(value)


def add_findings(
    out: SeriesSet, job: str, findings: Sequence[Finding], node_of: Callable[[int], str]
) -> None:
    """``auditor_finding`` and its predicted speed-up, one series per blamed rank so dashboards
    can join on rank (rank="" and node="" for a job-wide finding), and each fix as
    ``auditor_finding_fix_info`` (:func:`add_fixes`); ``node_of`` names a rank's node. Shared by
    the node endpoints and ``auditor serve``."""
    add_fixes(out, job, findings, node_of)
    for finding in findings:
        blamed: tuple[int | None, ...] = finding.ranks or (None,)
        for r in blamed:
            rank_label = "" if r is None else str(r)
            out.add(
                C.FINDING,
                {
                    C.JOB_LABEL: job,
                    "kind": finding.kind,
                    "rank": rank_label,
                    "node": "" if r is None else node_of(r),
                    "severity": finding.severity,
                },
                1,
            )
            if finding.predicted_speedup is not None:
                out.add(
                    C.FINDING_PREDICTED_SPEEDUP,
                    {C.JOB_LABEL: job, "kind": finding.kind, "rank": rank_label},
                    finding.predicted_speedup,
                )
        _add_memory_full(out, job, finding, node_of)


def _add_memory_full(
    out: SeriesSet, job: str, finding: Finding, node_of: Callable[[int], str]
) -> None:
    """``auditor_finding_memory_full_seconds``: each climbing rank's projected time to full
    (memory_growth), where one is projected."""
    if not isinstance(finding.facts, memory_growth.Facts):
        return
    for r, growth in finding.facts.ranks.items():
        if growth.full_in_s is not None:
            labels = {C.JOB_LABEL: job, "kind": finding.kind, "rank": str(r), "node": node_of(r)}
            out.add(C.FINDING_MEMORY_FULL_SECONDS, labels, growth.full_in_s)


# A fix's words are a label value: long enough for every rule's change to a rank, bounded so a
# label never grows without limit. Values (current, proposed) are shorter still.
FIX_WORDS_MAX = 400
FIX_VALUE_MAX = 40


def add_fixes(
    out: SeriesSet, job: str, findings: Sequence[Finding], node_of: Callable[[int], str]
) -> None:
    """``auditor_finding_fix_info``: one series per (finding kind, rank, lever), the first fix
    the rule lists winning (a rule lists its preferred change first), with the rank's change in
    words as ``fix`` (the words of :func:`auditor.report.phrasing.phrase`, the ones the verdict
    prints). A fix on a GPU no rank owns has rank="" and node="", and the finding's GPU note as
    its words. So a Grafana table or an alert's annotation reads what to change on which rank
    from Prometheus alone."""
    seen: set[tuple[str, str, str]] = set()
    for finding in findings:
        if not finding.fixes:
            continue
        words = _fix_words(finding)
        for fix in finding.fixes:
            rank = "" if fix.rank is None else str(fix.rank)
            key = (finding.kind, rank, fix.lever)
            if key in seen:
                continue
            seen.add(key)
            out.add(
                C.FINDING_FIX_INFO,
                {
                    C.JOB_LABEL: job,
                    "kind": finding.kind,
                    "rank": rank,
                    "node": "" if fix.rank is None else node_of(fix.rank),
                    "lever": fix.lever,
                    "current": _fix_value(fix.current),
                    "proposed": _fix_value(fix.proposed),
                    "fix": _short(words.get(fix.rank, ""), FIX_WORDS_MAX),
                },
                1,
            )


# Each finding's words, by identity: a scrape renders the same published findings as the one
# before it until the next verdict, so each finding is phrased once. The finding is held with
# its words (its id cannot be reused meanwhile); the cache is emptied when full.
_WORDS: dict[int, tuple[Finding, dict[int | None, str]]] = {}
_WORDS_MAX = 8192


def _fix_words(finding: Finding) -> dict[int | None, str]:
    """The change to make per blamed rank in words; under None, the change to a GPU no rank
    owns. Nothing where the finding's facts have no wording (a finding built by hand)."""
    hit = _WORDS.get(id(finding))
    if hit is not None and hit[0] is finding:
        return hit[1]
    words = _phrase_fixes(finding)
    if len(_WORDS) >= _WORDS_MAX:
        _WORDS.clear()
    _WORDS[id(finding)] = (finding, words)
    return words


def _phrase_fixes(finding: Finding) -> dict[int | None, str]:
    try:
        said = phrase(finding)
    except TypeError:  # facts of a type no phrasing module words: the fix keeps its values
        return {}
    words: dict[int | None, str] = {rank: text for rank, text in said.fixes.items()}
    note = said.notes.get("fix")
    if isinstance(note, str):
        words[None] = note
    return words


def _fix_value(value: Value) -> str:
    """A fix's current or proposed value as a short label value ("" where it is not one)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return _flag(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return _short(str(value), FIX_VALUE_MAX)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MHZ = 1e6  # NVML reports clocks in MHz; the metrics are in hertz.


def _render_gpu(
    out: SeriesSet, state: ExportState, gpu: GpuStatus, ranks: dict[int, RankInfo]
) -> None:
    """One GPU's series. Down: only up=0 and the last sample's time; lost: no values."""
    sample = gpu.sample
    owner = gpu_owner(gpu, ranks)
    labels = {
        "node": state.node,
        "gpu": str(gpu.index),
        "uuid": gpu.uuid,
        "model": gpu.model or (sample.model if sample is not None else ""),
        C.JOB_LABEL: (owner.job or state.job) if owner is not None else "",
        "rank": str(owner.rank) if owner is not None else "",
    }
    out.add(C.GPU_UP, labels, 1 if gpu.up and sample is not None else 0)
    if sample is None:
        return
    out.add(C.GPU_LAST_SAMPLE_TIMESTAMP_SECONDS, labels, sample.time)
    if not gpu.up:
        return
    out.add(C.GPU_LOST, labels, 1 if sample.lost else 0)
    if sample.lost:
        return
    for metric, value in _gpu_values(sample):
        if value is not None:
            out.add(metric, labels, value)
    if sample.throttle_reasons is not None:
        active = set(sample.throttle_reasons)
        known = set(C.THROTTLE_REASONS)
        for reason in C.THROTTLE_REASONS:
            on = bool(active - known) if reason == "other" else reason in active
            out.add(C.GPU_THROTTLE_ACTIVE, {**labels, "reason": reason}, 1 if on else 0)
    out.add(C.GPU_PROCESSES, labels, len(sample.processes))


def _render_owners(out: SeriesSet, state: ExportState, ranks: dict[int, RankInfo]) -> None:
    """``auditor_gpu_owner_info``: each GPU a live rank reported using (its CUDA UUIDs), so a GPU
    source other than the monitors (dcgm-exporter) joins to the rank by UUID."""
    gpus = state.gpus
    for slot in sorted(ranks):
        info = ranks[slot]
        for i, uuid in enumerate(info.device_uuids):
            if not uuid:
                continue
            known = gpus.get(uuid)
            index = info.devices[i] if i < len(info.devices) else None
            if index is None and known is not None:
                index = known.index
            out.add(
                C.GPU_OWNER_INFO,
                {
                    "node": info.host or state.node,
                    "gpu": "" if index is None else str(index),
                    "uuid": uuid,
                    "model": _model(known),
                    C.JOB_LABEL: info.job or state.job,
                    "rank": str(info.rank),
                    "local_rank": str(info.local_rank),
                },
                1,
            )


def _model(gpu: GpuStatus | None) -> str:
    if gpu is None:
        return ""
    return gpu.model or (gpu.sample.model if gpu.sample is not None else "")


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _gpu_values(s: DeviceSample) -> list[tuple[MetricSpec, float | None]]:
    """(metric, value in base units) of one sample; None where NVML gave nothing."""
    return [
        (C.GPU_UTILIZATION_RATIO, s.gpu_util),
        (C.GPU_MEMORY_UTILIZATION_RATIO, s.mem_util),
        (C.GPU_MEMORY_USED_BYTES, s.mem_used_bytes),
        (C.GPU_MEMORY_TOTAL_BYTES, s.mem_total_bytes),
        (C.GPU_SM_CLOCK_HERTZ, _scaled(s.sm_clock_mhz, _MHZ)),
        (C.GPU_SM_CLOCK_MAX_HERTZ, _scaled(s.sm_clock_max_mhz, _MHZ)),
        (C.GPU_MEMORY_CLOCK_HERTZ, _scaled(s.mem_clock_mhz, _MHZ)),
        (C.GPU_MEMORY_CLOCK_MAX_HERTZ, _scaled(s.mem_clock_max_mhz, _MHZ)),
        (C.GPU_POWER_WATTS, s.power_w),
        (C.GPU_POWER_LIMIT_WATTS, s.power_limit_w),
        (C.GPU_TEMPERATURE_CELSIUS, s.temperature_c),
        (C.GPU_PCIE_LINK_GENERATION, s.pcie_gen),
        (C.GPU_PCIE_LINK_GENERATION_MAX, s.pcie_gen_max),
        (C.GPU_PCIE_LINK_WIDTH, s.pcie_width),
        (C.GPU_PCIE_LINK_WIDTH_MAX, s.pcie_width_max),
    ]


class RenderingCollector(Collector):
    """Custom collector: calls ``families`` once per scrape and yields what it renders. The node
    agent renders its :class:`ExportState`, ``auditor serve`` its published evaluation."""

    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families()

    def describe(self) -> list[Metric]:
        """Nothing up front: the families depend on the state, and registering must not call it."""
        return []


def registry_for(families: Callable[[], list[Metric]]) -> CollectorRegistry:
    """A fresh registry holding only one rendering collector (no process/platform collectors:
    the auditor reports on training ranks and jobs, not on itself)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RenderingCollector(families))
    return registry


def make_registry(state_fn: StateFn) -> CollectorRegistry:
    """The node endpoint's registry: ``state_fn``'s state rendered at every scrape."""
    return registry_for(lambda: render(state_fn()))


def serve(
    registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0
) -> tuple[WSGIServer, int]:
    """Serve ``registry`` over HTTP on a daemon thread; returns the server and the bound port.

    Binds to loopback unless told otherwise (DESIGN.md); ``port=0`` picks a free port.
    """
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)


def stop(server: WSGIServer) -> None:
    """Stop serving and release the socket (the serving thread exits with serve_forever)."""
    server.shutdown()
    server.server_close()
