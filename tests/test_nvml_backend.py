"""NvmlBackend against a fake NVML: what a user of a real GPU node would notice.

The fake implements exactly the pynvml functions the backend calls and raises
pynvml's own exception classes, so the error handling under test is the one a
real driver triggers. Constants and ctypes structs come from the real pynvml.

The backend calls the per-read getters and GPM through their C function pointers
(``_nvmlGetFunctionPointer``), with the nvml.h calling convention: outputs by
reference, an ``nvmlReturn_t`` back. The fake serves those as Python functions that
check the output buffer's size as the C ABI needs it, and its pynvml-level wrappers
are built on them as pynvml's are. Every test runs twice: through the C functions,
and with only ``nvmlDeviceGetFieldValues`` resolvable, through the wrappers the
backend falls back to.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import inspect
import math
import sys
import time
import types
from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope.gpu import libnvml
from stepscope.gpu.fields import (
    CLOCK_EVENT_DURATION_KEYS,
    FIELDS_BY_KEY,
    GPM_METRICS,
    PROFILING_KEYS,
    SLOW_KEYS,
)
from stepscope.gpu.libnvml import Failure, classify
from stepscope.gpu.model import GpuUnavailable, NoDriverError, Tier
from stepscope.gpu.nvml import FAST_FIELD_IDS, SLOW_FIELD_IDS, NvmlBackend

FAST = frozenset({Tier.FAST})
BOTH = frozenset({Tier.FAST, Tier.SLOW})

ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
DOUBLE = pynvml.NVML_VALUE_TYPE_DOUBLE
SINT = pynvml.NVML_VALUE_TYPE_SIGNED_INT

SW_THERM = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN
HW_THERM = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN
SW_POWER = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP
SYNC_BOOST = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST
POWER_BRAKE = pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN
BOARD_LIMIT = pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT


def address_of(pointer: Any) -> int:
    """The address a ctypes pointer (an NVML handle or GPM sample) points at."""
    address = ctypes.cast(pointer, ctypes.c_void_p).value
    assert address is not None
    return address


def nvml_error(code: int) -> pynvml.NVMLError:
    """The exception pynvml raises for ``code`` (NVMLError.__new__ picks the subclass)."""
    return pynvml.NVMLError(code)


def default_fields() -> dict[int, tuple[int, Any]]:
    """What an H200 answers to the field ids the backend asks for: id -> (type, value)."""
    return {
        pynvml.NVML_FI_DEV_MEMORY_TEMP: (UINT, 41),
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ULL, 3),
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ULL, 0),
        pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ULL, 2**40 + 7),  # wrong union member = garbage
        pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ULL, 1),
        pynvml.NVML_FI_DEV_REMAPPED_COR: (UINT, 2),
        pynvml.NVML_FI_DEV_REMAPPED_UNC: (UINT, 0),
        pynvml.NVML_FI_DEV_REMAPPED_PENDING: (UINT, 0),
        pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (SINT, 0),
        SW_POWER: (ULL, 5_000_000_000),
        SYNC_BOOST: (ULL, 0),
        SW_THERM: (ULL, 1_000),
        HW_THERM: (ULL, 250),
        POWER_BRAKE: (ULL, 0),
        BOARD_LIMIT: (ULL, 77),
        pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (DOUBLE, 12.0),
    }


@dataclass
class FakeGpu:
    """One fake device: what it answers and which calls fail with which NVML code."""

    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    name: str = "NVIDIA H200"
    bus_id: str = "00000000:18:00.0"
    fail: dict[str, int] = field(default_factory=dict)  # function name -> error code
    fields: dict[int, tuple[int, Any]] = field(default_factory=default_fields)
    field_errors: dict[int, int] = field(default_factory=dict)  # field id -> nvmlReturn
    violations: dict[int, int] = field(default_factory=dict)  # NVML_PERF_POLICY_* -> ns
    mig: int | None = None  # None: MIG not supported
    gpm: bool = True
    gpm_values: dict[int, float] = field(default_factory=dict)
    gpm_errors: dict[int, int] = field(default_factory=dict)
    # NVLink data counters (rx, tx) in KiB per link; an H200 has 18 links
    nvlink_kib: list[tuple[int, int]] = field(
        default_factory=lambda: [(1000 * i, 2000 * i) for i in range(18)])
    encoder: int = 0  # H200: no NVENC, NVML answers 0
    decoder: int = 0
    # (isGridLicenseSupported, [(featureCode, featureState)]): a bare-metal GPU
    licensing: tuple[int, list[tuple[int, int]]] = (0, [])


class FakeNvml:
    """Implements the pynvml functions NvmlBackend calls; constants come from pynvml."""

    c_functions = True  # False: only nvmlDeviceGetFieldValues resolves to a C function

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.handles = [
            ctypes.cast(ctypes.c_void_p(0x1000 + 0x100 * i), pynvml.c_nvmlDevice_t)
            for i in range(len(gpus))
        ]
        self.pending_events: deque[tuple[int, int]] = deque()  # (gpu index, xid)
        self.wait_timeouts: list[int] = []
        self.registered: list[int] = []
        self.field_requests: list[list[int]] = []
        self.field_scopes: list[list[int]] = []
        self.samples_taken: dict[int, int] = {}  # sample address -> sequence number
        self.samples_live: set[int] = set()
        self.metric_pairs: list[tuple[int, int]] = []
        self.metric_requests: list[list[int]] = []
        self._next_sample = 0x9000
        self._sequence = 0

    def __getattr__(self, name: str) -> Any:
        # Constants, structs and exception classes come from the real module; a pynvml
        # function the fake does not implement fails loudly.
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"FakeNvml does not implement {name}")
        return value

    # -- helpers
    def _gpu(self, handle: Any, call: str) -> FakeGpu:
        self.calls[call] += 1
        address = address_of(handle)
        index = (address - 0x1000) // 0x100
        gpu = self.gpus[index]
        if call in gpu.fail:
            raise nvml_error(gpu.fail[call])
        return gpu

    # -- library
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise nvml_error(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if "nvmlDeviceGetHandleByIndex" in self.gpus[index].fail:
            raise nvml_error(self.gpus[index].fail["nvmlDeviceGetHandleByIndex"])
        return self.handles[index]

    # -- static facts
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu(handle, "nvmlDeviceGetPciInfo").bus_id.encode()
        return info

    def nvmlDeviceGetSerial(self, handle: Any) -> bytes:
        self._gpu(handle, "nvmlDeviceGetSerial")
        return b"1654923012345"  # older pynvml returned bytes

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        self._gpu(handle, "nvmlDeviceGetVbiosVersion")
        return "96.00.99.00.01"

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if gpu.mig is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig, gpu.mig]

    # -- FAST getters and energy, as C functions: f(handle, [arg,] byref(out)) -> code
    def _answer(self, handle: Any, call: str, ref: Any, size: int, **values: int) -> int:
        """Fill the buffer ``ref`` points at (of ``size`` bytes, as nvml.h has it)."""
        try:
            self._gpu(handle, call)
        except pynvml.NVMLError as exc:
            return int(exc.value)
        out = ref._obj
        assert ctypes.sizeof(out) == size, (call, type(out))
        fields = {name for name, *_ in getattr(out, "_fields_", [("value",)])}
        assert fields == values.keys(), (call, fields)
        for name, value in values.items():
            setattr(out, name, value)
        return int(pynvml.NVML_SUCCESS)

    def _c_utilization(self, handle: Any, ref: Any) -> int:
        return self._answer(handle, "nvmlDeviceGetUtilizationRates", ref, 8, gpu=97, memory=35)

    def _c_clock_info(self, handle: Any, kind: int, ref: Any) -> int:
        clock = {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[int(kind)]
        return self._answer(handle, "nvmlDeviceGetClockInfo", ref, 4, value=clock)

    def _c_temperature(self, handle: Any, sensor: int, ref: Any) -> int:
        assert int(sensor) == pynvml.NVML_TEMPERATURE_GPU
        return self._answer(handle, "nvmlDeviceGetTemperature", ref, 4, value=52)

    def _c_power(self, handle: Any, ref: Any) -> int:
        return self._answer(handle, "nvmlDeviceGetPowerUsage", ref, 4, value=612_345)  # mW

    def _c_memory(self, handle: Any, ref: Any) -> int:  # nvmlMemory_t v1: used has reserved
        return self._answer(handle, "nvmlDeviceGetMemoryInfo", ref, 24, total=143771 * 2**20,
                            used=(1024 + 551) * 2**20, free=142196 * 2**20)

    def _c_memory_v2(self, handle: Any, ref: Any) -> int:  # nvmlMemory_v2_t
        if ref._obj.version != pynvml.nvmlMemory_v2:
            return int(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return self._answer(handle, "nvmlDeviceGetMemoryInfo_v2", ref, 40,
                            version=pynvml.nvmlMemory_v2, total=143771 * 2**20,
                            reserved=551 * 2**20, used=1024 * 2**20, free=142196 * 2**20)

    def _engine(self, handle: Any, call: str, util: Any, period: Any, value: int) -> int:
        try:
            self._gpu(handle, call)
        except pynvml.NVMLError as exc:
            return int(exc.value)
        assert isinstance(util._obj, ctypes.c_uint) and isinstance(period._obj, ctypes.c_uint)
        util._obj.value, period._obj.value = value, 167_000
        return int(pynvml.NVML_SUCCESS)

    def _c_encoder(self, handle: Any, util: Any, period: Any) -> int:
        gpu = self.gpus[(address_of(handle) - 0x1000) // 0x100]
        return self._engine(handle, "nvmlDeviceGetEncoderUtilization", util, period, gpu.encoder)

    def _c_decoder(self, handle: Any, util: Any, period: Any) -> int:
        gpu = self.gpus[(address_of(handle) - 0x1000) // 0x100]
        return self._engine(handle, "nvmlDeviceGetDecoderUtilization", util, period, gpu.decoder)

    def _c_licensing(self, handle: Any, ref: Any) -> int:
        try:
            gpu = self._gpu(handle, "nvmlDeviceGetGridLicensableFeatures_v4")
        except pynvml.NVMLError as exc:
            return int(exc.value)
        out = ref._obj
        assert ctypes.sizeof(out) == ctypes.sizeof(pynvml.c_nvmlGridLicensableFeatures_v4_t)
        supported, features = gpu.licensing
        out.isGridLicenseSupported, out.licensableFeaturesCount = supported, len(features)
        for i, (code, state) in enumerate(features):
            out.gridLicensableFeatures[i].featureCode = code
            out.gridLicensableFeatures[i].featureState = state
        return int(pynvml.NVML_SUCCESS)

    def _c_reasons(self, handle: Any, ref: Any) -> int:
        return self._answer(handle, "nvmlDeviceGetCurrentClocksEventReasons", ref, 8,
                            value=int(pynvml.nvmlClocksEventReasonSwPowerCap))

    def _c_energy(self, handle: Any, ref: Any) -> int:
        return self._answer(handle, "nvmlDeviceGetTotalEnergyConsumption", ref, 8,
                            value=123_456_789)

    # -- the same through pynvml-level wrappers (built as pynvml builds them)
    @staticmethod
    def _wrapped(fn: Any, out: Any, *args: Any) -> Any:
        ret = fn(*args, ctypes.byref(out))
        if ret != pynvml.NVML_SUCCESS:
            raise nvml_error(ret)
        return out

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if not version:
            return self._wrapped(self._c_memory, pynvml.c_nvmlMemory_t(), handle)
        out = pynvml.c_nvmlMemory_v2_t()
        out.version = version
        return self._wrapped(self._c_memory_v2, out, handle)

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        util, period = ctypes.c_uint(), ctypes.c_uint()
        ret = self._c_encoder(handle, ctypes.byref(util), ctypes.byref(period))
        if ret != pynvml.NVML_SUCCESS:
            raise nvml_error(ret)
        return [util.value, period.value]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        util, period = ctypes.c_uint(), ctypes.c_uint()
        ret = self._c_decoder(handle, ctypes.byref(util), ctypes.byref(period))
        if ret != pynvml.NVML_SUCCESS:
            raise nvml_error(ret)
        return [util.value, period.value]

    def nvmlDeviceGetGridLicensableFeatures_v4(self, handle: Any) -> Any:
        return self._wrapped(self._c_licensing, pynvml.c_nvmlGridLicensableFeatures_v4_t(),
                             handle)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return self._wrapped(self._c_utilization, pynvml.c_nvmlUtilization_t(), handle)

    def nvmlDeviceGetClockInfo(self, handle: Any, kind: int) -> int:
        return int(self._wrapped(self._c_clock_info, ctypes.c_uint(), handle, kind).value)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return int(self._wrapped(self._c_temperature, ctypes.c_uint(), handle, sensor).value)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._wrapped(self._c_power, ctypes.c_uint(), handle).value)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(self._wrapped(self._c_reasons, ctypes.c_ulonglong(), handle).value)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(self._wrapped(self._c_energy, ctypes.c_ulonglong(), handle).value)

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetViolationStatus")
        self.calls[f"nvmlDeviceGetViolationStatus:{policy}"] += 1
        if policy not in gpu.violations:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        status = pynvml.c_nvmlViolationTime_t()
        status.referenceTime, status.violationTime = 1, gpu.violations[policy]
        return status

    # -- C function pointers, as pynvml's lookup serves them
    def _nvmlGetFunctionPointer(self, name: str) -> Any:
        self.calls[f"lookup:{name}"] += 1
        functions = {"nvmlDeviceGetFieldValues": self._field_values}
        if self.c_functions:
            functions.update({
                "nvmlDeviceGetUtilizationRates": self._c_utilization,
                "nvmlDeviceGetClockInfo": self._c_clock_info,
                "nvmlDeviceGetTemperature": self._c_temperature,
                "nvmlDeviceGetPowerUsage": self._c_power,
                "nvmlDeviceGetMemoryInfo": self._c_memory,
                "nvmlDeviceGetMemoryInfo_v2": self._c_memory_v2,
                "nvmlDeviceGetEncoderUtilization": self._c_encoder,
                "nvmlDeviceGetDecoderUtilization": self._c_decoder,
                "nvmlDeviceGetGridLicensableFeatures_v4": self._c_licensing,
                "nvmlDeviceGetCurrentClocksEventReasons": self._c_reasons,
                "nvmlDeviceGetTotalEnergyConsumption": self._c_energy,
                "nvmlGpmSampleGet": self._c_gpm_sample_get,
                "nvmlGpmMetricsGet": self._c_gpm_metrics_get,
            })
        if name not in functions:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return functions[name]

    def _field_values(self, handle: Any, count: ctypes.c_int32, values: Any) -> int:
        try:
            gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        except pynvml.NVMLError as exc:
            return int(exc.value)
        self.field_requests.append([values[i].fieldId for i in range(count.value)])
        self.field_scopes.append([values[i].scopeId for i in range(count.value)])
        nvlink = {pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: 0,
                  pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: 1}
        for i in range(count.value):
            entry = values[i]
            if entry.fieldId in nvlink and entry.fieldId not in gpu.field_errors:
                # per link by scopeId, or summed over every link for UINT_MAX, as nvml.h says
                links = gpu.nvlink_kib
                if not links:
                    entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                    continue
                column = [link[nvlink[entry.fieldId]] for link in links]
                scope = entry.scopeId
                if scope != 0xFFFFFFFF and scope >= len(links):
                    entry.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
                    continue
                entry.nvmlReturn = pynvml.NVML_SUCCESS
                entry.valueType = ULL
                entry.value.ullVal = sum(column) if scope == 0xFFFFFFFF else column[scope]
            elif entry.fieldId in gpu.field_errors:
                entry.nvmlReturn = gpu.field_errors[entry.fieldId]
            elif entry.fieldId in gpu.fields:
                kind, value = gpu.fields[entry.fieldId]
                entry.nvmlReturn = pynvml.NVML_SUCCESS
                entry.valueType = kind
                member = {ULL: "ullVal", UINT: "uiVal", DOUBLE: "dVal", SINT: "siVal"}[kind]
                setattr(entry.value, member, value)
            else:
                entry.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return int(pynvml.NVML_SUCCESS)

    # -- GPM
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm))

    def nvmlGpmSampleAlloc(self) -> Any:
        self.calls["nvmlGpmSampleAlloc"] += 1
        self._next_sample += 0x10
        self.samples_live.add(self._next_sample)
        return ctypes.cast(ctypes.c_void_p(self._next_sample), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.calls["nvmlGpmSampleFree"] += 1
        self.samples_live.remove(address_of(sample))

    def _c_gpm_sample_get(self, handle: Any, sample: Any) -> int:
        try:
            self._gpu(handle, "nvmlGpmSampleGet")
        except pynvml.NVMLError as exc:
            return int(exc.value)
        self._sequence += 1
        self.samples_taken[address_of(sample)] = self._sequence
        return int(pynvml.NVML_SUCCESS)

    def _c_gpm_metrics_get(self, ref: Any) -> int:
        request = ref._obj  # the request, by reference
        self.calls["nvmlGpmMetricsGet"] += 1
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        first = self.samples_taken[address_of(request.sample1)]
        second = self.samples_taken[address_of(request.sample2)]
        self.metric_pairs.append((first, second))
        asked = [request.metrics[i].metricId for i in range(request.numMetrics)]
        self.metric_requests.append(asked)
        gpu = self.gpus[0]
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in gpu.gpm_errors:
                metric.nvmlReturn = gpu.gpm_errors[metric.metricId]
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = gpu.gpm_values.get(metric.metricId, 0.0)
        return int(pynvml.NVML_SUCCESS)

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        ret = self._c_gpm_sample_get(handle, sample)
        if ret != pynvml.NVML_SUCCESS:
            raise nvml_error(ret)
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        ret = self._c_gpm_metrics_get(ctypes.byref(request))
        if ret != pynvml.NVML_SUCCESS:
            raise nvml_error(ret)
        return request

    # -- XID events
    def nvmlEventSetCreate(self) -> Any:
        self.calls["nvmlEventSetCreate"] += 1
        return ctypes.cast(ctypes.c_void_p(0x7000), pynvml.c_nvmlEventSet_t)

    def nvmlDeviceRegisterEvents(self, handle: Any, types: int, event_set: Any) -> None:
        self._gpu(handle, "nvmlDeviceRegisterEvents")
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self.registered.append(self.handles.index(handle))

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self.wait_timeouts.append(timeout_ms)
        if not self.pending_events:
            raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
        index, xid = self.pending_events.popleft()
        data = pynvml.c_nvmlEventData_t()
        data.device = self.handles[index]
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.calls["nvmlEventSetFree"] += 1


class FakeClock:
    """A monotonic clock the test moves by hand (GPM needs samples >= 0.1 s apart)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True, params=["c_functions", "wrappers"])
