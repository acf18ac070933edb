"""NVML, behind one choke point. The only module that imports ``pynvml`` (nvidia-ml-py), lazily.

Shaped like nvitop's ``libnvml``:

* :class:`Nvml` wraps a pynvml-like module (``lib``; tests pass a fake one). Init and shutdown
  are reference-counted (:meth:`Nvml.acquire` / :meth:`Nvml.release`, or ``with nvml:``).
* Every NVML call goes through :meth:`Nvml.query`. "Not supported", "no permission" and "function
  not found" (an older driver) become ``None``, *missing*, logged once per function; never zero.
  "GPU is lost" raises :class:`GpuLostError`. Any other NVML error is ``None`` plus a warning.
* :class:`NvmlSource` is the live :class:`~auditor.telemetry.sources.DeviceSource`: one
  consistent read of one GPU per :meth:`NvmlSource.sample`. A GPU lost mid-run reads as
  ``DeviceSample(lost=True)`` with its other fields None, and stays lost.
* Each read asks NVML only what can have changed: the board's maxima once per GPU
  (:data:`STATIC_FUNCTIONS`), the process list, power limit and PCIe link every
  ``slow_every_s`` (:data:`SLOW_FUNCTIONS`), the rest every time. :meth:`Nvml.costs` holds
  each function's calls and seconds, so the cost of a read is measured per call, not guessed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from auditor.samples import DeviceSample, GpuProcess
from auditor.telemetry.identity import DeviceIdentity

log = logging.getLogger(__name__)

# pynvml exception classes whose meaning is "this value is missing here" (not zero, not fatal).
# NVMLLibraryMismatchError is what pynvml's unversioned wrappers (e.g. the running-processes
# calls) raise instead of FunctionNotFound when the driver lacks the versioned symbol.
_MISSING_ERRORS = (
    "NVMLError_NotSupported",
    "NVMLError_NoPermission",
    "NVMLError_FunctionNotFound",
    "NVMLLibraryMismatchError",
)

# Clock-event (throttle) reasons: stable snake_case name, then the pynvml constants of its bit,
# current name first, deprecated "throttle" name second. The last two exist only as throttle
# reasons in nvidia-ml-py; they are decoded where the library defines them.
THROTTLE_REASONS: tuple[tuple[str, str, str], ...] = (
    ("gpu_idle", "nvmlClocksEventReasonGpuIdle", "nvmlClocksThrottleReasonGpuIdle"),
    (
        "applications_clocks_setting",
        "nvmlClocksEventReasonApplicationsClocksSetting",
        "nvmlClocksThrottleReasonApplicationsClocksSetting",
    ),
    ("sw_power_cap", "nvmlClocksEventReasonSwPowerCap", "nvmlClocksThrottleReasonSwPowerCap"),
    ("hw_slowdown", "nvmlClocksEventReasonHwSlowdown", "nvmlClocksThrottleReasonHwSlowdown"),
    ("sync_boost", "nvmlClocksEventReasonSyncBoost", "nvmlClocksThrottleReasonSyncBoost"),
    (
        "sw_thermal_slowdown",
        "nvmlClocksEventReasonSwThermalSlowdown",
        "nvmlClocksThrottleReasonSwThermalSlowdown",
    ),
    (
        "hw_thermal_slowdown",
        "nvmlClocksEventReasonHwThermalSlowdown",
        "nvmlClocksThrottleReasonHwThermalSlowdown",
    ),
    (
        "hw_power_brake_slowdown",
        "nvmlClocksEventReasonHwPowerBrakeSlowdown",
        "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
    ),
    (
        "display_clock_setting",
        "nvmlClocksEventReasonDisplayClockSetting",
        "nvmlClocksThrottleReasonDisplayClockSetting",
    ),
    ("board_limit", "", "nvmlClocksThrottleReasonBoardLimit"),
    ("reliability", "", "nvmlClocksThrottleReasonReliability"),
)

# Read once per GPU: the board's maxima do not change while the driver is loaded.
STATIC_FUNCTIONS = (
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
)
# Read every ``slow_every_s``: they change rarely (a rank starting or ending, an operator's power
# cap, a link retraining), and the process listing walks every context on the GPU, the dearest
# call of a read. Their values in between are the last ones read.
SLOW_FUNCTIONS = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
)
SLOW_EVERY_S = 5.0
"""How often the slow fields are read again (s). Ownership of a GPU by a new rank is seen
within this; the probe's own report of its device comes sooner."""

