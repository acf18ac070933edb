"""The exporter renders real-shaped state into exactly the series the catalog promises."""

from __future__ import annotations

import inspect
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import InfoMetricFamily
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from auditor.analysis.findings import Finding
from auditor.analysis.mfu import RankFlops
from auditor.metrics import catalog as C
from auditor.metrics import exporter
from auditor.metrics.catalog import MetricSpec
from auditor.metrics.exporter import family_for, make_registry, serve, stop
from auditor.metrics.state import ExportState, RankTotals
from auditor.samples import (
    PHASES,
    LoaderConfig,
    MemoryBudget,
    NodeCpu,
    ProcessCpu,
    RankInfo,
    StepSample,
)
from tests.helpers.tools import require_tool

Key = tuple[str, tuple[tuple[str, str], ...]]

JOB = "j1"
NODE = "node-a"


def _loader(num_workers: int, batch_size: int) -> LoaderConfig:
    return LoaderConfig(
        num_workers=num_workers,
        pin_memory=num_workers > 0,
        prefetch_factor=2 if num_workers else None,
        persistent_workers=False,
        batch_size=batch_size,
        drop_last=False,
        sampler="DistributedSampler",
        dataset="ToyDataset",
    )


RANK0 = RankInfo(
    rank=0,
    world_size=2,
    local_rank=0,
    host=NODE,
    pid=100,
    device="cuda:0",
    parallel_mode="ddp",
    devices=(0,),
    device_uuids=("GPU-aaa",),
    loader=_loader(4, 32),
    job=JOB,
)
# A CPU rank: no device memory, its collective wait could not be measured.
RANK1 = RankInfo(
    rank=1,
    world_size=2,
    local_rank=1,
    host=NODE,
    pid=101,
    device="cpu",
    parallel_mode="ddp",
    loader=_loader(0, 16),
    job=JOB,
)

# Durations are binary fractions so sums are exact.
STEPS0 = (
    StepSample(
        rank=0,
        step=1,
        time=1000.0,
        step_s=0.5,
        data_wait_s=0.0625,
        h2d_s=0.03125,
        forward_s=0.125,
        backward_s=0.25,
        optimizer_s=0.03125,
        collective_wait_s=0.125,
        batch_size=32,
        rss_bytes=1_000_000,
        mem_allocated_bytes=2_000,
        mem_reserved_bytes=4_000,
        mem_peak_bytes=3_000,
    ),
    StepSample(
        rank=0,
        step=2,
        time=1000.5,
        step_s=0.75,
        data_wait_s=0.25,
        h2d_s=0.03125,
        forward_s=0.125,
        backward_s=0.25,
        optimizer_s=0.0625,
        collective_wait_s=0.0625,
        batch_size=32,
        rss_bytes=1_100_000,
        mem_allocated_bytes=2_500,
        mem_reserved_bytes=4_096,
        mem_peak_bytes=3_500,
        micro_batches=4,  # gradient accumulation: 4 DataLoader batches of 8
    ),
)
STEPS1 = (
    StepSample(
        rank=1,
        step=1,
        time=1000.25,
        step_s=0.5,
        data_wait_s=0.125,
        forward_s=0.125,
        backward_s=0.25,
        collective_wait_s=None,
        batch_size=16,
        rss_bytes=500_000,
    ),
    StepSample(
        rank=1,
        step=2,
        time=1000.75,
        step_s=0.5,
        data_wait_s=0.125,
        forward_s=0.125,
        backward_s=0.25,
        collective_wait_s=None,
        batch_size=24,
        rss_bytes=500_000,
    ),
)


def _totals(steps: tuple[StepSample, ...]) -> RankTotals:
    return RankTotals().plus(steps)


