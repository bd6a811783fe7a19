"""The one compatibility layer over pynvml: NVML's codes, plain ctypes mirrors, value
decoding, one error policy.

Everything the NVML backend (:mod:`stepscope.gpu.nvml_backend` and the modules it reads
through) needs to talk to NVML through any nvidia-ml-py from 12.535 on, and nothing
about devices or about which key a call fills (that is the field table's binding):

- NVML's return codes, field ids and enums, re-exported from pynvml under their own
  names; ``getattr(pynvml, name, default)`` only for the few that nvidia-ml-py 12.535
  lacks (the default is the value in nvml.h). :func:`constant` resolves a name a
  binding gives.
- Plain ctypes twins of pynvml's structs (:func:`plain_ctype`), the reusable
  ``nvmlFieldValue_t`` and ``nvmlGpmMetricsGet_t`` requests and their decoding with one
  ``struct`` unpack (:class:`FieldValueArray`, :class:`GpmMetricsRequest`).
- NVML's C functions called directly (:func:`resolve`), or pynvml's wrappers adapted
  to the same convention where a symbol does not resolve.
- The error policy (:func:`classify`): what an NVML error code means to the caller.

Error policy. "Not supported" (and "function not found", "argument version mismatch",
"deprecated"; inside a batch of values also "invalid argument", which is how a driver
answers a field id it does not know) means :attr:`Failure.UNSUPPORTED`: the key is
absent and the call is not made again. "GPU is lost", "GPU not found", "reset
required" and "uninitialized" (an invalid handle) mean :attr:`Failure.GPU_LOST`: the
backend raises :class:`~stepscope.gpu.model.GpuUnavailable` and that GPU is marked down.
"Unknown error" is :attr:`Failure.UNKNOWN`: an error, and a read in which every call
answered it means the GPU is gone. Anything else is :attr:`Failure.ERROR`: a collect
error, asked again on the next read. At start, any failure of ``nvmlInit`` means there
is no usable driver (:func:`no_driver`).

Importing this module without nvidia-ml-py raises
:class:`~stepscope.gpu.model.NoDriverError`, as a host without a driver does.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from stepscope.gpu.model import NoDriverError

try:
    import pynvml as pynvml  # re-exported: NvmlBackend's module when none is given
except ImportError as exc:  # a declared dependency: its absence reads as "no driver"
    raise NoDriverError(
        f"the nvidia-ml-py package (import pynvml) is not installed: {exc}"
    ) from exc

log = logging.getLogger(__name__)

#: NVML return codes (nvmlReturn_t).
NVML_SUCCESS: int = pynvml.NVML_SUCCESS
NVML_ERROR_UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
NVML_ERROR_INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NVML_ERROR_NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NVML_ERROR_NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NVML_ERROR_DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
NVML_ERROR_TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
NVML_ERROR_LIBRARY_NOT_FOUND: int = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
NVML_ERROR_FUNCTION_NOT_FOUND: int = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
NVML_ERROR_GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
NVML_ERROR_RESET_REQUIRED: int = pynvml.NVML_ERROR_RESET_REQUIRED
NVML_ERROR_LIB_RM_VERSION_MISMATCH: int = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
NVML_ERROR_ARGUMENT_VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
NVML_ERROR_DEPRECATED: int = pynvml.NVML_ERROR_DEPRECATED
NVML_ERROR_GPU_NOT_FOUND: int = getattr(pynvml, "NVML_ERROR_GPU_NOT_FOUND", 28)
NVML_ERROR_UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

#: Field ids (NVML_FI_DEV_*).
NVML_FI_DEV_ECC_SBE_VOL_TOTAL: int = pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL
NVML_FI_DEV_ECC_DBE_VOL_TOTAL: int = pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL
NVML_FI_DEV_ECC_SBE_AGG_TOTAL: int = pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL
NVML_FI_DEV_ECC_DBE_AGG_TOTAL: int = pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL
NVML_FI_DEV_PERF_POLICY_POWER: int = pynvml.NVML_FI_DEV_PERF_POLICY_POWER
NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: int = pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: int = pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT
NVML_FI_DEV_MEMORY_TEMP: int = pynvml.NVML_FI_DEV_MEMORY_TEMP
NVML_FI_DEV_PCIE_REPLAY_COUNTER: int = pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER
NVML_FI_DEV_REMAPPED_COR: int = pynvml.NVML_FI_DEV_REMAPPED_COR
NVML_FI_DEV_REMAPPED_UNC: int = pynvml.NVML_FI_DEV_REMAPPED_UNC
NVML_FI_DEV_REMAPPED_PENDING: int = pynvml.NVML_FI_DEV_REMAPPED_PENDING
NVML_FI_DEV_REMAPPED_FAILURE: int = pynvml.NVML_FI_DEV_REMAPPED_FAILURE
# NVLink data counters in KiB, per link (scopeId) or summed over every link (scopeId
# SCOPE_ALL_LINKS); what DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is computed from.
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: int = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: int = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
# The clock-event durations came with NVML 12.4; the first two are the perf-policy ids
# under their new names.
NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: int = getattr(
    pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", NVML_FI_DEV_PERF_POLICY_POWER)
NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: int = getattr(
    pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", NVML_FI_DEV_PERF_POLICY_SYNC_BOOST)
NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: int = getattr(
    pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", 269)
NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: int = getattr(
    pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", 270)
NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: int = getattr(
    pynvml, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", 271)

#: nvmlValueType_t: which member of the value union a field value is in.
NVML_VALUE_TYPE_DOUBLE: int = pynvml.NVML_VALUE_TYPE_DOUBLE
NVML_VALUE_TYPE_UNSIGNED_INT: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
NVML_VALUE_TYPE_UNSIGNED_LONG: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
NVML_VALUE_TYPE_SIGNED_LONG_LONG: int = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
NVML_VALUE_TYPE_SIGNED_INT: int = pynvml.NVML_VALUE_TYPE_SIGNED_INT
NVML_VALUE_TYPE_UNSIGNED_SHORT: int = getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", 6)

#: Arguments of the getters and of the violation-status fallback, and other enums.
NVML_CLOCK_SM: int = pynvml.NVML_CLOCK_SM
NVML_CLOCK_MEM: int = pynvml.NVML_CLOCK_MEM
NVML_TEMPERATURE_GPU: int = pynvml.NVML_TEMPERATURE_GPU
NVML_PERF_POLICY_POWER: int = pynvml.NVML_PERF_POLICY_POWER
NVML_PERF_POLICY_THERMAL: int = pynvml.NVML_PERF_POLICY_THERMAL
NVML_PERF_POLICY_SYNC_BOOST: int = pynvml.NVML_PERF_POLICY_SYNC_BOOST
NVML_PERF_POLICY_BOARD_LIMIT: int = pynvml.NVML_PERF_POLICY_BOARD_LIMIT
NVML_DEVICE_MIG_ENABLE: int = pynvml.NVML_DEVICE_MIG_ENABLE
nvmlEventTypeXidCriticalError: int = pynvml.nvmlEventTypeXidCriticalError
NVML_GPM_METRICS_GET_VERSION: int = pynvml.NVML_GPM_METRICS_GET_VERSION
#: nvmlMemory_v2_t's version word (the struct's size and version 2).
nvmlMemory_v2: int = pynvml.nvmlMemory_v2
NVML_GRID_LICENSE_FEATURE_CODE_VGPU: int = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
#: The scopeId of a field value that asks for the sum over every NVLink (nvml.h: UINT_MAX).
SCOPE_ALL_LINKS = 0xFFFFFFFF


def constant(name: str) -> int:
    """NVML's constant ``name`` (a field id, a GPM metric id, an argument): as this module
    re-exports it, nvml.h's value where an old pynvml lacks it; else pynvml's own.

    Raises AttributeError when neither has it (a binding naming a constant that is not).
    """
    value = globals().get(name)
    if not isinstance(value, int):
        value = getattr(pynvml, name)
    return int(value)


# ----------------------------------------------------------------- error policy


class Failure(enum.Enum):
    """What an NVML error means to the caller: the one error policy (see the module)."""

    UNSUPPORTED = "unsupported"  # never works on this device and driver: absent, not asked again
    GPU_LOST = "gpu_lost"  # the device is gone: GpuUnavailable, the GPU reads as down
    UNKNOWN = "unknown"  # an error; a read where every call answers it means the GPU is gone
    ERROR = "error"  # anything else: a collect error, asked again next time


#: Codes of a call that will never work on this device and driver.
UNSUPPORTED_CODES = frozenset({
    NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_DEPRECATED,
})
#: The same for one value of a batch: a field id the driver does not know comes back
#: as an invalid argument.
VALUE_UNSUPPORTED_CODES = UNSUPPORTED_CODES | {NVML_ERROR_INVALID_ARGUMENT}
#: The device fell off the bus, needs a reset, or its handle is no good.
GPU_LOST_CODES = frozenset({
    NVML_ERROR_GPU_IS_LOST, NVML_ERROR_GPU_NOT_FOUND, NVML_ERROR_RESET_REQUIRED,
    NVML_ERROR_UNINITIALIZED,
})


def classify(code: int, *, per_value: bool = False) -> Failure:
    """What the NVML error ``code`` means; ``per_value`` for one answer inside a batch.

    ``code`` is an ``nvmlReturn_t`` other than success, or -1 for an exception that
    is not an NVML error (:func:`error_code`), which is an :attr:`Failure.ERROR`.
    """
    if code in GPU_LOST_CODES:
        return Failure.GPU_LOST
    if code in (VALUE_UNSUPPORTED_CODES if per_value else UNSUPPORTED_CODES):
        return Failure.UNSUPPORTED
    if code == NVML_ERROR_UNKNOWN:
        return Failure.UNKNOWN
    return Failure.ERROR


def error_code(exc: BaseException) -> int:
    """The NVML return code a pynvml exception carries (-1 when it is not an NVML error)."""
    value = getattr(exc, "value", -1)
    return value if isinstance(value, int) else -1


_INIT_MESSAGES = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found: no NVIDIA driver on this "
    "host (or, in a container, the NVIDIA container toolkit did not mount it)",
    NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML library and kernel driver versions differ "
    "(driver updated without reloading the module; reboot or reload it)",
}


def no_driver(exc: BaseException) -> NoDriverError:
    """The :class:`NoDriverError` for a failed ``nvmlInit``, naming the likely cause.

    Every failure at init means "no usable driver"; the common codes get one line an
    operator can act on.
    """
    cause = _INIT_MESSAGES.get(error_code(exc), f"nvmlInit failed: {exc}")
    return NoDriverError(f"NVML unavailable: {cause}")


# ----------------------------------------------------------------- helpers


def text(value: object) -> str:
    """A string pynvml returned: str in Python 3, bytes in some older versions."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def handle_address(handle: Any) -> int | None:
    """The address an NVML handle points at: the same device, the same address."""
    if handle is None:
        return None
    address = ctypes.cast(handle, ctypes.c_void_p).value
    return int(address) if address is not None else None