def nvml_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run each test through the C function pointers and through pynvml's wrappers."""
    monkeypatch.setattr(FakeNvml, "c_functions", request.param == "c_functions")
    return str(request.param)


def backend_for(*gpus: FakeGpu, clock: FakeClock | None = None) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml(list(gpus))
    return NvmlBackend(fake, clock=clock or FakeClock()), fake  # type: ignore[arg-type]


# ---------------------------------------------------------------- no driver


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, r"libnvidia-ml\.so\.1 not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    ],
)
def test_no_driver_raises_no_driver_error_naming_the_cause(code: int, cause: str) -> None:
    fake = FakeNvml([FakeGpu()], init_error=code)
    with pytest.raises(NoDriverError, match=cause) as info:
        NvmlBackend(fake)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_real_pynvml_without_a_driver_raises_no_driver_error() -> None:
    import ctypes.util

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NoDriverError, match=r"libnvidia-ml\.so\.1 not found"):
        NvmlBackend()


def test_pynvml_not_installed_raises_no_driver_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # `stepscope serve` imports the backend where it handles NoDriverError: one line.
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    for module in ("stepscope.gpu.nvml", "stepscope.gpu.libnvml"):
        monkeypatch.delitem(sys.modules, module)  # restored after the test
    with pytest.raises(NoDriverError, match="nvidia-ml-py"):
        importlib.import_module("stepscope.gpu.nvml")