def make_state() -> ExportState:
    return ExportState(
        job=JOB,
        node=NODE,
        infos={0: RANK0, 1: RANK1},
        totals={0: _totals(STEPS0), 1: _totals(STEPS1)},
        cpu={
            0: ProcessCpu(
                rank=0,
                time=1000.5,
                pid=100,
                main_cpu=0.75,
                worker_cpu=(0.5, 0.25, 0.25, 0.5),
                rss_bytes=1_200_000,
            ),
            1: ProcessCpu(rank=1, time=1000.5, pid=101, main_cpu=1.0, rss_bytes=600_000),
        },
        node_cpu=NodeCpu(host=NODE, time=1001.0, cores=16.0, busy_cores=3.5, load1=2.25),
        ended={1},
        # Rank 0 measured its budget; rank 1 sent none (no series, not zeros).
        memory={
            0: MemoryBudget(
                rank=0,
                time=1000.0,
                step=1,
                param_bytes=1_000,
                grad_bytes=1_000,
                optimizer_bytes=2_024,
                buffer_bytes=16,
                other_module_bytes=0,
                activation_bytes=3_200,
                activation_batch=8,
            )
        },
        findings=[
            Finding(
                "compute_straggler",
                "critical",
                (1,),
                predicted_speedup=1.5,
            ),
            Finding("utilization_imbalance", "info", ()),
        ],
        # Rank 0 counted its FLOPs on a GPU the table knows; rank 1 (ended: no present pace)
        # keeps its FLOPs per step only.
        flops={r: _work(r) for r in (0, 1)},
        job_mfu=0.25,
    )


def _work(rank: int) -> RankFlops:
    return RankFlops(
        rank=rank,
        flops_per_step=6e12,
        flops_per_s=8e12,
        mfu=0.5,
        peak_flops_per_s=16e12,
        dtype="bf16",
        device_name="NVIDIA H100 80GB HBM3",
        counted_step=10,
        count_cost_s=0.02,
    )


def render_text(state: ExportState) -> str:
    return generate_latest(make_registry(lambda: state)).decode()


def parse(text: str) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def key(name: str, **labels: str) -> Key:
    return (name, tuple(sorted(labels.items())))


def r(rank: int, **extra: str) -> dict[str, str]:
    return {"auditor_job": JOB, "node": NODE, "rank": str(rank), "local_rank": str(rank), **extra}