# ----------------------------------------------------------------- ctypes mirrors


def plain_ctype(ctype: Any) -> Any:
    """A ctypes type with the same layout as ``ctype``, minus pynvml's wrapper.

    pynvml's structs override ``__getattribute__``/``__setattr__`` in Python (to turn
    bytes into str), which makes every field access about four times slower. The
    buffers the backend reuses are plain twins built from pynvml's own ``_fields_``,
    so the layout always matches the installed pynvml. Raises TypeError when the twin
    would not have the same size.
    """
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
        return plain_ctype(ctype._type_) * ctype._length_
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure | ctypes.Union):
        base: type = ctypes.Union if issubclass(ctype, ctypes.Union) else ctypes.Structure
        fields = [(f[0], plain_ctype(f[1]), *f[2:]) for f in ctype._fields_]
        twin = type("_Plain" + ctype.__name__, (base,), {"_fields_": fields})
        if ctypes.sizeof(twin) != ctypes.sizeof(ctype):
            raise TypeError(f"cannot mirror {ctype.__name__}: layout differs")
        return twin
    return ctype


def _mirror(name: str) -> Any:
    """The plain twin of pynvml's struct ``name``; None where this pynvml cannot give one."""
    try:
        return plain_ctype(getattr(pynvml, name))
    except (AttributeError, TypeError) as exc:  # an old pynvml, or a layout we cannot copy
        log.info("pynvml %s unavailable: %s", name, exc)
        return None