# ---------------------------------------------------------------- devices


def test_devices_report_static_facts_in_dcgm_form() -> None:
    backend, _ = backend_for(FakeGpu(), FakeGpu(uuid="GPU-1", bus_id="00000000:2A:00.0", mig=0))
    gpu0, gpu1 = backend.devices()
    assert (gpu0.index, gpu0.uuid, gpu0.name) == (0, FakeGpu().uuid, "NVIDIA H200")
    assert gpu0.pci_bus_id == "00000000:18:00.0"
    assert gpu0.driver_version == "570.86.15"
    assert gpu0.serial == "1654923012345"
    assert gpu0.vbios_version == "96.00.99.00.01"
    assert gpu0.memory_total_mib == 143771
    assert gpu0.profiling_supported is True
    assert gpu0.mig_mode == "unsupported"
    assert gpu0.device == "nvidia0"
    assert (gpu1.index, gpu1.uuid, gpu1.pci_bus_id, gpu1.mig_mode) == (
        1, "GPU-1", "00000000:2A:00.0", "disabled")


def test_gpu_without_handle_at_start_is_listed_and_reads_down() -> None:
    broken = FakeGpu(fail={"nvmlDeviceGetHandleByIndex": pynvml.NVML_ERROR_UNKNOWN})
    backend, _ = backend_for(broken, FakeGpu(uuid="GPU-1"))
    gpu0, gpu1 = backend.devices()
    assert (gpu0.index, gpu0.uuid) == (0, "")
    assert gpu1.uuid == "GPU-1"
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)
    assert backend.read(1, FAST).values["gpu_util"] == 97


