"""The live NVML source, tested through its source boundary with a fake pynvml-like library.

The fake exposes pynvml's function names and takes its constants and exception classes from
the real module, so the errors raised here are the ones nvidia-ml-py raises. pynvml itself is
never patched.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from auditor.samples import DeviceSample, GpuProcess
from auditor.telemetry.nvml import (
    GpuLostError,
    Nvml,
    NvmlSource,
    NvmlUnavailableError,
    decode_throttle_reasons,
)
from auditor.telemetry.sources import DeviceIdentity, DeviceSource
from tests.helpers.clocks import Clock
from tests.helpers.units import GIB, MIB

NA = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@dataclass
class FakeGpu:
    uuid: str
    name: str
    util: tuple[int, int] = (0, 0)
    mem: tuple[int, int] = (0, 80 * GIB)  # used, total
    clocks: dict[int, int] = field(default_factory=dict)
    max_clocks: dict[int, int] = field(default_factory=dict)
    reasons: int = 0
    power_mw: int = 0
    limit_mw: int = 0
    temp: int = 0
    pcie: tuple[int, int, int, int] = (4, 4, 16, 16)  # gen, gen max, width, width max
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    # function name -> exception class to raise from it
    errors: dict[str, type[BaseException]] = field(default_factory=dict)
    lost: bool = False


def _copy_pynvml_names(target: Any) -> None:
    for name in dir(pynvml):
        if name.startswith(("NVML_", "NVMLError", "nvmlClocksEventReason", "nvmlClocksThrottle")):
            setattr(target, name, getattr(pynvml, name))
    target.NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError


class FakeLib:
    """A pynvml stand-in: same function names, real constants and exception classes."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        init_error: type[BaseException] | None = None,
        hidden: tuple[str, ...] = (),
    ) -> None:
        _copy_pynvml_names(self)
        self.gpus = gpus
        self.init_error = init_error
        self.hidden = set(hidden)
        self.inits = 0
        self.shutdowns = 0
        self.calls: list[tuple[str, str]] = []  # (function, uuid)

    def __getattribute__(self, name: str) -> Any:
        if name != "hidden" and name in object.__getattribute__(self, "hidden"):
            raise AttributeError(name)
        return object.__getattribute__(self, name)

    # -- system
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    # -- device
    def _dev(self, fn: str, gpu: FakeGpu) -> FakeGpu:
        self.calls.append((fn, gpu.uuid))
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if fn in gpu.errors:
            raise gpu.errors[fn]()
        return gpu

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self._dev("nvmlDeviceGetHandleByIndex", self.gpus[i])

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._dev("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return self.gpus.index(self._dev("nvmlDeviceGetIndex", h))

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._dev("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        g = self._dev("nvmlDeviceGetUtilizationRates", h)
        return pynvml.c_nvmlUtilization_t(gpu=g.util[0], memory=g.util[1])

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        g = self._dev("nvmlDeviceGetMemoryInfo", h)
        used, total = g.mem
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        return self._dev("nvmlDeviceGetClockInfo", h).clocks[kind]

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, kind: int) -> int:
        return self._dev("nvmlDeviceGetMaxClockInfo", h).max_clocks[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", h).limit_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._dev("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetCurrPcieLinkWidth", h).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetMaxPcieLinkWidth", h).pcie[3]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        g = self._dev("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.compute]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        g = self._dev("nvmlDeviceGetGraphicsRunningProcesses", h)
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in g.graphics]


SM, MEM = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
UUID0 = "GPU-0b7c2a6e-1111-2222-3333-444455556666"
UUID1 = "GPU-9f3d1c55-aaaa-bbbb-cccc-ddddeeeeffff"
MODEL = "NVIDIA H100 80GB HBM3"


def two_gpus() -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid=UUID0,
            name=MODEL,
            util=(87, 41),
            mem=(30 * GIB, 80 * GIB),
            clocks={SM: 1755, MEM: 2619},
            max_clocks={SM: 1980, MEM: 2619},
            reasons=0,
            power_mw=312_500,
            limit_mw=700_000,
            temp=61,
            pcie=(5, 5, 16, 16),
            compute=[(1234, 29 * GIB)],
        ),
        FakeGpu(
            uuid=UUID1,
            name=MODEL,
            util=(12, 3),
            mem=(2 * GIB, 80 * GIB),
            clocks={SM: 1095, MEM: 2619},
            max_clocks={SM: 1980, MEM: 2619},
            reasons=(
                pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwSlowdown
            ),
            power_mw=98_250,
            limit_mw=700_000,
            temp=44,
            pcie=(3, 5, 8, 16),
            compute=[(1235, 1 * GIB), (1300, NA)],
            graphics=[(1235, 512 * MIB), (1400, None)],
        ),
    ]