#: nvmlUtilization_t.
Utilization: Any = plain_ctype(pynvml.c_nvmlUtilization_t)
#: nvmlMemory_t, version 1: what pynvml's ``nvmlDeviceGetMemoryInfo(handle)`` asks for
#: (``used`` includes the memory the driver reserves; v2 would split that out).
Memory: Any = plain_ctype(pynvml.c_nvmlMemory_t)
#: nvmlMemory_v2_t: ``used`` without the memory the driver and firmware reserve, which is
#: ``reserved`` (what DCGM reads on drivers from 510 on). Make one with :func:`memory_v2`.
MemoryV2: Any = plain_ctype(pynvml.c_nvmlMemory_v2_t)
#: nvmlGridLicensableFeatures_t, version 4 (None where this pynvml cannot give it).
GridLicensableFeatures: Any = _mirror("c_nvmlGridLicensableFeatures_v4_t")
#: nvmlFieldValue_t (None: field values unavailable with this pynvml).
FieldValue: Any = _mirror("c_nvmlFieldValue_t")
#: nvmlGpmMetricsGet_t (None: no GPM with this pynvml).
GpmMetricsGet: Any = _mirror("c_nvmlGpmMetricsGet_t")


def memory_v2() -> Any:
    """An nvmlMemory_v2_t output with its version set, as nvmlDeviceGetMemoryInfo_v2 needs."""
    out = MemoryV2()
    out.version = nvmlMemory_v2
    return out