def test_unsupported_static_fact_leaves_the_gpu_up() -> None:
    backend, _ = backend_for(FakeGpu(fail={"nvmlDeviceGetSerial": pynvml.NVML_ERROR_NOT_SUPPORTED}))
    (gpu,) = backend.devices()
    assert gpu.serial == ""
    assert backend.read(0, FAST).values["gpu_util"] == 97


# ---------------------------------------------------------------- reads


def test_fast_read_fills_every_fast_key_with_dcgm_units() -> None:
    backend, _ = backend_for(FakeGpu())
    reading = backend.read(0, FAST)
    v = reading.values
    assert reading.errors == 0
    assert (v["gpu_util"], v["mem_copy_util"]) == (97, 35)
    assert (v["sm_clock"], v["mem_clock"], v["gpu_temp"]) == (1980, 3201, 52)
    assert v["power_usage"] == pytest.approx(612.345)
    assert (v["fb_used"], v["fb_free"], v["fb_reserved"]) == (1024, 142196, 551)
    assert (v["enc_util"], v["dec_util"]) == (0, 0)
    assert v["clocks_event_reasons"] == 0x4
    assert v["memory_temp"] == 41
    assert v["ecc_sbe_agg_total"] == 2**40 + 7
    assert (v["ecc_sbe_vol_total"], v["ecc_dbe_vol_total"], v["ecc_dbe_agg_total"]) == (3, 0, 1)
    assert (v["correctable_remapped_rows"], v["uncorrectable_remapped_rows"]) == (2, 0)
    assert (v["row_remap_pending"], v["row_remap_failure"]) == (0, 0)
    assert not SLOW_KEYS & v.keys()


def test_reads_call_the_c_functions_resolved_once_not_the_wrappers(nvml_path: str) -> None:
    if nvml_path != "c_functions":
        pytest.skip("the wrapper path is what the other run exercises")
    clock = FakeClock()
    backend, fake = backend_for(FakeGpu(), clock=clock)
    lookups = {name: n for name, n in fake.calls.items() if name.startswith("lookup:")}

    def no_wrapper(*args: Any) -> Any:
        raise AssertionError("a read went through a pynvml wrapper")

    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo",
                 "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage",
                 "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetTotalEnergyConsumption", "nvmlGpmSampleGet",
                 "nvmlGpmMetricsGet", "nvmlDeviceGetEncoderUtilization",
                 "nvmlDeviceGetDecoderUtilization", "nvmlDeviceGetGridLicensableFeatures_v4"):
        setattr(fake, name, no_wrapper)
    for _ in range(3):
        clock.now += 1
        reading = backend.read(0, BOTH)
        assert reading.errors == 0
        assert reading.values["fb_used"] == 1024 and reading.values["sm_active"] == 0
    assert {n: c for n, c in fake.calls.items() if n.startswith("lookup:")} == lookups
    assert fake.calls["nvmlDeviceGetClockInfo"] == 6 and fake.calls["nvmlGpmMetricsGet"] == 3


def test_driver_without_the_clocks_event_symbol_uses_the_throttle_reasons_one(
    nvml_path: str,
) -> None:
    # Drivers before 535 export the same function only under its old name.
    fake = FakeNvml([FakeGpu()])
    lookup = fake._nvmlGetFunctionPointer

    def old_driver(name: str) -> Any:
        if name == "nvmlDeviceGetCurrentClocksThrottleReasons":
            name = "nvmlDeviceGetCurrentClocksEventReasons"
        elif name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return lookup(name)

    fake._nvmlGetFunctionPointer = old_driver  # type: ignore[method-assign]
    reading = NvmlBackend(fake, clock=FakeClock()).read(0, FAST)  # type: ignore[arg-type]
    assert reading.values["clocks_event_reasons"] == 0x4 and reading.errors == 0


