"""dcgm-exporter's exposition of recorded GPUs: its names, label names and order, units; the
fields' conversion to the auditor's units; the counters file; the endpoint."""

from __future__ import annotations

import csv
import io
import re
import urllib.request
from dataclasses import replace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from auditor.metrics import catalog as C
from auditor.metrics import dcgm as D
from auditor.samples import DeviceSample
from auditor.telemetry.nvml import THROTTLE_REASONS

GIB = 1 << 30
SAMPLE = DeviceSample(
    node="gpu-node-07",
    index=2,
    uuid="GPU-7b87a9e2",
    time=100.0,
    model="NVIDIA H100 80GB HBM3",
    gpu_util=0.99,
    mem_util=0.54,
    mem_used_bytes=52 * GIB,
    mem_total_bytes=80 * GIB,
    sm_clock_mhz=1347.0,
    sm_clock_max_mhz=1980.0,
    mem_clock_mhz=2619.0,
    mem_clock_max_mhz=2619.0,
    throttle_reasons=("sw_thermal_slowdown",),
    power_w=465.9,
    power_limit_w=700.0,
    temperature_c=88.0,
    pcie_gen=5,
    pcie_gen_max=5,
    pcie_width=16,
    pcie_width_max=16,
)


def parse(text: str) -> dict[str, tuple[str, dict[str, str], float]]:
    """Each series by name (one GPU per test): its family's type, labels and value. Parsed by
    prometheus_client too, which must accept every line."""
    assert list(text_string_to_metric_families(text)) or not text
    types = {}
    out = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)", line)
            assert m, line
            labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m[2]))
            out[m[1]] = (types[m[1]], labels, float(m[3]))
    return out