def vgpu_license_status(features: Any) -> float | None:
    """DCGM's DCGM_FI_DEV_VGPU_LICENSE_STATUS from an nvmlGridLicensableFeatures_t.

    0 where the GPU does not support vGPU software licensing (a bare-metal GPU: NVML
    answers, with ``isGridLicenseSupported`` 0); else 1 or 0 as the vGPU feature is
    licensed or not; None (absent) where no vGPU feature is listed, as DCGM gives no value.
    """
    if not features.isGridLicenseSupported:
        return 0.0
    listed = features.gridLicensableFeatures
    for i in range(min(int(features.licensableFeaturesCount), len(listed))):
        if listed[i].featureCode == NVML_GRID_LICENSE_FEATURE_CODE_VGPU:
            return 1.0 if listed[i].featureState > 0 else 0.0
    return None


def _struct_code(ctype: Any) -> str | None:
    """The standard-size ``struct`` code of a simple ctypes type, None if it has none
    (c_ulong is 8 bytes natively but ``=L`` is 4, so an 8-byte integer reads as ``Q``)."""
    code: str = ctype._type_
    if ctypes.sizeof(ctype) == 8:
        code = {"L": "Q", "l": "q"}.get(code, code)
    return code if struct.calcsize("=" + code) == ctypes.sizeof(ctype) else None


