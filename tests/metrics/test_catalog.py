"""The catalog is the contract with dashboards and alert rules: names, units and labels."""

from __future__ import annotations

import re

import pytest

from auditor.analysis.findings import SEVERITIES
from auditor.analysis.rules import KINDS
from auditor.metrics import catalog as C
from auditor.metrics.catalog import CATALOG, MetricSpec
from auditor.samples import PHASES
from auditor.telemetry.nvml import THROTTLE_REASONS

# The reason names the NVML source decodes: the catalog's bounded list must cover them exactly.
THROTTLE_NAMES = tuple(name for name, _, _ in THROTTLE_REASONS)

NAMES = [s.name for s in CATALOG]


def test_names_are_unique_and_indexed() -> None:
    assert len(NAMES) == len(set(NAMES))
    assert set(C.BY_NAME) == set(NAMES)
    assert all(C.BY_NAME[s.name] is s for s in CATALOG)


def test_spec_lookup_names_the_missing_metric() -> None:
    assert C.spec("auditor_rank_up") is C.RANK_UP
    with pytest.raises(KeyError, match="auditor_nope"):
        C.spec("auditor_nope")


def test_required_metrics_are_present() -> None:
    required = {
        "auditor_rank_info",
        "auditor_rank_steps_total",
        "auditor_rank_step_seconds_total",
        "auditor_rank_phase_seconds_total",
        "auditor_rank_samples_total",
        "auditor_rank_micro_batches_total",
        "auditor_rank_last_step_seconds",
        "auditor_rank_batch_size",
        "auditor_rank_last_step_timestamp_seconds",
        "auditor_rank_memory_bytes",
        "auditor_rank_cpu_cores",
        "auditor_rank_dataloader_workers",
        "auditor_rank_dataloader_config_workers",
        "auditor_rank_up",
        "auditor_node_cpu_cores",
        "auditor_node_cpu_busy_cores",
        "auditor_node_load1",
        "auditor_finding",
        "auditor_finding_predicted_speedup",
        "auditor_gpu_utilization_ratio",
        "auditor_gpu_memory_utilization_ratio",
        "auditor_gpu_memory_used_bytes",
        "auditor_gpu_memory_total_bytes",
        "auditor_gpu_sm_clock_hertz",
        "auditor_gpu_sm_clock_max_hertz",
        "auditor_gpu_memory_clock_hertz",
        "auditor_gpu_memory_clock_max_hertz",
        "auditor_gpu_throttle_active",
        "auditor_gpu_power_watts",
        "auditor_gpu_power_limit_watts",
        "auditor_gpu_temperature_celsius",
        "auditor_gpu_pcie_link_generation",
        "auditor_gpu_pcie_link_generation_max",
        "auditor_gpu_pcie_link_width",
        "auditor_gpu_pcie_link_width_max",
        "auditor_gpu_processes",
        "auditor_gpu_up",
        "auditor_gpu_last_sample_timestamp_seconds",
        "auditor_gpu_lost",
        "auditor_rank_flops_per_step",
        "auditor_rank_flops_per_second",
        "auditor_rank_mfu_ratio",
        "auditor_job_mfu_ratio",
        "auditor_gpu_sm_active_ratio",
        "auditor_gpu_tensor_pipe_active_ratio",
    }
    assert required <= set(NAMES)


@pytest.mark.parametrize("metric", CATALOG, ids=NAMES)
def test_name_shape(metric: MetricSpec) -> None:
    assert metric.name.startswith(C.PREFIX)
    assert re.fullmatch(r"[a-z][a-z0-9_]*[a-z0-9]", metric.name), "snake_case"
    assert "__" not in metric.name
    assert metric.type in ("gauge", "counter", "info")
    assert metric.help.strip() and "\n" not in metric.help


@pytest.mark.parametrize("metric", CATALOG, ids=NAMES)
def test_counters_and_only_counters_end_in_total(metric: MetricSpec) -> None:
    assert metric.name.endswith("_total") == (metric.type == "counter")


@pytest.mark.parametrize("metric", CATALOG, ids=NAMES)
def test_unit_matches_name_suffix(metric: MetricSpec) -> None:
    assert metric.unit in C.UNIT_SUFFIX
    base = metric.name.removesuffix("_total")
    suffix = C.UNIT_SUFFIX[metric.unit]
    if suffix:
        assert base.endswith(suffix), f"unit {metric.unit} needs suffix {suffix}"
    # Conversely: a base-unit suffix in the name declares that unit.
    for unit, unit_suffix in C.UNIT_SUFFIX.items():
        if unit_suffix and base.endswith(unit_suffix):
            assert metric.unit == unit