def expected_full(now: float) -> tuple[DeviceSample, DeviceSample]:
    first = DeviceSample(
        node="node-a",
        index=0,
        uuid=UUID0,
        time=now,
        model=MODEL,
        gpu_util=0.87,
        mem_util=0.41,
        mem_used_bytes=30 * GIB,
        mem_total_bytes=80 * GIB,
        sm_clock_mhz=1755.0,
        sm_clock_max_mhz=1980.0,
        mem_clock_mhz=2619.0,
        mem_clock_max_mhz=2619.0,
        throttle_reasons=(),
        power_w=312.5,
        power_limit_w=700.0,
        temperature_c=61.0,
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        processes=(GpuProcess(pid=1234, used_bytes=29 * GIB),),
    )
    second = DeviceSample(
        node="node-a",
        index=1,
        uuid=UUID1,
        time=now,
        model=MODEL,
        gpu_util=0.12,
        mem_util=0.03,
        mem_used_bytes=2 * GIB,
        mem_total_bytes=80 * GIB,
        sm_clock_mhz=1095.0,
        sm_clock_max_mhz=1980.0,
        mem_clock_mhz=2619.0,
        mem_clock_max_mhz=2619.0,
        throttle_reasons=("sw_power_cap", "hw_slowdown"),
        power_w=98.25,
        power_limit_w=700.0,
        temperature_c=44.0,
        pcie_gen=3,
        pcie_gen_max=5,
        pcie_width=8,
        pcie_width_max=16,
        # 1235 holds compute and graphics contexts: one entry, the larger figure.
        # 1300: NVML_VALUE_NOT_AVAILABLE; 1400: pynvml already turned it into None.
        processes=(
            GpuProcess(pid=1235, used_bytes=1 * GIB),
            GpuProcess(pid=1300, used_bytes=None),
            GpuProcess(pid=1400, used_bytes=None),
        ),
    )
    return first, second


def source(lib: FakeLib, clock: Clock | None = None) -> NvmlSource:
    return NvmlSource("node-a", nvml=Nvml(lib), clock=clock or Clock(1000.0))


def test_full_read_of_two_devices() -> None:
    lib = FakeLib(two_gpus())
    src = source(lib)
    assert isinstance(src, DeviceSource)
    assert src.devices() == [
        DeviceIdentity(index=0, uuid=UUID0, model=MODEL),
        DeviceIdentity(index=1, uuid=UUID1, model=MODEL),
    ]
    assert (src.sample(UUID0), src.sample(UUID1)) == expected_full(1000.0)
    assert src.nvml.missing() == {}


def test_sample_resolves_devices_itself_and_rejects_unknown_uuid() -> None:
    src = source(FakeLib(two_gpus()))
    assert src.sample(UUID1) == expected_full(1000.0)[1]
    with pytest.raises(KeyError, match="GPU-nope"):
        src.sample("GPU-nope")


NOT_SUPPORTED_FNS = (
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
)