def test_non_nvml_exception_in_a_getter_counts_as_an_error() -> None:
    fake = FakeNvml([FakeGpu()])

    def broken(*args: Any) -> Any:
        raise RuntimeError("broken binding")

    fake._c_power = broken  # type: ignore[method-assign]
    fake.nvmlDeviceGetPowerUsage = broken  # type: ignore[method-assign]
    backend = NvmlBackend(fake, clock=FakeClock())  # type: ignore[arg-type]
    for _ in range(2):  # not "unsupported": asked again
        reading = backend.read(0, FAST)
        assert "power_usage" not in reading.values and reading.errors == 1
        assert reading.values["gpu_util"] == 97


def test_slow_keys_only_when_the_slow_tier_is_asked_for() -> None:
    backend, fake = backend_for(FakeGpu())
    backend.read(0, FAST)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0
    v = backend.read(0, BOTH).values
    assert v["total_energy"] == 123_456_789
    assert v["power_violation"] == 5_000_000_000
    assert v["thermal_violation"] == 1_250  # sw + hw thermal slowdown
    assert v["sync_boost_violation"] == 0
    assert v["board_limit_violation"] == 77
    assert v["pcie_replay"] == 12
    assert {k for k, _ in CLOCK_EVENT_DURATION_KEYS} <= v.keys()
    assert v["clock_event_ns.hw_thermal_slowdown"] == 250
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 0
    # GPM and the NVLink bandwidth rate have no window yet here
    assert v.keys() >= SLOW_KEYS - PROFILING_KEYS - {"nvlink_bandwidth_total"}
    slow_only = backend.read(0, frozenset({Tier.SLOW})).values
    assert "gpu_util" not in slow_only and slow_only["total_energy"] == 123_456_789


def test_gpu_that_falls_off_the_bus_reads_down_while_the_other_reports() -> None:
    lost = FakeGpu(fail={"nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_GPU_IS_LOST})
    backend, _ = backend_for(lost, FakeGpu(uuid="GPU-1"))
    with pytest.raises(GpuUnavailable, match="GPU is lost"):
        backend.read(0, FAST)
    reading = backend.read(1, BOTH)
    assert reading.values["gpu_util"] == 97 and reading.errors == 0


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_NOT_FOUND, pynvml.NVML_ERROR_UNINITIALIZED])
def test_gone_device_codes_read_down(code: int) -> None:
    backend, _ = backend_for(FakeGpu(fail={"nvmlDeviceGetTemperature": code}))
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)


def test_lost_gpu_reported_inside_field_values_reads_down() -> None:
    gpu = FakeGpu(field_errors={pynvml.NVML_FI_DEV_MEMORY_TEMP: pynvml.NVML_ERROR_GPU_IS_LOST})
    backend, _ = backend_for(gpu)
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)


def test_unsupported_getter_is_absent_and_not_called_again() -> None:
    backend, fake = backend_for(FakeGpu(fail={
        "nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
        "nvmlDeviceGetCurrentClocksEventReasons": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    }))
    for _ in range(3):
        reading = backend.read(0, FAST)
        assert "power_usage" not in reading.values
        assert "clocks_event_reasons" not in reading.values
        assert reading.errors == 0
        assert reading.values["gpu_util"] == 97
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 3


def test_other_getter_error_counts_and_is_retried() -> None:
    timeout = pynvml.NVML_ERROR_TIMEOUT
    backend, fake = backend_for(FakeGpu(fail={"nvmlDeviceGetTemperature": timeout}))
    for _ in range(2):
        reading = backend.read(0, FAST)
        assert "gpu_temp" not in reading.values
        assert reading.errors == 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 2