@pytest.mark.parametrize(
    "bad",
    [
        "_ms",
        "_milliseconds",
        "_us",
        "_minutes",
        "_hours",
        "_percent",
        "_pct",
        "_kb",
        "_mb",
        "_gb",
        "_kib",
        "_mib",
        "_gib",
        "_bits",
        "_mhz",
        "_megahertz",
        "_milliwatts",
        "_mw",
        "_fahrenheit",
    ],
)
def test_no_non_base_units(bad: str) -> None:
    for name in NAMES:
        assert bad + "_" not in name + "_", name


@pytest.mark.parametrize("metric", CATALOG, ids=NAMES)
def test_labels_from_vocabulary(metric: MetricSpec) -> None:
    assert len(metric.labels) == len(set(metric.labels))
    assert set(metric.labels) <= C.LABELS
    assert "le" not in metric.labels and "quantile" not in metric.labels


@pytest.mark.parametrize("metric", CATALOG, ids=NAMES)
def test_scope_labels(metric: MetricSpec) -> None:
    if metric.name.startswith("auditor_rank_"):
        assert metric.labels[:4] == ("auditor_job", "node", "rank", "local_rank")
    elif metric.name.startswith("auditor_node_"):
        assert metric.labels[:2] == ("auditor_job", "node")
    elif metric.name.startswith("auditor_gpu_"):
        assert metric.labels[:6] == ("node", "gpu", "uuid", "model", "auditor_job", "rank")
    elif metric.name.startswith("auditor_job_"):
        assert metric.labels == ("auditor_job",)
    elif metric.name.startswith("auditor_serve_"):
        assert metric.labels == ()  # the service's own health: one series per service
    else:
        assert metric.name.startswith("auditor_finding")
        assert {"auditor_job", "kind", "rank"} <= set(metric.labels)


@pytest.mark.parametrize(
    ("label", "values"),
    [
        ("phase", PHASES),
        ("memory", ("rss", "allocated", "reserved", "peak")),
        ("process", ("main", "workers")),
        ("kind", KINDS),
        ("severity", SEVERITIES),
        ("reason", (*THROTTLE_NAMES, "other")),
    ],
)
def test_bounded_label_values(label: str, values: tuple[str, ...]) -> None:
    assert C.LABEL_VALUES[label] == values


def test_series_per_rank_within_budget() -> None:
    assert C.series_per_rank() <= C.RANK_SERIES_BUDGET == 36
    # The budget covers every auditor_rank_* metric and nothing else.
    assert {s.name for s in C.rank_specs()} == {n for n in NAMES if n.startswith("auditor_rank_")}


def test_series_per_gpu_within_budget() -> None:
    assert C.series_per_gpu() <= C.GPU_SERIES_BUDGET == 40
    # The owner series is the ranks' word, not a monitor's, and the DCGM profiling ratios are
    # recorded from dcgm-exporter: both outside the GPU budget.
    outside = {"auditor_gpu_owner_info", *(s.name for s in C.DCGM_ONLY)}
    assert {s.name for s in C.gpu_specs()} == {
        n for n in NAMES if n.startswith("auditor_gpu_") and n not in outside
    }
    # Only throttle_active has a bounded label; every other GPU metric is one series per GPU.
    assert C.series_per_gpu() == len(C.gpu_specs()) - 1 + len(C.THROTTLE_REASONS)


@pytest.mark.parametrize("metric", C.gpu_specs(), ids=[s.name for s in C.gpu_specs()])
def test_gpu_metrics_are_gauges(metric: MetricSpec) -> None:
    assert metric.type == "gauge"


def test_rank_info_shape() -> None:
    assert C.RANK_INFO.type == "gauge"
    assert C.RANK_INFO.labels == (
        "auditor_job",
        "node",
        "rank",
        "local_rank",
        "device",
        "parallel_mode",
        "world_size",
    )


def test_spec_is_frozen() -> None:
    with pytest.raises(AttributeError):
        C.RANK_UP.name = "x"  # type: ignore[misc]