_EVENT_REASONS_FN = "nvmlDeviceGetCurrentClocksEventReasons"
_THROTTLE_REASONS_FN = "nvmlDeviceGetCurrentClocksThrottleReasons"
# NVML_VALUE_NOT_AVAILABLE for unsigned long long fields (c_ulonglong(-1)), used only when the
# library does not define NVML_VALUE_NOT_AVAILABLE_ulonglong itself.
_NOT_AVAILABLE_ULL = (1 << 64) - 1


class GpuLostError(RuntimeError):
    """NVML says the GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""

    def __init__(self, fn_name: str) -> None:
        super().__init__(f"GPU is lost ({fn_name})")
        self.fn_name = fn_name


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used here; ``reason`` says why in plain words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Never(Exception):
    """Stands in for an exception class a fake library does not define: never raised."""


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class Nvml:
    """Reference-counted access to a pynvml-like library, with one query choke point.

    ``lib`` defaults to ``pynvml``, imported on first use, so importing this module never needs
    nvidia-ml-py or a driver. Tests pass an object exposing the pynvml function names,
    constants and exception classes.
    """

    def __init__(self, lib: Any | None = None) -> None:
        self._lib = lib
        self._lock = threading.RLock()
        self._refcount = 0
        self._missing: dict[str, str] = {}
        self._warned: set[tuple[str, str]] = set()
        self._errors: dict[str, type[BaseException]] = {}
        # function name -> [calls, seconds]: what each NVML call costs here.
        self._costs: dict[str, list[float]] = {}

    # -- library and lifetime ---------------------------------------------------------------

    @property
    def lib(self) -> Any:
        """The library module; imports ``pynvml`` the first time (ImportError if absent)."""
        if self._lib is None:
            import pynvml

            self._lib = pynvml
        return self._lib

    @property
    def initialized(self) -> bool:
        return self._refcount > 0

    def acquire(self) -> None:
        """Initialise NVML on the first acquire; raises :class:`NvmlUnavailableError`."""
        with self._lock:
            if self._refcount == 0:
                try:
                    lib = self.lib
                except ImportError as exc:
                    raise NvmlUnavailableError(
                        f"nvidia-ml-py is not installed (import pynvml failed: {exc})"
                    ) from exc
                try:
                    lib.nvmlInit()
                except self.error("NVMLError_LibraryNotFound") as exc:
                    raise NvmlUnavailableError(
                        "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver installed"
                    ) from exc
                except self.error("NVMLError_DriverNotLoaded") as exc:
                    raise NvmlUnavailableError("the NVIDIA driver is not loaded") from exc
                except self.error("NVMLError") as exc:
                    raise NvmlUnavailableError(f"NVML init failed: {exc}") from exc
            self._refcount += 1

    def release(self) -> None:
        """Undo one :meth:`acquire`; shuts NVML down when the last holder releases."""
        with self._lock:
            if self._refcount == 0:
                return
            self._refcount -= 1
            if self._refcount == 0:
                try:
                    self.lib.nvmlShutdown()
                except self.error("NVMLError") as exc:
                    log.warning("NVML shutdown failed: %s", exc)

    def __enter__(self) -> Nvml:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def available(self) -> tuple[bool, str]:
        """Whether NVML can be used here, with a plain reason either way (no NVML error escapes)."""
        try:
            self.acquire()
        except NvmlUnavailableError as exc:
            return False, exc.reason
        try:
            count = self.query("nvmlDeviceGetCount")
            driver = _text(self.query("nvmlSystemGetDriverVersion"))
        except GpuLostError:
            count, driver = None, None
        finally:
            self.release()
        gpus = "unknown number of" if count is None else str(count)
        return True, f"NVML ready: driver {driver or 'unknown'}, {gpus} GPU(s)"

    # -- the choke point ----------------------------------------------------------------------

    def error(self, name: str) -> type[BaseException]:
        """The library's exception class ``name`` (a never-raised stand-in if it has none)."""
        cached = self._errors.get(name)
        if cached is not None:
            return cached
        found = getattr(self.lib, name, None)
        cls: type[BaseException] = _Never
        if isinstance(found, type) and issubclass(found, BaseException):
            cls = found
        self._errors[name] = cls
        return cls

    def const(self, name: str) -> Any:
        """A constant of the library (``NVML_CLOCK_SM``...); AttributeError if it lacks it."""
        return getattr(self.lib, name)

    def missing(self) -> dict[str, str]:
        """Functions that reported "missing" so far, with the reason (for doctor and bench)."""
        return dict(self._missing)

    def is_missing(self, fn_name: str) -> bool:
        return fn_name in self._missing

    def costs(self) -> dict[str, tuple[int, float]]:
        """Calls and total seconds per NVML function so far (failed calls included)."""
        return {fn: (int(c[0]), c[1]) for fn, c in self._costs.items()}

    def query(self, fn_name: str, *args: Any) -> Any | None:
        """Call ``lib.<fn_name>(*args)``; None when the value is missing or the call failed.

        Raises :class:`GpuLostError` when NVML reports the GPU lost.
        """
        fn: Callable[..., Any] | None = getattr(self.lib, fn_name, None)
        if fn is None or not callable(fn):
            self._note_missing(fn_name, "function not found in the NVML bindings")
            return None
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except self.error("NVMLError_GpuIsLost") as exc:
            raise GpuLostError(fn_name) from exc
        except tuple(self.error(n) for n in _MISSING_ERRORS) as exc:
            self._note_missing(fn_name, f"{type(exc).__name__}: {exc}")
            return None
        except self.error("NVMLError") as exc:
            key = (fn_name, type(exc).__name__)
            if key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "NVML %s failed: %s (%s); value reported as missing",
                    fn_name,
                    exc,
                    type(exc).__name__,
                )
            else:
                log.debug("NVML %s failed again: %s", fn_name, exc)
            return None
        finally:
            cost = self._costs.setdefault(fn_name, [0, 0.0])
            cost[0] += 1
            cost[1] += time.perf_counter() - t0

    def _note_missing(self, fn_name: str, reason: str) -> None:
        if fn_name in self._missing:
            return
        self._missing[fn_name] = reason
        log.info("NVML %s unavailable here (%s); reported as missing, not zero", fn_name, reason)