def test_one_unknown_error_is_a_collect_error_but_all_unknown_is_down() -> None:
    one = FakeGpu(fail={"nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_UNKNOWN})
    backend, _ = backend_for(one)
    reading = backend.read(0, FAST)
    assert reading.errors == 2  # SM and memory clock
    assert "sm_clock" not in reading.values and reading.values["gpu_util"] == 97

    unknown = pynvml.NVML_ERROR_UNKNOWN
    every = {name: unknown for name in (
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetFieldValues",
        "nvmlGpmSampleGet")}
    gpu = FakeGpu()
    backend, _ = backend_for(gpu, clock=(clock := FakeClock()))
    gpu.fail.update(every)  # after start: the GPU stops answering
    clock.now += 1
    with pytest.raises(GpuUnavailable, match="Unknown"):
        backend.read(0, FAST)


def test_unsupported_field_ids_are_dropped_from_the_batch() -> None:
    fields = default_fields()
    del fields[pynvml.NVML_FI_DEV_MEMORY_TEMP]
    gpu = FakeGpu(fields=fields,
                  field_errors={pynvml.NVML_FI_DEV_REMAPPED_COR: pynvml.NVML_ERROR_NO_DATA})
    backend, fake = backend_for(gpu)
    first = backend.read(0, FAST)
    second = backend.read(0, FAST)
    assert "memory_temp" not in second.values
    assert "correctable_remapped_rows" not in second.values
    assert first.errors == second.errors == 1  # the transient per-field error
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP in fake.field_requests[0]
    assert pynvml.NVML_FI_DEV_MEMORY_TEMP not in fake.field_requests[1]
    assert pynvml.NVML_FI_DEV_REMAPPED_COR in fake.field_requests[1]  # retried


def test_violation_counters_fall_back_where_field_ids_are_unsupported() -> None:
    fields = default_fields()
    for fid in (SW_THERM, HW_THERM, POWER_BRAKE):  # an older driver: no clock-event fields
        del fields[fid]
    gpu = FakeGpu(fields=fields, violations={pynvml.NVML_PERF_POLICY_THERMAL: 9_000})
    backend, fake = backend_for(gpu)
    for _ in range(2):
        v = backend.read(0, BOTH).values
        assert v["thermal_violation"] == 9_000  # nvmlDeviceGetViolationStatus(THERMAL)
        assert v["power_violation"] == 5_000_000_000  # still from its field id
        assert "clock_event_ns.sw_thermal_slowdown" not in v
        assert v["clock_event_ns.sw_power_cap"] == 5_000_000_000
    assert fake.calls[f"nvmlDeviceGetViolationStatus:{pynvml.NVML_PERF_POLICY_THERMAL}"] == 2
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2  # only the thermal fallback
    assert SW_THERM not in fake.field_requests[-1]  # not asked again


def test_violation_fallback_that_is_unsupported_too_is_not_retried() -> None:
    backend, fake = backend_for(FakeGpu(fields={}))  # no field id works, no policy either
    for _ in range(3):
        reading = backend.read(0, frozenset({Tier.SLOW}))
        assert reading.errors == 0
        assert not {"thermal_violation", "power_violation"} & reading.values.keys()
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 4  # four policies, once each


def test_field_values_call_unsupported_falls_back_for_every_violation() -> None:
    policies = {pynvml.NVML_PERF_POLICY_POWER: 1, pynvml.NVML_PERF_POLICY_THERMAL: 2,
                pynvml.NVML_PERF_POLICY_SYNC_BOOST: 3, pynvml.NVML_PERF_POLICY_BOARD_LIMIT: 4}
    gpu = FakeGpu(fail={"nvmlDeviceGetFieldValues": pynvml.NVML_ERROR_NOT_SUPPORTED},
                  violations=policies)
    backend, fake = backend_for(gpu)
    backend.read(0, BOTH)
    v = backend.read(0, BOTH).values
    assert (v["power_violation"], v["thermal_violation"]) == (1, 2)
    assert (v["sync_boost_violation"], v["board_limit_violation"]) == (3, 4)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 3  # once per batch (FAST, SLOW, NVLink)


# ---------------------------------------------------------------- GPM


def gpm_gpu(**values: float) -> FakeGpu:
    return FakeGpu(gpm_values={getattr(pynvml, f"NVML_GPM_METRIC_{k}"): v
                               for k, v in values.items()})


def test_gpm_unsupported_gives_no_profiling_keys() -> None:
    clock = FakeClock()
    backend, fake = backend_for(FakeGpu(gpm=False), clock=clock)
    assert backend.devices()[0].profiling_supported is False
    for _ in range(3):
        clock.now += 1
        assert not PROFILING_KEYS & backend.read(0, FAST).values.keys()
    assert fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_metrics_are_scaled_to_dcgm_units_and_ratios_clamped() -> None:
    clock = FakeClock()
    gpu = gpm_gpu(SM_UTIL=42.0, ANY_TENSOR_UTIL=104.0, HMMA_TENSOR_UTIL=-0.5,
                  PCIE_TX_PER_SEC=2.0, NVLINK_TOTAL_RX_PER_SEC=1.5)
    gpu.gpm_errors = {pynvml.NVML_GPM_METRIC_FP16_UTIL: pynvml.NVML_ERROR_NOT_SUPPORTED}
    backend, fake = backend_for(gpu, clock=clock)
    clock.now += 1.0
    v = backend.read(0, FAST).values
    assert v["sm_active"] == pytest.approx(0.42)
    assert v["pipe_tensor_active"] == 1.0
    assert v["pipe_tensor_hmma_active"] == 0.0
    assert v["pcie_tx_bytes"] == 2 * 2**20
    assert v["nvlink_rx_bytes"] == 1.5 * 2**20
    assert "pipe_fp16_active" not in v
    assert PROFILING_KEYS - SLOW_KEYS - {"pipe_fp16_active"} <= v.keys()
    assert "gr_engine_active" not in v  # costly on real GPUs: slow tier only
    assert fake.metric_pairs == [(1, 2)]  # sample1 is the older sample
    clock.now += 1.0
    backend.read(0, FAST)
    assert fake.metric_pairs == [(1, 2), (2, 3)]  # buffers swapped: the newest is the base


def test_gpm_keeps_previous_values_when_samples_are_too_close() -> None:
    clock = FakeClock()
    gpu = gpm_gpu(SM_UTIL=60.0)
    backend, fake = backend_for(gpu, clock=clock)
    clock.now += 0.05  # first read right after start: nothing to compute from yet
    assert "sm_active" not in backend.read(0, FAST).values
    assert fake.calls["nvmlGpmSampleGet"] == 1  # only the baseline
    clock.now += 1.0
    assert backend.read(0, FAST).values["sm_active"] == pytest.approx(0.6)
    gpu.gpm_values[pynvml.NVML_GPM_METRIC_SM_UTIL] = 10.0
    clock.now += 0.05
    assert backend.read(0, FAST).values["sm_active"] == pytest.approx(0.6)
    assert fake.calls["nvmlGpmSampleGet"] == 2
    clock.now += 0.2
    assert backend.read(0, FAST).values["sm_active"] == pytest.approx(0.1)


def test_gpm_metric_on_the_slow_tier_is_computed_only_on_slow_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GRAPHICS_UTIL costs ~1.4 ms CPU per computation on an H200: if the field table
    # puts gr_engine_active on the SLOW tier, the backend must follow it.
    from stepscope.gpu import nvml as backend_module

    graphics = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    key, scale, ratio, _ = backend_module._GPM_KEYS[graphics]
    monkeypatch.setitem(backend_module._GPM_KEYS, graphics, (key, scale, ratio, Tier.SLOW))
    clock = FakeClock()
    backend, fake = backend_for(gpm_gpu(GRAPHICS_UTIL=80.0, SM_UTIL=70.0), clock=clock)
    clock.now += 1
    fast = backend.read(0, FAST).values
    assert "gr_engine_active" not in fast and fast["sm_active"] == pytest.approx(0.7)
    assert graphics not in fake.metric_requests[-1]
    clock.now += 1
    both = backend.read(0, BOTH).values
    assert both["gr_engine_active"] == pytest.approx(0.8)
    assert both["sm_active"] == pytest.approx(0.7)
    clock.now += 1
    slow = backend.read(0, frozenset({Tier.SLOW})).values
    assert fake.metric_requests[-1] == [graphics]
    assert slow["gr_engine_active"] == pytest.approx(0.8) and "sm_active" not in slow


def test_slow_tier_profiling_keys_are_computed_only_on_slow_reads() -> None:
    clock = FakeClock()
    backend, _ = backend_for(gpm_gpu(SM_UTIL=70.0), clock=clock)
    clock.now += 1
    slow = backend.read(0, frozenset({Tier.SLOW})).values
    assert PROFILING_KEYS & slow.keys() == PROFILING_KEYS & SLOW_KEYS == {"gr_engine_active"}
    clock.now += 1
    fast = backend.read(0, FAST).values
    assert "gr_engine_active" not in fast and fast["sm_active"] == pytest.approx(0.7)


def test_gpm_skipped_on_mig_enabled_gpus() -> None:
    clock = FakeClock()
    backend, fake = backend_for(FakeGpu(mig=pynvml.NVML_DEVICE_MIG_ENABLE), clock=clock)
    gpu = backend.devices()[0]
    assert (gpu.mig_mode, gpu.profiling_supported) == ("enabled", False)
    clock.now += 1
    assert not PROFILING_KEYS & backend.read(0, FAST).values.keys()
    assert fake.calls["nvmlGpmSampleAlloc"] == 0


def test_gpm_not_permitted_at_start_means_no_profiling_and_nothing_leaked() -> None:
    gpu = FakeGpu(fail={"nvmlGpmSampleGet": pynvml.NVML_ERROR_NO_PERMISSION})
    backend, fake = backend_for(gpu)
    assert backend.devices()[0].profiling_supported is False
    assert fake.samples_live == set()
    assert backend.read(0, FAST).errors == 0


def test_close_frees_gpm_samples_and_event_set_once() -> None:
    backend, fake = backend_for(FakeGpu(), FakeGpu())
    assert len(fake.samples_live) == 4
    backend.close()
    backend.close()
    assert fake.samples_live == set()
    assert fake.calls["nvmlEventSetFree"] == 1
    assert fake.calls["nvmlShutdown"] == 1
    assert backend.events() == []
    with pytest.raises(GpuUnavailable):
        backend.read(0, FAST)


# ---------------------------------------------------------------- XID events


def test_xid_drain_returns_every_pending_event_on_the_right_gpu_without_blocking() -> None:
    backend, fake = backend_for(FakeGpu(), FakeGpu(), FakeGpu())
    assert fake.registered == [0, 1, 2]
    fake.pending_events.extend([(2, 79), (0, 13), (2, 48)])
    before = time.time()
    events = backend.events()
    assert [(e.index, e.xid) for e in events] == [(2, 79), (0, 13), (2, 48)]
    assert all(before <= e.timestamp <= time.time() for e in events)
    assert backend.events() == []
    assert set(fake.wait_timeouts) == {0}  # never waits


def test_gpu_without_xid_support_is_skipped_and_others_still_report() -> None:
    no_events = FakeGpu(fail={"nvmlDeviceRegisterEvents": pynvml.NVML_ERROR_NOT_SUPPORTED})
    backend, fake = backend_for(no_events, FakeGpu())
    assert fake.registered == [1]
    fake.pending_events.append((1, 31))
    assert [(e.index, e.xid) for e in backend.events()] == [(1, 31)]
    assert backend.read(0, FAST).values["gpu_util"] == 97


def test_an_unsupported_field_values_call_does_not_count_as_an_answer() -> None:
    # With its batch emptied, a GPU whose every call says "unknown" still reads down.
    gpu = FakeGpu(fail={"nvmlDeviceGetFieldValues": pynvml.NVML_ERROR_NOT_SUPPORTED})
    backend, fake = backend_for(gpu, clock=(clock := FakeClock()))
    assert backend.read(0, FAST).errors == 0
    unknown = pynvml.NVML_ERROR_UNKNOWN
    gpu.fail.update({name: unknown for name in (
        "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlGpmSampleGet")})
    clock.now += 1
    with pytest.raises(GpuUnavailable, match="Unknown"):
        backend.read(0, FAST)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 1  # once, then never


def test_a_field_value_that_changes_is_read_anew() -> None:
    gpu = FakeGpu()
    backend, _ = backend_for(gpu)
    assert [backend.read(0, FAST).values["memory_temp"] for _ in range(2)] == [41, 41]
    gpu.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (UINT, 44)
    assert backend.read(0, FAST).values["memory_temp"] == 44
    gpu.fields[pynvml.NVML_FI_DEV_MEMORY_TEMP] = (DOUBLE, 45.5)  # another value type
    assert backend.read(0, FAST).values["memory_temp"] == 45.5
    assert backend.read(0, FAST).values["memory_temp"] == 45.5


# GPM answers: finite, NaN and infinite, negative and above 100 %, as a driver can give.
_GPM_VALUES = st.one_of(
    st.floats(min_value=-10.0, max_value=200.0),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 100.0, 1e300]),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(_GPM_VALUES, min_size=len(GPM_METRICS), max_size=len(GPM_METRICS)),
       failing=st.sets(st.sampled_from([m for m, _, _ in GPM_METRICS]), max_size=2))
