"""A fake NVML for NvmlBackend: what a user of a real GPU node would notice, without one.

The fake implements exactly the pynvml functions the backend calls and raises
pynvml's own exception classes, so the error handling under test is the one a
real driver triggers. Constants and ctypes structs come from the real pynvml.

The backend calls the per-read getters and GPM through their C function pointers
(``_nvmlGetFunctionPointer``), with the nvml.h calling convention: outputs by
reference, an ``nvmlReturn_t`` back. The fake serves those as Python functions that
check the output buffer's size as the C ABI needs it, and its pynvml-level wrappers
are built on them as pynvml's are. ``FakeNvml.c_functions`` False leaves only
``nvmlDeviceGetFieldValues`` resolvable, so that the backend goes through the wrappers
it falls back to (the ``nvml_path`` fixture of tests/unit/gpu runs a test both ways).
"""

from __future__ import annotations

import ctypes
import inspect
from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from stepscope.gpu.model import Tier
from stepscope.gpu.nvml_backend import NvmlBackend
from tests.support.clocks import ManualClock

FAST = frozenset({Tier.FAST})
SLOW = frozenset({Tier.SLOW})
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
    enforced_limit_mw: int = 700_000  # the default's unless an operator lowered it
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

    def _c_enforced_limit(self, handle: Any, ref: Any) -> int:
        gpu = self.gpus[(address_of(handle) - 0x1000) // 0x100]
        return self._answer(handle, "nvmlDeviceGetEnforcedPowerLimit", ref, 4,
                            value=gpu.enforced_limit_mw)

    def _c_default_limit(self, handle: Any, ref: Any) -> int:
        return self._answer(handle, "nvmlDeviceGetPowerManagementDefaultLimit", ref, 4,
                            value=700_000)  # mW: an H200's

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

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(self._wrapped(self._c_enforced_limit, ctypes.c_uint(), handle).value)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return int(self._wrapped(self._c_default_limit, ctypes.c_uint(), handle).value)

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
                "nvmlDeviceGetEnforcedPowerLimit": self._c_enforced_limit,
                "nvmlDeviceGetPowerManagementDefaultLimit": self._c_default_limit,
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



def backend_for(*gpus: FakeGpu, clock: ManualClock | None = None) -> tuple[NvmlBackend, FakeNvml]:
    """An NvmlBackend over a fake NVML of ``gpus``, and the fake."""
    fake = FakeNvml(list(gpus))
    return NvmlBackend(fake, clock=clock or ManualClock()), fake  # type: ignore[arg-type]