class NvmlSource:
    """The live device source of one node: NVML reads, one consistent read per ``sample``.

    NVML is acquired on first use (``devices``/``sample``/``driver_info``) and released by
    :meth:`close`. Handles are resolved by ``devices()`` and cached by UUID.
    """

    def __init__(
        self,
        node: str,
        *,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.time,
        slow_every_s: float = SLOW_EVERY_S,
    ) -> None:
        self.node = node
        self.slow_every_s = slow_every_s
        self.nvml = nvml if nvml is not None else Nvml()
        self._clock = clock
        self._acquired = False
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self._idents: dict[str, DeviceIdentity] = {}
        self._by_index: dict[int, str] = {}
        self._lost: set[str] = set()
        # uuid -> the static fields; uuid -> (when read, the slow fields).
        self._static: dict[str, _Static] = {}
        self._slow: dict[str, tuple[float, _Slow]] = {}

    # -- lifetime -------------------------------------------------------------------------------

    def _ensure(self) -> None:
        with self._lock:
            if not self._acquired:
                self.nvml.acquire()
                self._acquired = True

    def close(self) -> None:
        with self._lock:
            if self._acquired:
                self._acquired = False
                self.nvml.release()

    def __enter__(self) -> NvmlSource:
        self._ensure()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def available(self) -> tuple[bool, str]:
        return self.nvml.available()

    # -- identity -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceIdentity]:
        """The node's GPUs in NVML index order (a GPU lost before its UUID is known is left out)."""
        self._ensure()
        q = self.nvml.query
        count = q("nvmlDeviceGetCount") or 0
        out: list[DeviceIdentity] = []
        for i in range(int(count)):
            try:
                handle = q("nvmlDeviceGetHandleByIndex", i)
                if handle is None:
                    continue
                uuid = _text(q("nvmlDeviceGetUUID", handle))
                if not uuid:
                    log.warning("NVML GPU %d has no readable UUID; left out", i)
                    continue
                if uuid in self._lost:
                    out.append(self._idents[uuid])
                    continue
                index = q("nvmlDeviceGetIndex", handle)
                model = _text(q("nvmlDeviceGetName", handle)) or ""
            except GpuLostError:
                known = self._by_index.get(i)
                if known is not None:
                    self._mark_lost(known)
                    out.append(self._idents[known])
                else:
                    log.error("NVML GPU at index %d is lost; its UUID is unknown, left out", i)
                continue
            ident = DeviceIdentity(
                index=int(index) if index is not None else i, uuid=uuid, model=model
            )
            self._handles[uuid] = handle
            self._idents[uuid] = ident
            self._by_index[i] = uuid
            out.append(ident)
        return out

    def _mark_lost(self, uuid: str) -> None:
        if uuid not in self._lost:
            self._lost.add(uuid)
            ident = self._idents.get(uuid)
            where = f"index {ident.index}, " if ident else ""
            log.error(
                "GPU %s (%snode %s) is lost: it fell off the bus; reported as lost from now on",
                uuid,
                where,
                self.node,
            )

    def _lost_sample(self, ident: DeviceIdentity, now: float) -> DeviceSample:
        return DeviceSample(
            node=self.node,
            index=ident.index,
            uuid=ident.uuid,
            time=now,
            model=ident.model,
            lost=True,
        )

    # -- the read -------------------------------------------------------------------------------

    def sample(self, uuid: str) -> DeviceSample:
        """One consistent read of GPU ``uuid``; KeyError if this node has no such GPU."""
        self._ensure()
        if uuid not in self._idents:
            self.devices()
            if uuid not in self._idents:
                raise KeyError(f"no GPU with UUID {uuid!r} on node {self.node!r}")
        ident = self._idents[uuid]
        now = self._clock()
        if uuid in self._lost:
            return self._lost_sample(ident, now)
        try:
            return self._read(self._handles[uuid], ident, now)
        except GpuLostError:
            self._mark_lost(uuid)
            return self._lost_sample(ident, now)

    def _read(self, h: Any, ident: DeviceIdentity, now: float) -> DeviceSample:
        q = self.nvml.query
        c = self.nvml.const
        util = q("nvmlDeviceGetUtilizationRates", h)
        mem = q("nvmlDeviceGetMemoryInfo", h)
        sm = q("nvmlDeviceGetClockInfo", h, c("NVML_CLOCK_SM"))
        mclk = q("nvmlDeviceGetClockInfo", h, c("NVML_CLOCK_MEM"))
        reasons = self._throttle_reasons(h)
        power = q("nvmlDeviceGetPowerUsage", h)
        temp = q("nvmlDeviceGetTemperature", h, c("NVML_TEMPERATURE_GPU"))
        static = self._static.get(ident.uuid)
        if static is None:
            static = self._static[ident.uuid] = _Static(
                sm_max=_float(q("nvmlDeviceGetMaxClockInfo", h, c("NVML_CLOCK_SM"))),
                mclk_max=_float(q("nvmlDeviceGetMaxClockInfo", h, c("NVML_CLOCK_MEM"))),
                gen_max=_int(q("nvmlDeviceGetMaxPcieLinkGeneration", h)),
                width_max=_int(q("nvmlDeviceGetMaxPcieLinkWidth", h)),
            )
        last = self._slow.get(ident.uuid)
        if last is None or not 0 <= now - last[0] < self.slow_every_s:
            slow = _Slow(
                limit_w=_milli(q("nvmlDeviceGetEnforcedPowerLimit", h)),
                gen=_int(q("nvmlDeviceGetCurrPcieLinkGeneration", h)),
                width=_int(q("nvmlDeviceGetCurrPcieLinkWidth", h)),
                processes=self._processes(h),
            )
            self._slow[ident.uuid] = (now, slow)
        else:
            slow = last[1]
        return DeviceSample(
            node=self.node,
            index=ident.index,
            uuid=ident.uuid,
            time=now,
            model=ident.model,
            gpu_util=_ratio(getattr(util, "gpu", None)),
            mem_util=_ratio(getattr(util, "memory", None)),
            mem_used_bytes=_int(getattr(mem, "used", None)),
            mem_total_bytes=_int(getattr(mem, "total", None)),
            sm_clock_mhz=_float(sm),
            sm_clock_max_mhz=static.sm_max,
            mem_clock_mhz=_float(mclk),
            mem_clock_max_mhz=static.mclk_max,
            throttle_reasons=reasons,
            power_w=_milli(power),
            power_limit_w=slow.limit_w,
            temperature_c=_float(temp),
            pcie_gen=slow.gen,
            pcie_gen_max=static.gen_max,
            pcie_width=slow.width,
            pcie_width_max=static.width_max,
            processes=slow.processes,
        )

    def _throttle_reasons(self, h: Any) -> tuple[str, ...] | None:
        mask = None
        if not self.nvml.is_missing(_EVENT_REASONS_FN):
            mask = self.nvml.query(_EVENT_REASONS_FN, h)
        if mask is None and self.nvml.is_missing(_EVENT_REASONS_FN):
            mask = self.nvml.query(_THROTTLE_REASONS_FN, h)
        if mask is None:
            return None
        return decode_throttle_reasons(int(mask), self.nvml.lib)

    def _processes(self, h: Any) -> tuple[GpuProcess, ...]:
        na_const = getattr(self.nvml.lib, "NVML_VALUE_NOT_AVAILABLE_ulonglong", None)
        na = getattr(na_const, "value", na_const)
        if not isinstance(na, int):
            na = _NOT_AVAILABLE_ULL
        used: dict[int, int | None] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in self.nvml.query(fn, h) or ():
                pid = int(p.pid)
                mem = getattr(p, "usedGpuMemory", None)
                value = None if mem is None or int(mem) >= na else int(mem)
                prev = used.get(pid)
                # A process with both compute and graphics contexts: one memory figure.
                if prev is not None and (value is None or prev > value):
                    value = prev
                used[pid] = value
        return tuple(GpuProcess(pid=pid, used_bytes=b) for pid, b in used.items())

    # -- the system -----------------------------------------------------------------------------

    def driver_info(self) -> dict[str, Any]:
        """Driver, NVML and CUDA driver versions and the GPU count (None where missing)."""
        self._ensure()
        q = self.nvml.query
        try:
            cuda = q("nvmlSystemGetCudaDriverVersion")
            count = q("nvmlDeviceGetCount")
            driver = _text(q("nvmlSystemGetDriverVersion"))
            nvml_version = _text(q("nvmlSystemGetNVMLVersion"))
        except GpuLostError:
            cuda = count = driver = nvml_version = None
        return {
            "driver_version": driver,
            "nvml_version": nvml_version,
            "cuda_driver_version": _cuda_version(cuda),
            "device_count": _int(count),
        }