def test_gpm_values_are_scaled_clamped_and_non_finite_ones_left_out(
    values: list[float], failing: set[int],
) -> None:
    # What a reader of docs/metrics.md expects, computed the plain way: a metric that
    # failed or is not finite is absent; the rest are scaled; ratios are clamped to 0-1.
    gpu = FakeGpu(gpm_values={m: v for (m, _, _), v in zip(GPM_METRICS, values, strict=True)},
                  gpm_errors=dict.fromkeys(failing, pynvml.NVML_ERROR_UNKNOWN))
    clock = FakeClock()
    backend, _ = backend_for(gpu, clock=clock)
    clock.now += 1
    got = backend.read(0, BOTH).values
    expected = {}
    for (metric_id, key, scale), value in zip(GPM_METRICS, values, strict=True):
        if metric_id in failing or not math.isfinite(value):
            continue
        value *= scale
        if FIELDS_BY_KEY[key].unit == "ratio":
            value = min(max(value, 0.0), 1.0)
        expected[key] = value
    assert {k: got[k] for k in PROFILING_KEYS & got.keys()} == expected
    for key in expected:  # the same float, not merely a close one (-0.0 stays -0.0)
        assert math.copysign(1.0, got[key]) == math.copysign(1.0, expected[key])


# ---------------------------------------------------------------- libnvml


