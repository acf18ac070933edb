"""GPU series: every DeviceSample field in base units, owners as labels, gaps never read as idle."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families

from auditor.metrics import catalog as C
from auditor.metrics.exporter import make_registry
from auditor.metrics.state import ExportState, GpuStatus, gpu_owner
from auditor.samples import DeviceSample, GpuProcess, RankInfo
from tests.helpers.tools import require_tool

Key = tuple[str, tuple[tuple[str, str], ...]]

JOB = "train"
NODE = "node-a"
UUID0 = "GPU-0000"
UUID1 = "GPU-1111"
MODEL = "NVIDIA H100 80GB HBM3"

FULL = DeviceSample(
    node=NODE,
    index=0,
    uuid=UUID0,
    time=1700000000.5,
    model=MODEL,
    gpu_util=0.75,
    mem_util=0.25,
    mem_used_bytes=40 * 2**30,
    mem_total_bytes=80 * 2**30,
    sm_clock_mhz=1755.0,
    sm_clock_max_mhz=1980.0,
    mem_clock_mhz=2619.0,
    mem_clock_max_mhz=2619.0,
    throttle_reasons=("sw_power_cap",),
    power_w=512.5,
    power_limit_w=700.0,
    temperature_c=61.0,
    pcie_gen=5,
    pcie_gen_max=5,
    pcie_width=16,
    pcie_width_max=16,
    processes=(GpuProcess(pid=4242, used_bytes=2**30), GpuProcess(pid=4243)),
)
BARE = DeviceSample(node=NODE, index=1, uuid=UUID1, time=1700000000.5, model=MODEL)

RANK0 = RankInfo(rank=0, world_size=2, host=NODE, pid=4242, device="cuda:0", job=JOB)


def status(sample: DeviceSample | None, *, up: bool = True, index: int = 0) -> GpuStatus:
    uuid = sample.uuid if sample is not None else UUID0
    return GpuStatus(index=index, uuid=uuid, model=MODEL, sample=sample, up=up)


def render(gpus: list[GpuStatus], infos: dict[int, RankInfo] | None = None, **kw: object) -> str:
    state = ExportState(job=JOB, node=NODE, infos=infos or {}, gpus={g.uuid: g for g in gpus}, **kw)  # type: ignore[arg-type]
    return generate_latest(make_registry(lambda: state)).decode()


def parse(text: str) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def gpu_labels(index: int = 0, uuid: str = UUID0, *, job: str = "", rank: str = "") -> dict:
    return {
        "node": NODE,
        "gpu": str(index),
        "uuid": uuid,
        "model": MODEL,
        "auditor_job": job,
        "rank": rank,
    }


def key(name: str, **labels: str) -> Key:
    return (name, tuple(sorted(labels.items())))


def names(series: dict[Key, float]) -> set[str]:
    return {n for n, _ in series}


MHZ = 1e6
EXPECTED_FULL: dict[str, float] = {
    "auditor_gpu_up": 1,
    "auditor_gpu_last_sample_timestamp_seconds": 1700000000.5,
    "auditor_gpu_lost": 0,
    "auditor_gpu_utilization_ratio": 0.75,
    "auditor_gpu_memory_utilization_ratio": 0.25,
    "auditor_gpu_memory_used_bytes": 40 * 2**30,
    "auditor_gpu_memory_total_bytes": 80 * 2**30,
    "auditor_gpu_sm_clock_hertz": 1755 * MHZ,
    "auditor_gpu_sm_clock_max_hertz": 1980 * MHZ,
    "auditor_gpu_memory_clock_hertz": 2619 * MHZ,
    "auditor_gpu_memory_clock_max_hertz": 2619 * MHZ,
    "auditor_gpu_power_watts": 512.5,
    "auditor_gpu_power_limit_watts": 700.0,
    "auditor_gpu_temperature_celsius": 61.0,
    "auditor_gpu_pcie_link_generation": 5,
    "auditor_gpu_pcie_link_generation_max": 5,
    "auditor_gpu_pcie_link_width": 16,
    "auditor_gpu_pcie_link_width_max": 16,
    "auditor_gpu_processes": 2,
}


@pytest.fixture(scope="module")
def full_text() -> str:
    return render([status(FULL)])


@pytest.fixture(scope="module")
def full(full_text: str) -> dict[Key, float]:
    return parse(full_text)


@pytest.mark.parametrize(("name", "value"), sorted(EXPECTED_FULL.items()))
def test_full_sample_values_in_base_units(full: dict[Key, float], name: str, value: float) -> None:
    assert full[key(name, **gpu_labels())] == value


def test_throttle_reasons_one_series_per_reason(full: dict[Key, float]) -> None:
    active = {
        dict(labels)["reason"]: v
        for (name, labels), v in full.items()
        if name == "auditor_gpu_throttle_active"
    }
    assert set(active) == set(C.THROTTLE_REASONS)
    assert {r for r, v in active.items() if v == 1} == {"sw_power_cap"}


def test_full_gpu_reaches_the_catalog_bound_and_stays_within_budget(
    full: dict[Key, float],
) -> None:
    assert set(full) == {
        *(key(n, **gpu_labels()) for n in EXPECTED_FULL),
        *(key("auditor_gpu_throttle_active", **gpu_labels(), reason=r) for r in C.THROTTLE_REASONS),
    }
    assert len(full) == C.series_per_gpu() <= C.GPU_SERIES_BUDGET


def test_every_gpu_family_matches_the_catalog(full_text: str) -> None:
    families = list(text_string_to_metric_families(full_text))
    # A fully read GPU exports every GPU family of the catalog.
    assert {f.name for f in families} == {s.name for s in C.gpu_specs()}
    for family in families:
        assert family.samples, family.name
        spec = C.BY_NAME[family.name]
        assert family.type == spec.type and family.documentation == spec.help
        for s in family.samples:
            assert sorted(s.labels) == sorted(spec.labels)


def test_missing_values_are_absent_not_zero() -> None:
    series = parse(render([status(BARE, index=1)]))
    labels = gpu_labels(1, UUID1)
    assert series == {
        key("auditor_gpu_up", **labels): 1,
        key("auditor_gpu_last_sample_timestamp_seconds", **labels): 1700000000.5,
        key("auditor_gpu_lost", **labels): 0,
        key("auditor_gpu_processes", **labels): 0,
    }


def test_down_monitor_keeps_up_0_and_the_last_timestamp_only() -> None:
    series = parse(render([status(FULL, up=False)]))
    assert series == {
        key("auditor_gpu_up", **gpu_labels()): 0,
        key("auditor_gpu_last_sample_timestamp_seconds", **gpu_labels()): 1700000000.5,
    }


def test_gpu_without_a_sample_yet_is_down_without_timestamp() -> None:
    series = parse(render([status(None, up=False)]))
    assert series == {key("auditor_gpu_up", **gpu_labels()): 0}


def test_lost_gpu_exports_lost_and_nothing_else() -> None:
    lost = DeviceSample(node=NODE, index=0, uuid=UUID0, time=5.0, model=MODEL, lost=True)
    series = parse(render([status(lost)]))
    assert series == {
        key("auditor_gpu_up", **gpu_labels()): 1,
        key("auditor_gpu_last_sample_timestamp_seconds", **gpu_labels()): 5.0,
        key("auditor_gpu_lost", **gpu_labels()): 1,
    }


def test_unknown_throttle_reason_reads_as_other() -> None:
    sample = DeviceSample(
        node=NODE, index=0, uuid=UUID0, time=1.0, throttle_reasons=("future_reason", "gpu_idle")
    )
    series = parse(render([status(sample)]))
    on = {
        dict(labels)["reason"]
        for (name, labels), v in series.items()
        if name == "auditor_gpu_throttle_active" and v == 1
    }
    assert on == {"other", "gpu_idle"}


def test_no_throttle_series_when_reasons_unknown() -> None:
    series = parse(render([status(BARE, index=1)]))
    assert "auditor_gpu_throttle_active" not in names(series)


def test_owner_by_device_uuid_sets_job_and_rank() -> None:
    rank = RankInfo(rank=3, world_size=4, host=NODE, pid=1, device_uuids=(UUID1,), job="other-job")
    series = parse(render([status(FULL), status(BARE, index=1)], {3: rank}))
    assert series[key("auditor_gpu_up", **gpu_labels(1, UUID1, job="other-job", rank="3"))] == 1
    assert series[key("auditor_gpu_up", **gpu_labels())] == 1  # GPU 0: nobody's


def test_owner_by_pid_for_a_rank_that_named_no_gpu() -> None:
    series = parse(render([status(FULL)], {0: RANK0}))
    assert series[key("auditor_gpu_up", **gpu_labels(job=JOB, rank="0"))] == 1


def test_pid_on_a_gpu_does_not_make_a_rank_with_other_gpus_its_owner() -> None:
    # Rank 1 drives GPU 1 but also holds a stray context on GPU 0 (pid 4242 in its processes).
    rank1 = RankInfo(rank=1, world_size=2, host=NODE, pid=4242, device_uuids=(UUID1,))
    assert gpu_owner(status(FULL), {1: rank1}) is None
    assert gpu_owner(status(BARE, index=1), {1: rank1}) == rank1


def test_ended_rank_no_longer_owns_its_gpu() -> None:
    series = parse(render([status(FULL)], {0: RANK0}, ended={0}))
    assert series[key("auditor_gpu_up", **gpu_labels())] == 1


def test_gpus_sorted_by_index_and_promtool_clean() -> None:
    text = render([status(BARE, index=1), status(FULL)], {0: RANK0})
    promtool = require_tool("promtool")
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "" and proc.stderr == ""
    ups = [line for line in text.splitlines() if line.startswith("auditor_gpu_up{")]
    assert [('gpu="0"' in u, 'gpu="1"' in u) for u in ups] == [(True, False), (False, True)]


def test_openmetrics_units() -> None:
    state = ExportState(job=JOB, node=NODE, gpus={UUID0: status(FULL)})
    text = generate_openmetrics(make_registry(lambda: state)).decode()
    families = {f.name: f for f in parse_openmetrics(text)}
    assert families["auditor_gpu_sm_clock_hertz"].unit == "hertz"
    assert families["auditor_gpu_power_watts"].unit == "watts"
    assert families["auditor_gpu_temperature_celsius"].unit == "celsius"
    assert families["auditor_gpu_memory_used_bytes"].unit == "bytes"
    assert families["auditor_gpu_utilization_ratio"].unit == "ratio"