@dataclass(frozen=True)
class _Static:
    """A GPU's fields that never change while the driver is loaded."""

    sm_max: float | None
    mclk_max: float | None
    gen_max: int | None
    width_max: int | None


@dataclass(frozen=True)
class _Slow:
    """A GPU's fields read every ``slow_every_s``."""

    limit_w: float | None
    gen: int | None
    width: int | None
    processes: tuple[GpuProcess, ...]


def decode_throttle_reasons(mask: int, lib: Any) -> tuple[str, ...]:
    """Active clock-event reasons of an NVML bitmask, as stable snake_case names.

    Bits come from the library's own constants (event names first, then the deprecated
    throttle names); bits no name covers are ignored.
    """
    out: list[str] = []
    for name, event_const, throttle_const in THROTTLE_REASONS:
        bit = getattr(lib, event_const, None) if event_const else None
        if bit is None:
            bit = getattr(lib, throttle_const, None)
        if isinstance(bit, int) and bit and mask & bit:
            out.append(name)
    return tuple(out)


def _cuda_version(raw: Any) -> str | None:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    if raw is None:
        return None
    v = int(raw)
    return f"{v // 1000}.{(v % 1000) // 10}"


def _ratio(percent: Any) -> float | None:
    return None if percent is None else float(percent) / 100.0


def _milli(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