def test_not_supported_fields_are_none_not_zero_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gpus = two_gpus()
    for g in gpus:
        g.errors = {fn: pynvml.NVMLError_NotSupported for fn in NOT_SUPPORTED_FNS}
    src = source(FakeLib(gpus))
    caplog.set_level(logging.INFO, logger="auditor.telemetry.nvml")
    for _ in range(3):
        samples = [src.sample(UUID0), src.sample(UUID1)]
    for s in samples:
        assert s.power_w is None and s.power_limit_w is None
        assert s.pcie_gen is None and s.pcie_gen_max is None
        assert s.pcie_width is None and s.pcie_width_max is None
        assert not s.lost
    # Everything else is still read.
    first, _ = expected_full(1000.0)
    assert samples[0].gpu_util == first.gpu_util
    assert samples[0].processes == first.processes
    missing = src.nvml.missing()
    assert set(missing) == set(NOT_SUPPORTED_FNS)
    assert "NotSupported" in missing["nvmlDeviceGetPowerUsage"]
    for fn in NOT_SUPPORTED_FNS:
        assert sum(fn in r.getMessage() for r in caplog.records) == 1, fn
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_no_permission_on_processes_leaves_the_rest() -> None:
    gpus = two_gpus()
    gpus[0].errors = {
        "nvmlDeviceGetComputeRunningProcesses": pynvml.NVMLError_NoPermission,
        "nvmlDeviceGetGraphicsRunningProcesses": pynvml.NVMLError_NoPermission,
    }
    src = source(FakeLib(gpus))
    s = src.sample(UUID0)
    first, _ = expected_full(1000.0)
    assert s.processes == ()
    assert s == replace(first, processes=())
    assert "NoPermission" in src.nvml.missing()["nvmlDeviceGetComputeRunningProcesses"]
    assert src.sample(UUID1) == expected_full(1000.0)[1]


def test_gpu_lost_mid_run_stays_lost_and_spares_the_other_gpu() -> None:
    gpus = two_gpus()
    lib = FakeLib(gpus)
    clock = Clock(1000.0)
    src = source(lib, clock)
    assert src.sample(UUID0) == expected_full(1000.0)[0]

    gpus[0].lost = True
    clock.t = 1001.0
    lost = DeviceSample(node="node-a", index=0, uuid=UUID0, time=1001.0, model=MODEL, lost=True)
    assert src.sample(UUID0) == lost
    assert src.sample(UUID1) == expected_full(1001.0)[1]

    # Even if NVML answered again, a lost GPU stays lost and is not queried any more.
    gpus[0].lost = False
    clock.t = 1002.0
    before = len([c for c in lib.calls if c[1] == UUID0])
    assert src.sample(UUID0) == DeviceSample(
        node="node-a", index=0, uuid=UUID0, time=1002.0, model=MODEL, lost=True
    )
    assert len([c for c in lib.calls if c[1] == UUID0]) == before
    assert src.sample(UUID1) == expected_full(1002.0)[1]
    assert [d.uuid for d in src.devices()] == [UUID0, UUID1]


def test_gpu_lost_in_the_middle_of_a_read_gives_no_partial_sample() -> None:
    gpus = two_gpus()
    gpus[1].errors = {"nvmlDeviceGetPowerUsage": pynvml.NVMLError_GpuIsLost}
    src = source(FakeLib(gpus))
    s = src.sample(UUID1)
    assert s.lost
    assert s.gpu_util is None and s.mem_used_bytes is None and s.throttle_reasons is None
    assert src.sample(UUID0) == expected_full(1000.0)[0]


def test_query_raises_gpu_lost_at_the_choke_point() -> None:
    gpus = two_gpus()
    gpus[0].lost = True
    nvml = Nvml(FakeLib(gpus))
    with nvml, pytest.raises(GpuLostError, match="nvmlDeviceGetUUID"):
        nvml.query("nvmlDeviceGetUUID", gpus[0])


ALL_NINE = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (pynvml.nvmlClocksEventReasonNone, ()),
        (pynvml.nvmlClocksEventReasonGpuIdle, ("gpu_idle",)),
        (0x1 | 0x20 | 0x40, ("gpu_idle", "sw_thermal_slowdown", "hw_thermal_slowdown")),
        (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, ("hw_power_brake_slowdown",)),
        (pynvml.nvmlClocksEventReasonAll, ALL_NINE),
        (pynvml.nvmlClocksThrottleReasonBoardLimit, ("board_limit",)),
        (1 << 40, ()),  # a bit no name covers
    ],
)
def test_throttle_bitmask_decoding(mask: int, names: tuple[str, ...]) -> None:
    gpus = two_gpus()
    gpus[0].reasons = mask
    src = source(FakeLib(gpus))
    assert src.sample(UUID0).throttle_reasons == names
    assert decode_throttle_reasons(mask, pynvml) == names