def test_default_counters_in_dcgm_units_and_labels() -> None:
    text = D.exposition(
        [D.Gpu(SAMPLE)], hostname="dgx-1", fields=D.COUNTER_SETS["default"], driver="550.90.07"
    )
    got = parse(text)
    assert set(got) == {f.name for f in D.DEFAULT_FIELDS}
    # Its units: percent, MiB, MHz, W, C.
    assert got["DCGM_FI_DEV_GPU_UTIL"][2] == 99
    assert got["DCGM_FI_DEV_MEM_COPY_UTIL"][2] == 54
    assert got["DCGM_FI_DEV_FB_USED"][2] == 52 * 1024
    assert got["DCGM_FI_DEV_FB_FREE"][2] == 28 * 1024
    assert got["DCGM_FI_DEV_SM_CLOCK"][2] == 1347
    assert got["DCGM_FI_DEV_POWER_USAGE"][2] == pytest.approx(465.9)
    assert got["DCGM_FI_DEV_GPU_TEMP"][2] == 88
    assert got["DCGM_FI_DEV_XID_ERRORS"][2] == 0
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0] == "counter"
    # Its labels, in its order (the text, not only the parsed set).
    first = next(line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_SM_CLOCK{"))
    assert first.startswith(
        'DCGM_FI_DEV_SM_CLOCK{gpu="2",UUID="GPU-7b87a9e2",pci_bus_id="00000000:38:00.0",'
        'device="nvidia2",modelName="NVIDIA H100 80GB HBM3",Hostname="dgx-1",'
        'DCGM_FI_DRIVER_VERSION="550.90.07"} '
    )
    assert all(labels.keys() == set(D.LABELS) for _, labels, _ in got.values())


def test_auditor_counters_add_what_the_gpu_rules_read() -> None:
    got = parse(D.exposition([D.Gpu(SAMPLE)], hostname="dgx-1"))
    assert set(got) == {f.name for f in D.FIELDS}
    assert got["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"][2] == 0x20
    assert got["DCGM_FI_DEV_MAX_SM_CLOCK"][2] == 1980
    assert got["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"][2] == 700
    assert got["DCGM_FI_DEV_PCIE_LINK_WIDTH"][2] == 16


def test_every_mapped_field_converts_to_the_catalogs_unit() -> None:
    """Read back through FIELDS' factors, each mapped field is the figure the auditor's own
    exporter would show for the same sample (within DCGM's integer MiB and percent)."""
    expected = {
        C.GPU_UTILIZATION_RATIO.name: 0.99,
        C.GPU_MEMORY_UTILIZATION_RATIO.name: 0.54,
        C.GPU_MEMORY_USED_BYTES.name: 52 * GIB,
        C.GPU_SM_CLOCK_HERTZ.name: 1347e6,
        C.GPU_SM_CLOCK_MAX_HERTZ.name: 1980e6,
        C.GPU_MEMORY_CLOCK_HERTZ.name: 2619e6,
        C.GPU_MEMORY_CLOCK_MAX_HERTZ.name: 2619e6,
        C.GPU_POWER_WATTS.name: 465.9,
        C.GPU_POWER_LIMIT_WATTS.name: 700.0,
        C.GPU_TEMPERATURE_CELSIUS.name: 88.0,
        C.GPU_PCIE_LINK_GENERATION.name: 5,
        C.GPU_PCIE_LINK_GENERATION_MAX.name: 5,
        C.GPU_PCIE_LINK_WIDTH.name: 16,
        C.GPU_PCIE_LINK_WIDTH_MAX.name: 16,
    }
    assert set(D.FOR_AUDITOR) == set(expected)
    for name, field in D.FOR_AUDITOR.items():
        assert name in C.BY_NAME
        value = D.field_value(field, SAMPLE)
        assert value is not None
        assert value * field.scale == pytest.approx(expected[name]), name


def test_throttle_bits_are_nvmls() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, event, throttle in THROTTLE_REASONS:
        bit = getattr(pynvml, event, None) if event else None
        bit = bit if bit is not None else getattr(pynvml, throttle)
        assert D.REASON_BITS[name] == bit, name
    assert D.throttle_mask(["sw_power_cap", "hw_slowdown", "not-a-reason"]) == 0x4 | 0x8


def test_unknown_values_have_no_series_and_a_lost_gpu_only_its_xid() -> None:
    bare = DeviceSample(node="n", index=0, uuid="GPU-bare", time=1.0, model="M")
    got = parse(D.exposition([D.Gpu(bare)], hostname="n"))
    # Nothing read is nothing exported (never zero), but the counters nothing moves.
    assert "DCGM_FI_DEV_GPU_UTIL" not in got and "DCGM_FI_DEV_FB_USED" not in got
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in got
    lost = replace(SAMPLE, lost=True)
    got = parse(D.exposition([D.Gpu(lost)], hostname="n"))
    assert {name: v for name, (_, _, v) in got.items()} == {"DCGM_FI_DEV_XID_ERRORS": 79}


def test_energy_counter_integrates_the_power_draw() -> None:
    samples = [replace(SAMPLE, time=100.0, power_w=400.0)]
    exposition = D.DcgmExposition(lambda: samples, hostname="n")
    first = parse(exposition.text())["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][2]
    samples[0] = replace(SAMPLE, time=102.5, power_w=400.0)
    second = parse(exposition.text())["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][2]
    # 400 W for 2.5 s: 1000 J, in mJ; a scrape without a new sample adds nothing.
    assert (first, second) == (0, 1_000_000)
    assert parse(exposition.text())["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][2] == 1_000_000


def test_counters_file_is_dcgm_exporters_format_with_the_default_set() -> None:
    text = D.counters_csv()
    rows = [
        [cell.strip() for cell in row]
        for row in csv.reader(io.StringIO(text))
        if row and not row[0].startswith("#")
    ]
    names = [row[0] for row in rows]
    assert len(names) == len(set(names))
    assert all(row[1] in ("gauge", "counter") and row[2] for row in rows)
    # dcgm-exporter's default-counters.csv, every uncommented field.
    default = {
        "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    }  # fmt: skip
    profiling = {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"}
    assert {f.name for f in D.PROFILING_FIELDS} == profiling
    assert set(names) == default | {f.name for f in D.AUDITOR_FIELDS} | profiling


def test_profiling_fields_are_recorded_as_ratios_and_never_invented() -> None:
    """DCGM's SM and tensor pipe activity are ratios (0..1) already: recorded as the catalog's
    DCGM-only GPU metrics at scale 1. No recording holds them, so an exposition of a recorded
    GPU has no series for them (never a zero that would read as an idle tensor pipe)."""
    mapped = {f.name: f.auditor for f in D.PROFILING_FIELDS}
    assert mapped == {
        "DCGM_FI_PROF_SM_ACTIVE": C.GPU_SM_ACTIVE_RATIO.name,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": C.GPU_TENSOR_PIPE_ACTIVE_RATIO.name,
    }
    assert all(f.scale == 1.0 and f.type == "gauge" for f in D.PROFILING_FIELDS)
    assert {C.BY_NAME[name] for name in mapped.values()} == set(C.DCGM_ONLY)
    text = D.exposition([D.Gpu(SAMPLE)], hostname="dgx-1", fields=D.PROFILING_FIELDS)
    assert text == ""


def test_server_serves_the_exposition_on_localhost() -> None:
    server = D.DcgmServer(D.DcgmExposition(lambda: [SAMPLE], hostname="dgx-1"))
    try:
        assert server.host == "127.0.0.1"
        with urllib.request.urlopen(server.url, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = r.read().decode()
        assert parse(body)["DCGM_FI_DEV_GPU_UTIL"][2] == 99
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=5)
    finally:
        server.close()


def test_promql_relabels_dcgm_labels_to_the_auditors() -> None:
    expr = D.with_auditor_labels("DCGM_FI_DEV_GPU_UTIL")
    for mine, theirs in (("uuid", "UUID"), ("node", "Hostname"), ("model", "modelName")):
        assert f'"{mine}", "$1", "{theirs}", "(.+)"' in expr