@pytest.mark.parametrize(
    ("code", "failure", "per_value"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_DEPRECATED, Failure.UNSUPPORTED, Failure.UNSUPPORTED),
        # a field id this driver does not know: only inside a batch does it mean that
        (pynvml.NVML_ERROR_INVALID_ARGUMENT, Failure.ERROR, Failure.UNSUPPORTED),
        (pynvml.NVML_ERROR_GPU_IS_LOST, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_GPU_NOT_FOUND, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_RESET_REQUIRED, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_UNINITIALIZED, Failure.GPU_LOST, Failure.GPU_LOST),
        (pynvml.NVML_ERROR_UNKNOWN, Failure.UNKNOWN, Failure.UNKNOWN),
        (pynvml.NVML_ERROR_TIMEOUT, Failure.ERROR, Failure.ERROR),
        (pynvml.NVML_ERROR_NO_PERMISSION, Failure.ERROR, Failure.ERROR),
        (pynvml.NVML_ERROR_NO_DATA, Failure.ERROR, Failure.ERROR),
        (-1, Failure.ERROR, Failure.ERROR),  # an exception that is not an NVML error
    ],
)
def test_error_policy_says_what_each_nvml_error_means(
    code: int, failure: Failure, per_value: Failure,
) -> None:
    assert classify(code) is failure
    assert classify(code, per_value=True) is per_value


def test_error_code_of_pynvml_and_other_exceptions() -> None:
    assert libnvml.error_code(nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)) == 15
    assert libnvml.error_code(RuntimeError("broken binding")) == -1


def _libnvml_names() -> list[str]:
    return [name for name in vars(libnvml)
            if name.startswith(("NVML_", "nvmlEventType")) and hasattr(pynvml, name)]


@pytest.mark.parametrize("name", _libnvml_names())
def test_code_tables_are_pynvmls_own_constants(name: str) -> None:
    assert getattr(libnvml, name) == getattr(pynvml, name)


def test_every_code_libnvml_names_is_one_pynvml_has() -> None:
    names = [n for n in vars(libnvml) if n.startswith(("NVML_", "nvmlEventType"))]
    assert len(names) == len(_libnvml_names()) > 50


def test_field_ids_read_are_pynvmls_named_field_ids() -> None:
    by_key = {key: fid for fid, key in FAST_FIELD_IDS + SLOW_FIELD_IDS}
    assert by_key == {
        "memory_temp": pynvml.NVML_FI_DEV_MEMORY_TEMP,
        "ecc_sbe_vol_total": pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        "ecc_dbe_vol_total": pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        "ecc_sbe_agg_total": pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        "ecc_dbe_agg_total": pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        "correctable_remapped_rows": pynvml.NVML_FI_DEV_REMAPPED_COR,
        "uncorrectable_remapped_rows": pynvml.NVML_FI_DEV_REMAPPED_UNC,
        "row_remap_pending": pynvml.NVML_FI_DEV_REMAPPED_PENDING,
        "row_remap_failure": pynvml.NVML_FI_DEV_REMAPPED_FAILURE,
        "clock_event_ns.sw_power_cap": SW_POWER,
        "clock_event_ns.sync_boost": SYNC_BOOST,
        "clock_event_ns.sw_thermal_slowdown": SW_THERM,
        "clock_event_ns.hw_thermal_slowdown": HW_THERM,
        "clock_event_ns.hw_power_brake_slowdown": POWER_BRAKE,
        "board_limit_violation": BOARD_LIMIT,
        "pcie_replay": pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    }


def test_gpm_metric_ids_of_the_field_table_are_pynvmls() -> None:
    # gpu/fields.py holds the ids as numbers (it must not import pynvml).
    names = {
        "gr_engine_active": "GRAPHICS_UTIL", "sm_active": "SM_UTIL",
        "sm_occupancy": "SM_OCCUPANCY", "pipe_tensor_active": "ANY_TENSOR_UTIL",
        "pipe_tensor_dfma_active": "DFMA_TENSOR_UTIL",
        "pipe_tensor_hmma_active": "HMMA_TENSOR_UTIL",
        "pipe_tensor_imma_active": "IMMA_TENSOR_UTIL", "dram_active": "DRAM_BW_UTIL",
        "pipe_fp64_active": "FP64_UTIL", "pipe_fp32_active": "FP32_UTIL",
        "pipe_fp16_active": "FP16_UTIL", "pcie_tx_bytes": "PCIE_TX_PER_SEC",
        "pcie_rx_bytes": "PCIE_RX_PER_SEC", "nvlink_rx_bytes": "NVLINK_TOTAL_RX_PER_SEC",
        "nvlink_tx_bytes": "NVLINK_TOTAL_TX_PER_SEC",
    }
    assert {key: metric_id for metric_id, key, _ in GPM_METRICS} == {
        key: getattr(pynvml, f"NVML_GPM_METRIC_{name}") for key, name in names.items()}


# What nvidia-ml-py 12.535 (the oldest the package allows) does not define.
_NOT_IN_12_535 = (
    "NVML_ERROR_GPU_NOT_FOUND",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
    "NVML_VALUE_TYPE_UNSIGNED_SHORT",
)


def test_with_an_old_pynvml_the_missing_codes_default_to_nvml_h(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = types.ModuleType("pynvml")
    old.__dict__.update({k: v for k, v in vars(pynvml).items() if k not in _NOT_IN_12_535})
    monkeypatch.setitem(sys.modules, "pynvml", old)
    # a private copy of the module: the backend keeps using the real one
    spec = importlib.util.spec_from_file_location("libnvml_on_old_pynvml", libnvml.__file__)
    assert spec is not None and spec.loader is not None
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    for name in _NOT_IN_12_535:
        assert getattr(copy, name) == getattr(pynvml, name), name
    assert copy.GPU_LOST_CODES == libnvml.GPU_LOST_CODES


def test_field_value_array_decodes_every_value_type() -> None:
    kinds = {  # nvmlValueType_t -> (member of the value union, a value)
        pynvml.NVML_VALUE_TYPE_DOUBLE: ("dVal", -2.5),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: ("uiVal", 2**32 - 1),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: ("ulVal", 2**63 + 1),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: ("ullVal", 2**64 - 1),
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: ("sllVal", -(2**62)),
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: ("siVal", -7),
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: ("usVal", 65535),
    }
    request = libnvml.FieldValueArray(range(100, 100 + len(kinds)))
    assert request.values() is None  # no types learnt yet
    for entry, (kind, (member, value)) in zip(request.array, kinds.items(), strict=True):
        entry.valueType, entry.nvmlReturn = kind, pynvml.NVML_SUCCESS
        setattr(entry.value, member, value)
    expected = [float(value) for _, value in kinds.values()]
    assert [value for _, _, value in request.answers()] == expected
    assert list(map(float, request.values() or ())) == expected  # learnt: one unpack
    request.array[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert request.values() is None
    assert request.answers()[1] == (101, pynvml.NVML_ERROR_NOT_SUPPORTED, None)