def test_throttle_reasons_fall_back_to_the_deprecated_function() -> None:
    gpus = two_gpus()
    gpus[0].reasons = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    # An older nvidia-ml-py without the "event" name: a missing attribute on the library.
    old = FakeLib(gpus, hidden=("nvmlDeviceGetCurrentClocksEventReasons",))
    src = source(old)
    assert src.sample(UUID0).throttle_reasons == ("sw_thermal_slowdown",)
    assert src.sample(UUID0).throttle_reasons == ("sw_thermal_slowdown",)
    assert "nvmlDeviceGetCurrentClocksEventReasons" in src.nvml.missing()
    # A driver without the symbol: pynvml raises FunctionNotFound.
    gpus[1].errors = {"nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVMLError_FunctionNotFound}
    lib = FakeLib(gpus)
    src = source(lib)
    assert src.sample(UUID1).throttle_reasons == ("sw_power_cap", "hw_slowdown")
    src.sample(UUID1)
    # After the first miss the event function is not tried again.
    tried = [c for c in lib.calls if c[0] == "nvmlDeviceGetCurrentClocksEventReasons"]
    assert len(tried) == 1


def test_throttle_reasons_none_when_both_functions_fail() -> None:
    gpus = two_gpus()
    gpus[0].errors = {
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVMLError_NotSupported,
        "nvmlDeviceGetCurrentClocksThrottleReasons": pynvml.NVMLError_NotSupported,
    }
    assert source(FakeLib(gpus)).sample(UUID0).throttle_reasons is None


def test_missing_attribute_and_other_errors(caplog: pytest.LogCaptureFixture) -> None:
    gpus = two_gpus()
    gpus[0].errors = {"nvmlDeviceGetTemperature": pynvml.NVMLError_Unknown}
    lib = FakeLib(gpus, hidden=("nvmlDeviceGetMemoryInfo",))
    src = source(lib)
    caplog.set_level(logging.INFO, logger="auditor.telemetry.nvml")
    for _ in range(3):
        s = src.sample(UUID0)
    assert s.mem_used_bytes is None and s.mem_total_bytes is None
    assert s.temperature_c is None
    assert s.gpu_util == 0.87
    assert "nvmlDeviceGetMemoryInfo" in src.nvml.missing()
    # An unexpected NVML error is not "missing": a warning, once per function and error.
    assert "nvmlDeviceGetTemperature" not in src.nvml.missing()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "nvmlDeviceGetTemperature" in warnings[0].getMessage()
    assert sum("nvmlDeviceGetMemoryInfo" in r.getMessage() for r in caplog.records) == 1


def test_refcounted_init_and_shutdown() -> None:
    lib = FakeLib(two_gpus())
    nvml = Nvml(lib)
    a = NvmlSource("node-a", nvml=nvml)
    b = NvmlSource("node-a", nvml=nvml)
    assert lib.inits == 0  # lazy: nothing until first use
    a.devices()
    b.sample(UUID1)
    a.sample(UUID0)
    assert (lib.inits, lib.shutdowns) == (1, 0)
    with nvml:
        assert nvml.initialized
    a.close()
    a.close()  # closing twice releases once
    assert (lib.inits, lib.shutdowns) == (1, 0)
    b.close()
    assert (lib.inits, lib.shutdowns) == (1, 1)
    assert not nvml.initialized
    nvml.release()  # extra release: no-op
    assert lib.shutdowns == 1
    with NvmlSource("node-a", nvml=nvml) as c:
        assert c.sample(UUID0).gpu_util == 0.87
    assert (lib.inits, lib.shutdowns) == (2, 2)


def test_driver_info() -> None:
    src = source(FakeLib(two_gpus()))
    assert src.driver_info() == {
        "driver_version": "550.54.15",
        "nvml_version": "12.550.54.15",
        "cuda_driver_version": "12.4",
        "device_count": 2,
    }


def test_available_true_with_driver() -> None:
    lib = FakeLib(two_gpus())
    ok, reason = source(lib).available()
    assert ok and "550.54.15" in reason and "2 GPU" in reason
    assert lib.inits == lib.shutdowns == 1


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (pynvml.NVMLError_LibraryNotFound, "not found"),
        (pynvml.NVMLError_DriverNotLoaded, "driver is not loaded"),
        (pynvml.NVMLError_Unknown, "NVML init failed"),
    ],
)
def test_available_false_with_a_plain_reason(error: type[BaseException], words: str) -> None:
    lib = FakeLib(two_gpus(), init_error=error)
    src = source(lib)
    ok, reason = src.available()
    assert not ok and words in reason
    with pytest.raises(NvmlUnavailableError, match=words):
        src.devices()
    assert lib.shutdowns == 0