class FieldValueArray:
    """A reusable ``nvmlFieldValue_t[]`` for fixed field ids, decoded with one unpack.

    Pass ``count`` and ``array`` to the C ``nvmlDeviceGetFieldValues``; pynvml's
    wrapper allocates the array and fills it in a Python loop on every call (~4x the
    cost of the call itself on an H200). A field's value type does not change from one
    call to the next, so once every field has answered, :meth:`values` decodes every
    value with the type it had in one unpack and one comparison.
    """

    def __init__(self, field_ids: Sequence[int], scope_id: int = 0) -> None:
        """``scope_id``: of every field (an NVLink number, or :data:`SCOPE_ALL_LINKS`)."""
        if FieldValue is None:
            raise TypeError("this pynvml has no nvmlFieldValue_t")
        self.field_ids = tuple(field_ids)
        self.scope_id = scope_id
        self.array = (FieldValue * len(self.field_ids))()
        for i, fid in enumerate(self.field_ids):
            self.array[i].fieldId = fid
            self.array[i].scopeId = scope_id
        self.count = ctypes.c_int32(len(self.field_ids))
        self._bytes = memoryview(self.array).cast("B")  # unpacks skip the buffer export
        head = FieldValue.valueType.offset
        if FieldValue.nvmlReturn.offset != head + 4:
            raise TypeError("nvmlFieldValue_t: nvmlReturn does not follow valueType")
        value = FieldValue.value.offset
        self._layout = (head, value - head - 8, ctypes.sizeof(FieldValue) - value - 8)
        # (valueType, nvmlReturn, the value union's 8 bytes) of every entry
        self._unpack = self._struct(("II", "8s") for _ in self.field_ids)
        self._typed: Callable[[Any], tuple[Any, ...]] | None = None
        self._expected: tuple[int, ...] = ()

    def _struct(self, entries: Iterator[tuple[str, str]]) -> Callable[[Any], tuple[Any, ...]]:
        """An unpack of the whole array: per entry, the (valueType, nvmlReturn) pair and
        the value union as ``entries`` give their struct codes."""
        head, gap, tail = self._layout
        return struct.Struct("=" + "".join(
            f"{head}x{pair}{gap}x{value}{tail}x" for pair, value in entries)).unpack_from

    def values(self) -> tuple[int | float, ...] | None:
        """Every value, when every field answered success with its usual type; else None.

        Not a float each: a caller converts (``map(float, ...)`` is one C loop).
        """
        if self._typed is None:
            return None
        answer = self._typed(self._bytes)
        # (valueType, nvmlReturn) read as one integer per entry: success and the
        # usual type are one comparison of the whole tuple
        if answer[0::2] != self._expected:
            return None
        return answer[1::2]

    def answers(self) -> list[tuple[int, int, float | None]]:
        """``(field id, nvmlReturn, value)`` of every field, the value None unless it
        answered success with a known type. Learns the types once all answered."""
        decoded: list[tuple[int, int, float | None]] = []
        raw = iter(self._unpack(self._bytes))
        kinds: list[int] = []
        for fid, kind, code, value in zip(self.field_ids, raw, raw, raw, strict=False):
            decode = _DECODERS.get(kind) if code == NVML_SUCCESS else None
            if decode is None:
                decoded.append((fid, code, None))
                continue
            decoded.append((fid, code, float(decode(value)[0])))
            kinds.append(kind)
        if len(kinds) == len(self.field_ids):
            self._learn(kinds)
        return decoded

    def _learn(self, kinds: list[int]) -> None:
        if all(kind in _SLOTS for kind in kinds):
            self._typed = self._struct(("Q", _SLOTS[kind]) for kind in kinds)
            pair = struct.Struct("=II")
            self._expected = tuple(
                struct.unpack("=Q", pair.pack(kind, NVML_SUCCESS))[0] for kind in kinds)


def _value_members() -> dict[int, Any]:
    """nvmlValueType_t -> ctype of the value-union member that holds it."""
    if FieldValue is None:
        return {}
    union = dict(dict(FieldValue._fields_)["value"]._fields_)
    names = {
        NVML_VALUE_TYPE_DOUBLE: "dVal",
        NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }
    return {kind: union[name] for kind, name in names.items() if name in union}


_MEMBERS = _value_members()
# nvmlValueType_t -> unpack of its union member from the value's 8 bytes
_DECODERS = {kind: struct.Struct("@" + ct._type_).unpack_from for kind, ct in _MEMBERS.items()}
# nvmlValueType_t -> struct code of its member padded to the union's 8 bytes (a typed unpack)
_SLOTS = {kind: f"{code}{8 - ctypes.sizeof(ct)}x" for kind, ct in _MEMBERS.items()
          if (code := _struct_code(ct)) is not None}