EXPECTED: list[tuple[str, dict[str, str], float]] = [
    ("auditor_rank_info", r(0, device="cuda:0", parallel_mode="ddp", world_size="2"), 1),
    ("auditor_rank_info", r(1, device="cpu", parallel_mode="ddp", world_size="2"), 1),
    ("auditor_rank_up", r(0), 1),
    ("auditor_rank_up", r(1), 0),
    # The GPU rank 0 reported using (its CUDA UUID), for a GPU source that is not the monitors.
    ("auditor_gpu_owner_info", r(0, gpu="0", uuid="GPU-aaa", model=""), 1),
    ("auditor_rank_steps_total", r(0), 2),
    ("auditor_rank_steps_total", r(1), 2),
    ("auditor_rank_step_seconds_total", r(0), 1.25),
    ("auditor_rank_step_seconds_total", r(1), 1.0),
    ("auditor_rank_phase_seconds_total", r(0, phase="data_wait"), 0.3125),
    ("auditor_rank_phase_seconds_total", r(0, phase="h2d"), 0.0625),
    ("auditor_rank_phase_seconds_total", r(0, phase="forward"), 0.25),
    ("auditor_rank_phase_seconds_total", r(0, phase="backward"), 0.5),
    ("auditor_rank_phase_seconds_total", r(0, phase="optimizer"), 0.09375),
    ("auditor_rank_phase_seconds_total", r(0, phase="collective_wait"), 0.1875),
    ("auditor_rank_phase_seconds_total", r(1, phase="data_wait"), 0.25),
    ("auditor_rank_phase_seconds_total", r(1, phase="h2d"), 0.0),
    ("auditor_rank_phase_seconds_total", r(1, phase="forward"), 0.25),
    ("auditor_rank_phase_seconds_total", r(1, phase="backward"), 0.5),
    ("auditor_rank_phase_seconds_total", r(1, phase="optimizer"), 0.0),
    ("auditor_rank_samples_total", r(0), 64),
    ("auditor_rank_samples_total", r(1), 40),
    ("auditor_rank_micro_batches_total", r(0), 5),
    ("auditor_rank_micro_batches_total", r(1), 2),
    ("auditor_rank_last_step_seconds", r(0), 0.75),
    ("auditor_rank_last_step_seconds", r(1), 0.5),
    ("auditor_rank_last_step_timestamp_seconds", r(0), 1000.5),
    ("auditor_rank_last_step_timestamp_seconds", r(1), 1000.75),
    ("auditor_rank_batch_size", r(0), 32),
    ("auditor_rank_batch_size", r(1), 24),
    ("auditor_rank_memory_bytes", r(0, memory="rss"), 1_100_000),
    ("auditor_rank_memory_bytes", r(0, memory="allocated"), 2_500),
    ("auditor_rank_memory_bytes", r(0, memory="reserved"), 4_096),
    ("auditor_rank_memory_bytes", r(0, memory="peak"), 3_500),
    ("auditor_rank_memory_budget_bytes", r(0, part="parameters"), 1_000),
    ("auditor_rank_memory_budget_bytes", r(0, part="gradients"), 1_000),
    ("auditor_rank_memory_budget_bytes", r(0, part="optimizer_state"), 2_024),
    ("auditor_rank_memory_budget_bytes", r(0, part="buffers"), 16),
    ("auditor_rank_memory_budget_bytes", r(0, part="other_modules"), 0),
    ("auditor_rank_memory_budget_bytes", r(0, part="activations"), 3_200),
    ("auditor_rank_memory_bytes", r(1, memory="rss"), 500_000),
    ("auditor_rank_cpu_cores", r(0, process="main"), 0.75),
    ("auditor_rank_cpu_cores", r(0, process="workers"), 1.5),
    ("auditor_rank_cpu_cores", r(1, process="main"), 1.0),
    ("auditor_rank_cpu_cores", r(1, process="workers"), 0.0),
    ("auditor_rank_dataloader_workers", r(0), 4),
    ("auditor_rank_dataloader_workers", r(1), 0),
    ("auditor_rank_dataloader_config_workers", r(0), 4),
    ("auditor_rank_dataloader_config_workers", r(1), 0),
    (
        "auditor_rank_dataloader_info",
        r(0, pin_memory="true", persistent_workers="false", prefetch_factor="2", batch_size="32"),
        1,
    ),
    (
        "auditor_rank_dataloader_info",
        r(1, pin_memory="false", persistent_workers="false", prefetch_factor="", batch_size="16"),
        1,
    ),
    ("auditor_rank_flops_per_step", r(0), 6e12),
    ("auditor_rank_flops_per_second", r(0), 8e12),
    ("auditor_rank_mfu_ratio", r(0), 0.5),
    ("auditor_rank_flops_per_step", r(1), 6e12),
    ("auditor_job_mfu_ratio", {"auditor_job": JOB}, 0.25),
    ("auditor_node_cpu_cores", {"auditor_job": JOB, "node": NODE}, 16.0),
    ("auditor_node_cpu_busy_cores", {"auditor_job": JOB, "node": NODE}, 3.5),
    ("auditor_node_load1", {"auditor_job": JOB, "node": NODE}, 2.25),
    (
        "auditor_finding",
        {
            "auditor_job": JOB,
            "kind": "compute_straggler",
            "rank": "1",
            "node": NODE,
            "severity": "critical",
        },
        1,
    ),
    (
        "auditor_finding",
        {
            "auditor_job": JOB,
            "kind": "utilization_imbalance",
            "rank": "",
            "node": "",
            "severity": "info",
        },
        1,
    ),
    (
        "auditor_finding_predicted_speedup",
        {"auditor_job": JOB, "kind": "compute_straggler", "rank": "1"},
        1.5,
    ),
]


@pytest.fixture(scope="module")
def text() -> str:
    return render_text(make_state())


@pytest.fixture(scope="module")
def series(text: str) -> dict[Key, float]:
    return parse(text)


@pytest.mark.parametrize(
    ("name", "labels", "value"), EXPECTED, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(EXPECTED)]
)
def test_exact_values(
    series: dict[Key, float], name: str, labels: dict[str, str], value: float
) -> None:
    assert series[key(name, **labels)] == value


def test_nothing_beyond_expected(series: dict[Key, float]) -> None:
    """Every emitted series is in the table: unmeasured values produce no series at all."""
    assert set(series) == {key(n, **labels) for n, labels, _ in EXPECTED}


@pytest.mark.parametrize("memory", ["allocated", "reserved", "peak"])
def test_missing_memory_is_absent_not_zero(series: dict[Key, float], memory: str) -> None:
    assert key("auditor_rank_memory_bytes", **r(1, memory=memory)) not in series
    assert key("auditor_rank_memory_bytes", **r(0, memory=memory)) in series


def test_unmeasured_collective_wait_is_absent(series: dict[Key, float]) -> None:
    assert key("auditor_rank_phase_seconds_total", **r(1, phase="collective_wait")) not in series