def test_importing_nvml_module_does_not_import_pynvml() -> None:
    code = (
        "import sys, auditor.telemetry.nvml; print(sorted(m for m in sys.modules if 'nvml' in m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['auditor.telemetry.nvml']"


def test_only_nvml_module_imports_pynvml() -> None:
    root = Path(__file__).resolve().parents[2] / "auditor"
    importers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "import pynvml" in p.read_text() or "from pynvml" in p.read_text()
    )
    assert importers == ["telemetry/nvml.py"]


def test_each_read_asks_only_what_can_have_changed() -> None:
    """Maxima once per GPU, the slow fields every ``slow_every_s``, the rest every read."""
    from auditor.telemetry.nvml import SLOW_FUNCTIONS, STATIC_FUNCTIONS

    lib = FakeLib(two_gpus())
    clock = Clock(1000.0)
    src = NvmlSource("node-a", nvml=Nvml(lib), clock=clock, slow_every_s=5.0)
    first = src.sample(UUID0)
    lib.calls.clear()
    for t in (1001.0, 1002.0, 1003.0, 1004.0):
        clock.at(t)
        assert replace(src.sample(UUID0), time=1000.0) == first
    asked = {fn for fn, _ in lib.calls}
    assert asked.isdisjoint(STATIC_FUNCTIONS + SLOW_FUNCTIONS)
    assert "nvmlDeviceGetUtilizationRates" in asked
    # A rank that starts is seen at the next slow read, and the maxima are never asked again.
    lib.gpus[0].compute.append((4321, 2 * GIB))
    clock.at(1005.0)
    lib.calls.clear()
    assert src.sample(UUID0).processes == (
        GpuProcess(pid=1234, used_bytes=29 * GIB),
        GpuProcess(pid=4321, used_bytes=2 * GIB),
    )
    asked = {fn for fn, _ in lib.calls}
    assert set(SLOW_FUNCTIONS) <= asked
    assert asked.isdisjoint(STATIC_FUNCTIONS)


def test_fast_fields_are_fresh_on_every_read() -> None:
    lib = FakeLib(two_gpus())
    clock = Clock(1000.0)
    src = NvmlSource("node-a", nvml=Nvml(lib), clock=clock)
    src.sample(UUID1)
    lib.gpus[1].util = (99, 50)
    lib.gpus[1].reasons = 0
    clock.at(1000.5)
    s = src.sample(UUID1)
    assert (s.gpu_util, s.throttle_reasons) == (0.99, ())


def test_costs_count_every_call_failed_ones_too() -> None:
    gpus = two_gpus()
    gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported
    src = source(FakeLib(gpus))
    src.sample(UUID0)
    src.sample(UUID0)
    costs = src.nvml.costs()
    assert costs["nvmlDeviceGetPowerUsage"][0] == 2
    assert costs["nvmlDeviceGetMaxPcieLinkWidth"][0] == 1
    assert all(seconds >= 0.0 for _, seconds in costs.values())