class GpmMetricsRequest:
    """A reusable ``nvmlGpmMetricsGet_t`` for fixed metric ids over two fixed samples,
    decoded with one unpack.

    Pass ``ref`` to the C ``nvmlGpmMetricsGet`` after :meth:`set_order`. ``samples``
    must outlive the request (the struct holds their raw addresses).
    """

    def __init__(self, metric_ids: Sequence[int], samples: tuple[Any, Any]) -> None:
        if GpmMetricsGet is None:
            raise TypeError("this pynvml has no nvmlGpmMetricsGet_t")
        self.metric_ids = tuple(metric_ids)
        request = GpmMetricsGet()
        request.version = NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self.metric_ids)
        for i, metric_id in enumerate(self.metric_ids):
            request.metrics[i].metricId = metric_id
        self._request = request
        self._metrics = memoryview(request.metrics).cast("B")  # unpacks skip the export
        self.ref = ctypes.byref(request)
        # sample1, sample2 in either order, written as raw addresses: assigning ctypes
        # pointers costs ~3x more (a type check, and a reference kept per assignment)
        first, second = GpmMetricsGet.sample1, GpmMetricsGet.sample2
        if second.offset != first.offset + first.size or first.size != ctypes.sizeof(
                ctypes.c_void_p):
            raise TypeError("nvmlGpmMetricsGet_t: sample2 does not follow sample1")
        self._samples = memoryview(request).cast("B")[first.offset:second.offset + second.size]
        a, b = (handle_address(sample) or 0 for sample in samples)
        self._orders = (struct.pack("@PP", a, b), struct.pack("@PP", b, a))
        # (metricId and nvmlReturn as one integer, value) of every metric: one unpack,
        # about 3x faster than reading the structs
        metric = type(request.metrics)._type_
        head = metric.metricId.offset
        if metric.nvmlReturn.offset != head + 4:
            raise TypeError("nvmlGpmMetric_t: nvmlReturn does not follow metricId")
        gap = metric.value.offset - head - 8
        tail = ctypes.sizeof(metric) - metric.value.offset - 8
        self._unpack = struct.Struct(
            "=" + f"{head}xQ{gap}xd{tail}x" * len(self.metric_ids)).unpack_from
        pair = struct.Struct("=II")
        self._succeeded = tuple(struct.unpack("=Q", pair.pack(metric_id, NVML_SUCCESS))[0]
                                for metric_id in self.metric_ids)

    def set_order(self, swapped: bool) -> None:
        """Compute from the first sample to the second, or (``swapped``) the other way."""
        self._samples[:] = self._orders[swapped]

    def values(self) -> tuple[float, ...] | None:
        """Every metric's value, when every metric answered success; else None."""
        answer = self._unpack(self._metrics)
        if answer[0::2] != self._succeeded:
            return None
        return answer[1::2]

    def answers(self) -> list[tuple[int, int, float]]:
        """``(metric id, nvmlReturn, value)`` of every metric."""
        answer = self._unpack(self._metrics)
        pair = struct.Struct("=Q")
        return [(metric_id, struct.unpack("=II", pair.pack(both))[1], value)
                for metric_id, both, value in zip(
                    self.metric_ids, answer[0::2], answer[1::2], strict=True)]


# ----------------------------------------------------------------- C functions


def resolve(nvml: Any, *symbols: str) -> Callable[..., int] | None:
    """NVML's C function: the first of ``symbols`` the library exports, or None.

    Resolved once, through pynvml's own ``_nvmlGetFunctionPointer``: pynvml's
    wrappers repeat that lookup (under a lock), allocate a ctypes output and check
    the return code on every call, which on an H200 costs about half as much CPU as
    a cheap getter itself. The function is called with the arguments nvml.h gives
    it (outputs by reference) and returns the nvmlReturn_t as an int. None where
    nothing resolves: a module without ``_nvmlGetFunctionPointer`` (a test fake) or
    a symbol this library lacks; the caller then adapts pynvml's wrapper.
    """
    lookup = getattr(nvml, "_nvmlGetFunctionPointer", None)
    if lookup is None:
        return None
    for symbol in symbols:
        try:
            fn: Callable[..., int] = lookup(symbol)
        except Exception:  # NVML_ERROR_FUNCTION_NOT_FOUND: try the next name
            continue
        return fn
    return None


def call_as_c(call: Callable[..., Any]) -> Callable[..., int]:
    """A pynvml call that raises NVMLError, as a C-style call returning the code.

    An exception that is not an NVML error is raised as it is.
    """

    def wrapped(*args: Any) -> int:
        try:
            call(*args)
        except Exception as exc:
            code = error_code(exc)
            if code < 0:
                raise
            return code
        return NVML_SUCCESS

    return wrapped


def getter_as_c(wrapper: Callable[..., Any], outputs: int = 1) -> Callable[..., int]:
    """A pynvml getter wrapper behind the C convention ``f(*args, byref(out)...) -> code``.

    The last ``outputs`` arguments are outputs: the wrapper's result is copied into the
    buffer the last argument points at, or with several outputs, its items into theirs
    (pynvml returns ``[utilization, samplingPeriodUs]`` for the encoder, for instance).
    An exception that is not an NVML error is raised as it is.
    """

    def call(*args: Any) -> int:
        params, refs = args[:-outputs], args[-outputs:]
        try:
            result = wrapper(*params)
        except Exception as exc:
            code = error_code(exc)
            if code < 0:
                raise
            return code
        for ref, value in zip(refs, result if outputs > 1 else (result,), strict=True):
            out = ref._obj  # the ctypes object byref() points at
            if isinstance(out, ctypes.Structure):
                for name, *_ in out._fields_:
                    setattr(out, name, getattr(value, name))
            else:
                out.value = value
        return NVML_SUCCESS

    return call