def test_every_family_is_in_the_catalog(text: str) -> None:
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        spec = C.BY_NAME[family.name + "_total" if family.type == "counter" else family.name]
        assert family.type == spec.type
        assert family.documentation == spec.help
        for s in family.samples:
            assert sorted(s.labels) == sorted(spec.labels)  # exposition sorts labels


def test_series_per_rank_within_budget(series: dict[Key, float]) -> None:
    per_rank: dict[str, int] = {}
    for name, labels in series:
        if name.startswith("auditor_rank_"):
            rank = dict(labels)["rank"]
            per_rank[rank] = per_rank.get(rank, 0) + 1
    assert per_rank and max(per_rank.values()) <= C.RANK_SERIES_BUDGET
    # Rank 0 has every value measured: it reaches the catalog's bound exactly.
    assert per_rank["0"] == C.series_per_rank()


def test_promtool_finds_no_problems(text: str) -> None:
    promtool = require_tool("promtool")
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_openmetrics_rendering_parses() -> None:
    """Prometheus negotiates OpenMetrics: units and counter names must hold there too."""
    text = generate_openmetrics(make_registry(make_state)).decode()
    families = {f.name: f for f in parse_openmetrics(text)}
    assert families["auditor_rank_step_seconds"].unit == "seconds"
    assert families["auditor_rank_memory_bytes"].unit == "bytes"
    assert families["auditor_rank_batch_size"].unit == ""  # "samples" is not in the name
    assert families["auditor_rank_steps"].type == "counter"


def test_unmeasured_phase_from_rank_info_is_absent() -> None:
    """A phase the probe could not attach to reads 0.0 in samples; it must not be exported."""
    info = RankInfo(rank=0, world_size=1, host=NODE, unmeasured=("h2d", "collective_wait"))
    step = StepSample(rank=0, step=1, time=1.0, step_s=0.5, forward_s=0.25, collective_wait_s=0.0)
    state = ExportState(job=JOB, node=NODE, infos={0: info}, totals={0: _totals((step,))})
    phases = {
        dict(labels)["phase"]
        for name, labels in parse(render_text(state))
        if name == "auditor_rank_phase_seconds_total"
    }
    assert phases == set(PHASES) - {"h2d", "collective_wait"}


def test_rss_falls_back_to_process_sample() -> None:
    info = RankInfo(rank=0, world_size=1, host=NODE)
    step = StepSample(rank=0, step=1, time=1.0, step_s=0.5)
    proc = ProcessCpu(rank=0, time=1.0, pid=1, main_cpu=None, rss_bytes=777)
    state = ExportState(
        job=JOB, node=NODE, infos={0: info}, totals={0: _totals((step,))}, cpu={0: proc}
    )
    series = parse(render_text(state))
    assert series[key("auditor_rank_memory_bytes", **r(0, memory="rss"))] == 777
    assert key("auditor_rank_cpu_cores", **r(0, process="main")) not in series
    assert key("auditor_rank_samples_total", **r(0)) not in series  # no batch size known
    assert key("auditor_rank_batch_size", **r(0)) not in series


def test_rank_without_info_is_not_exported() -> None:
    """Series appear once the rank introduced itself, so their label sets never change."""
    state = ExportState(job=JOB, node=NODE, totals={0: _totals(STEPS0)})
    assert parse(render_text(state)) == {}


def test_empty_state_renders_nothing() -> None:
    assert render_text(ExportState(job=JOB, node=NODE)) == ""


def test_node_label_defaults_to_exporter_node() -> None:
    info = RankInfo(rank=3, world_size=4, local_rank=1)  # host unknown
    series = parse(render_text(ExportState(job=JOB, node="fallback", infos={3: info})))
    labels = {"auditor_job": JOB, "node": "fallback", "rank": "3", "local_rank": "1"}
    assert series[key("auditor_rank_up", **labels)] == 1


def test_duplicate_findings_merge() -> None:
    findings = [
        Finding("data_starvation", "warning", (0, 1), predicted_speedup=1.2),
        Finding("data_starvation", "warning", (1,), predicted_speedup=1.4),
    ]
    state = ExportState(job=JOB, node=NODE, infos={0: RANK0, 1: RANK1}, findings=findings)
    series = parse(render_text(state))
    speedup = {
        dict(labels)["rank"]: v
        for (name, labels), v in series.items()
        if name == "auditor_finding_predicted_speedup"
    }
    assert speedup == {"0": 1.2, "1": 1.4}
    blamed = [labels for name, labels in series if name == "auditor_finding"]
    assert len(blamed) == 2


def test_state_fn_is_called_per_scrape() -> None:
    state = make_state()
    registry = make_registry(lambda: state)
    before = parse(generate_latest(registry).decode())
    state.totals[0] = state.totals[0].plus(
        [StepSample(rank=0, step=3, time=1001.0, step_s=0.25, batch_size=8, collective_wait_s=None)]
    )
    after = parse(generate_latest(registry).decode())
    steps = key("auditor_rank_steps_total", **r(0))
    assert (before[steps], after[steps]) == (2, 3)
    assert after[key("auditor_rank_last_step_seconds", **r(0))] == 0.25
    assert after[key("auditor_rank_samples_total", **r(0))] == 72
    # collective_wait None added nothing.
    cw = key("auditor_rank_phase_seconds_total", **r(0, phase="collective_wait"))
    assert after[cw] == before[cw] == 0.1875


def test_exporter_spells_no_metric_name() -> None:
    source = Path(inspect.getfile(exporter)).read_text()
    assert not re.search(r"[\"']auditor_", source)


def test_info_type_family() -> None:
    metric = MetricSpec("auditor_build_info", "info", "", "Build.", ("auditor_job",))
    family = family_for(metric)
    assert isinstance(family, InfoMetricFamily)
    family.add_metric([JOB], {})
    assert [s.name for s in family.samples] == ["auditor_build_info"]


class TestRankTotals:
    def test_collective_wait_none_adds_nothing(self) -> None:
        totals = _totals(STEPS1)
        assert "collective_wait" not in totals.phase_seconds
        assert totals.phase_seconds["data_wait"] == 0.25

    def test_samples_unknown_until_a_batch_size(self) -> None:
        totals = RankTotals().plus([StepSample(rank=0, step=1, time=1.0, step_s=0.1)])
        assert totals.samples is None
        more = totals.plus([StepSample(rank=0, step=2, time=2.0, step_s=0.1, batch_size=8)])
        assert more.samples == 8
        assert totals.samples is None and totals.steps == 1  # a new object: scrapes see either

    def test_last_is_the_newest_step(self) -> None:
        totals = _totals((STEPS0[1], STEPS0[0]))  # out of order
        assert totals.last == STEPS0[1]
        assert totals.steps == 2 and totals.step_seconds == 1.25


def test_serve_binds_loopback_on_ephemeral_port() -> None:
    assert inspect.signature(serve).parameters["host"].default == "127.0.0.1"
    server, port = serve(make_registry(make_state))
    try:
        assert port > 0
        assert server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
            body = resp.read().decode()
        assert parse(body)[key("auditor_rank_steps_total", **r(0))] == 2
    finally:
        stop(server)


def test_a_fleet_agent_exports_the_ranks_of_several_jobs() -> None:
    """Rank 0 of two jobs on one node: filed under two keys, labelled with their own job and
    rank; the node's CPU carries no job (it serves every job there)."""
    from auditor.metrics.state import apply_batch
    from auditor.samples import Batch

    state = ExportState(job="", node=NODE)
    infos = (
        RankInfo(rank=0, world_size=2, host=NODE, pid=11, job="train", key=0),
        RankInfo(rank=0, world_size=1, host=NODE, pid=12, job="eval", key=1),
    )
    batch = Batch(
        infos=infos,
        steps=(
            StepSample(rank=0, step=0, time=1.0, step_s=0.5),
            StepSample(rank=1, step=0, time=1.0, step_s=0.25),
            StepSample(rank=1, step=1, time=1.5, step_s=0.25),
        ),
        nodes=(NodeCpu(host=NODE, time=1.0, cores=8.0, busy_cores=2.0, load1=1.0),),
    )
    series = parse(render_text(apply_batch(state, batch)))
    base = {"node": NODE, "rank": "0", "local_rank": "0"}
    assert series[key("auditor_rank_steps_total", auditor_job="train", **base)] == 1
    assert series[key("auditor_rank_steps_total", auditor_job="eval", **base)] == 2
    assert series[key("auditor_rank_step_seconds_total", auditor_job="eval", **base)] == 0.5
    assert series[key("auditor_node_cpu_cores", auditor_job="", node=NODE)] == 8
    assert not [k for k in series if dict(k[1]).get("rank") == "1"]
