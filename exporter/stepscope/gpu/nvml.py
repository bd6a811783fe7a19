"""The real GPU backend: NVML through nvidia-ml-py (``import pynvml``), plus GPM.

Every key of :mod:`stepscope.gpu.fields` comes from one of these calls. A FAST read
is what every sampling pass pays for every GPU, so it holds only calls that cost
microseconds; calls that cost milliseconds, or counters nobody needs each second,
are on the SLOW tier.

FAST tier (every sampling pass; on an H200 each call costs 1-5 µs CPU):

- ``nvmlDeviceGetUtilizationRates``: ``gpu_util``, ``mem_copy_util``
- ``nvmlDeviceGetClockInfo(NVML_CLOCK_SM / NVML_CLOCK_MEM)``: ``sm_clock``, ``mem_clock``
- ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``: ``gpu_temp``
- ``nvmlDeviceGetPowerUsage`` (mW, served in W): ``power_usage``
- ``nvmlDeviceGetMemoryInfo`` (bytes, served in MiB): ``fb_used``, ``fb_free``
- ``nvmlDeviceGetCurrentClocksEventReasons``: ``clocks_event_reasons``
- one ``nvmlDeviceGetFieldValues`` call for ``memory_temp``, the ECC totals and the
  row-remapping fields (see :data:`FAST_FIELD_IDS`; ~2.5 µs for all nine)
- GPM (Hopper and newer): ``nvmlGpmSampleGet`` (~30 µs) and one ``nvmlGpmMetricsGet``
  for the profiling keys of :data:`stepscope.gpu.fields.GPM_METRICS` on this tier.
  Measured on an H200 (driver 580): NVML_GPM_METRIC_GRAPHICS_UTIL
  (``gr_engine_active``) alone costs 1.4-1.8 ms CPU per computation, the other
  fourteen metrics ~1 µs together. A profiling key whose FieldSpec is on the SLOW
  tier is computed only on reads that ask for SLOW.

SLOW tier (on the slower cadence; these calls cost milliseconds on an H200):

- ``nvmlDeviceGetTotalEnergyConsumption`` (mJ; ~2.8 ms CPU): ``total_energy``
- one ``nvmlDeviceGetFieldValues`` call (~0.7 ms; the hw thermal and power-brake
  durations ~0.65 ms each, the PCIe replay counter ~0.17 ms) for the clock-event
  durations, the board limit counter and the PCIe replay counter (see
  :data:`SLOW_FIELD_IDS`), giving ``thermal_violation`` (sw + hw thermal slowdown),
  ``power_violation`` (sw power cap), ``sync_boost_violation``,
  ``board_limit_violation``, ``pcie_replay`` and the ``clock_event_ns.*`` keys
- ``nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_*)`` (~0.6 ms each) for a violation
  counter only where its field ids are not supported by this driver or GPU

What does not work on a device is learnt on the first read and not asked again:
a getter that answers "not supported" is dropped, an unsupported field id is taken
out of its batch, and the violation fallback is used only where needed. That keeps
the sampling cost close to the cost of the NVML calls themselves.

GPM needs two samples. The baseline is taken when the backend starts (which also
proves that GPM works under this user's permissions); every FAST read then takes a
new sample and computes the metrics over the time since the previous one. Reads
closer than 0.1 s to the previous sample reuse the last computed values, since GPM
over so short a window is noise. GPUs in MIG mode get no profiling keys: GPM on a
MIG-enabled GPU has to be sampled per GPU instance (``nvmlGpmMigSampleGet``), which
does not map onto one per-GPU series.

Errors: "not supported" means the key is absent. "GPU is lost", "GPU not found",
"reset required" or an invalid handle raise :class:`GpuUnavailable` (that GPU is
marked down; the others keep reporting). "Unknown error" is ambiguous: a read in
which no call succeeded and one said "unknown" raises :class:`GpuUnavailable`,
otherwise it counts as a collect error like any other failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import struct
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from stepscope.gpu.fields import CLOCK_EVENT_DURATION_KEYS, FIELDS_BY_KEY, GPM_METRICS
from stepscope.gpu.model import (
    GpuInfo,
    GpuReading,
    GpuUnavailable,
    NoDriverError,
    Tier,
    XidEvent,
)

log = logging.getLogger(__name__)

# NVML return codes (nvml.h). Looked up by value so that an older pynvml without a
# named exception class for a newer code still classifies it.
_SUCCESS = 0
_UNINITIALIZED = 1
_INVALID_ARGUMENT = 2
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_DRIVER_NOT_LOADED = 9
_TIMEOUT = 10
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_RESET_REQUIRED = 16
_LIB_RM_VERSION_MISMATCH = 18
_ARGUMENT_VERSION_MISMATCH = 25
_DEPRECATED = 26
_GPU_NOT_FOUND = 28
_UNKNOWN = 999

# A getter answering one of these will never work on this device and driver.
_UNSUPPORTED_CODES = frozenset(
    {_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _ARGUMENT_VERSION_MISMATCH, _DEPRECATED}
)
# Per-field answers inside nvmlDeviceGetFieldValues that mean the same; a field id
# this driver does not know comes back as an invalid argument.
_FIELD_UNSUPPORTED_CODES = _UNSUPPORTED_CODES | {_INVALID_ARGUMENT}
# The device is gone (fell off the bus, needs a reset) or its handle is no good.
_LOST_CODES = frozenset({_GPU_IS_LOST, _GPU_NOT_FOUND, _RESET_REQUIRED, _UNINITIALIZED})

_INIT_MESSAGES = {
    _LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found: no NVIDIA driver on this host "
    "(or, in a container, the NVIDIA container toolkit did not mount it)",
    _DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    _NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
    _LIB_RM_VERSION_MISMATCH: "NVML library and kernel driver versions differ "
    "(driver updated without reloading the module; reboot or reload it)",
}

# Field ids (nvml.h NVML_FI_DEV_*), as numbers so the backend works with any
# nvidia-ml-py that has nvmlDeviceGetFieldValues.
_FI_MEMORY_TEMP = 82
_FI_ECC_SBE_VOL_TOTAL = 3
_FI_ECC_DBE_VOL_TOTAL = 4
_FI_ECC_SBE_AGG_TOTAL = 5
_FI_ECC_DBE_AGG_TOTAL = 6
_FI_REMAPPED_COR = 142
_FI_REMAPPED_UNC = 143
_FI_REMAPPED_PENDING = 144
_FI_REMAPPED_FAILURE = 145
_FI_CLOCKS_EVENT_REASON_SW_POWER_CAP = 74  # == NVML_FI_DEV_PERF_POLICY_POWER
_FI_CLOCKS_EVENT_REASON_SYNC_BOOST = 76  # == NVML_FI_DEV_PERF_POLICY_SYNC_BOOST
_FI_PERF_POLICY_BOARD_LIMIT = 77
_FI_PCIE_REPLAY_COUNTER = 94
_FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 269
_FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = 270
_FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 271

#: FAST-tier field ids read in one ``nvmlDeviceGetFieldValues`` call -> key.
FAST_FIELD_IDS: tuple[tuple[int, str], ...] = (
    (_FI_MEMORY_TEMP, "memory_temp"),
    (_FI_ECC_SBE_VOL_TOTAL, "ecc_sbe_vol_total"),
    (_FI_ECC_DBE_VOL_TOTAL, "ecc_dbe_vol_total"),
    (_FI_ECC_SBE_AGG_TOTAL, "ecc_sbe_agg_total"),
    (_FI_ECC_DBE_AGG_TOTAL, "ecc_dbe_agg_total"),
    (_FI_REMAPPED_COR, "correctable_remapped_rows"),
    (_FI_REMAPPED_UNC, "uncorrectable_remapped_rows"),
    (_FI_REMAPPED_PENDING, "row_remap_pending"),
    (_FI_REMAPPED_FAILURE, "row_remap_failure"),
)

_CLOCK_EVENT_FIELD_IDS: dict[str, int] = {
    "sw_power_cap": _FI_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    "sync_boost": _FI_CLOCKS_EVENT_REASON_SYNC_BOOST,
    "sw_thermal_slowdown": _FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal_slowdown": _FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake_slowdown": _FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}

#: SLOW-tier field ids read in one ``nvmlDeviceGetFieldValues`` call -> key. The
#: clock-event durations also feed the violation counters (see _VIOLATIONS).
SLOW_FIELD_IDS: tuple[tuple[int, str], ...] = (
    *((_CLOCK_EVENT_FIELD_IDS[reason], key) for key, reason in CLOCK_EVENT_DURATION_KEYS),
    (_FI_PERF_POLICY_BOARD_LIMIT, "board_limit_violation"),
    (_FI_PCIE_REPLAY_COUNTER, "pcie_replay"),
)

# Violation counter -> (keys of SLOW_FIELD_IDS summed, NVML_PERF_POLICY_* of the
# fallback used where one of those field ids is not supported).
_VIOLATIONS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("power_violation", ("clock_event_ns.sw_power_cap",), 0),  # NVML_PERF_POLICY_POWER
    ("thermal_violation", ("clock_event_ns.sw_thermal_slowdown",
                           "clock_event_ns.hw_thermal_slowdown"), 1),  # _THERMAL
    ("sync_boost_violation", ("clock_event_ns.sync_boost",), 2),  # _SYNC_BOOST
    ("board_limit_violation", ("board_limit_violation",), 3),  # _BOARD_LIMIT
)

_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0
_NVML_DEVICE_MIG_ENABLE = 1
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_GPM_METRICS_GET_VERSION = 1
_GPM_MIN_INTERVAL = 0.1  # seconds between GPM samples below which metrics are noise
_MAX_EVENTS_PER_DRAIN = 1024
_BOTH_TIERS = frozenset({Tier.FAST, Tier.SLOW})
_MIB = 1024.0 * 1024.0

# nvmlValueType_t -> member of the c_nvmlValue_t union that holds the value.
_VALUE_MEMBERS: dict[int, str] = {
    0: "dVal",  # NVML_VALUE_TYPE_DOUBLE
    1: "uiVal",  # NVML_VALUE_TYPE_UNSIGNED_INT
    2: "ulVal",  # NVML_VALUE_TYPE_UNSIGNED_LONG
    3: "ullVal",  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    4: "sllVal",  # NVML_VALUE_TYPE_SIGNED_LONG_LONG
    5: "siVal",  # NVML_VALUE_TYPE_SIGNED_INT
    6: "usVal",  # NVML_VALUE_TYPE_UNSIGNED_SHORT
}

# (key, scale, is a 0-1 ratio, tier) per GPM metric, in GPM_METRICS order.
_GPM_KEYS: dict[int, tuple[str, float, bool, Tier]] = {
    metric_id: (key, scale, FIELDS_BY_KEY[key].unit == "ratio", FIELDS_BY_KEY[key].tier)
    for metric_id, key, scale in GPM_METRICS
}

Getter = Callable[[dict[str, float]], None]


def _code(exc: BaseException) -> int:
    """The NVML return code carried by a pynvml exception (-1 when there is none)."""
    value = getattr(exc, "value", -1)
    return value if isinstance(value, int) else -1


def _text(value: object) -> str:
    """pynvml returns str in Python 3, bytes in some older versions."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _plain_ctype(ctype: Any) -> Any:
    """A ctypes type with the same layout as ``ctype``, minus pynvml's wrapper.

    pynvml's structs override ``__getattribute__``/``__setattr__`` in Python (to turn
    bytes into str), which makes every field access about four times slower. The
    reusable field-value array and GPM metrics request are plain twins built from
    pynvml's own ``_fields_``, so the layout always matches the installed pynvml.
    """
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Array):
        return _plain_ctype(ctype._type_) * ctype._length_
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Structure | ctypes.Union):
        base: type = ctypes.Union if issubclass(ctype, ctypes.Union) else ctypes.Structure
        fields = [(f[0], _plain_ctype(f[1]), *f[2:]) for f in ctype._fields_]
        twin = type("_Plain" + ctype.__name__, (base,), {"_fields_": fields})
        if ctypes.sizeof(twin) != ctypes.sizeof(ctype):
            raise TypeError(f"cannot mirror {ctype.__name__}: layout differs")
        return twin
    return ctype


def _handle_address(handle: Any) -> int | None:
    """The address an NVML device handle points at: the same device, the same address."""
    if handle is None:
        return None
    address = ctypes.cast(handle, ctypes.c_void_p).value
    return int(address) if address is not None else None


class _Utilization(ctypes.Structure):
    """nvmlUtilization_t (nvml.h), as a plain ctypes struct (see :func:`_plain_ctype`)."""

    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _Memory(ctypes.Structure):
    """nvmlMemory_t, version 1: what pynvml's ``nvmlDeviceGetMemoryInfo(handle)`` asks
    ``nvmlDeviceGetMemoryInfo`` for (``used`` includes the memory the driver reserves;
    the v2 struct would split that out)."""

    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _buffer(ctype: Any) -> tuple[Any, Any]:
    """A getter's output buffer and the by-reference argument to it, built once."""
    value = ctype()
    return value, ctypes.byref(value)


def _resolve(lookup: Callable[[str], Any] | None, *symbols: str) -> Callable[..., int] | None:
    """NVML's C function: the first of ``symbols`` the library exports, or None.

    Resolved once, through pynvml's own ``_nvmlGetFunctionPointer``: pynvml's
    wrappers repeat that lookup (under a lock), allocate a ctypes output and check
    the return code on every call, which on an H200 costs about half as much CPU as
    a cheap getter itself. The function is called with the arguments nvml.h gives
    it (outputs by reference) and returns the nvmlReturn_t as an int. None where
    nothing resolves: a module without ``_nvmlGetFunctionPointer`` (a test fake) or
    a symbol this library lacks; the caller then adapts the pynvml wrapper, which
    behaves as it always did (a missing symbol answers "function not found").
    """
    if lookup is None:
        return None
    for symbol in symbols:
        try:
            fn: Callable[..., int] = lookup(symbol)
        except Exception:  # NVML_ERROR_FUNCTION_NOT_FOUND: try the next name
            continue
        return fn
    return None


def _returning_code(call: Callable[..., Any]) -> Callable[..., int]:
    """A pynvml call that raises NVMLError, as a C-style call returning the code."""

    def wrapped(*args: Any) -> int:
        try:
            call(*args)
        except Exception as exc:
            code = _code(exc)
            if code < 0:  # not an NVML error: let the caller see it as it is
                raise
            return code
        return _SUCCESS

    return wrapped


def _wrapper_as_c(wrapper: Callable[..., Any]) -> Callable[..., int]:
    """A pynvml getter wrapper behind the C convention ``f(*args, byref(out)) -> code``."""

    def call(*args: Any) -> int:
        *params, ref = args
        try:
            result = wrapper(*params)
        except Exception as exc:
            code = _code(exc)
            if code < 0:  # not an NVML error: let the caller see it as it is
                raise
            return code
        out = ref._obj  # the ctypes object byref() points at
        if isinstance(out, ctypes.Structure):
            for name, *_ in out._fields_:
                setattr(out, name, getattr(result, name))
        else:
            out.value = result
        return _SUCCESS

    return call


class _FieldBatch:
    """A prebuilt ``nvmlDeviceGetFieldValues`` request for one device.

    The ctypes array is built once and reused, and the C function is called
    directly: pynvml's wrapper allocates the array and fills it in a Python loop
    on every call (~4x the cost of the call itself on an H200). The answers are
    read with one ``struct`` unpack. Field ids the device does not support are
    dropped after the first answer.

    A field's value type does not change from one call to the next, so once every
    field has answered, the batch also builds an unpack that decodes each value with
    its type: a read in which every field answers with the type it answered with
    before then costs one unpack and one comparison, not a decode per field.
    """

    def __init__(
        self,
        fn: Callable[..., int],
        error: Callable[[int], BaseException],
        value_type: Any,
        fields: Sequence[tuple[int, str]],
    ) -> None:
        self._fn = fn
        self._error = error
        self._value_type = value_type
        # nvmlValueType_t -> unpacker of the c_nvmlValue_t union member it names
        union = dict(_union_fields(value_type))
        self._decoders = {
            kind: struct.Struct("@" + union[member]._type_).unpack_from
            for kind, member in _VALUE_MEMBERS.items()
            if member in union
        }
        # nvmlValueType_t -> the same member as a standard-size struct code padded to
        # the union's 8 bytes (c_ulong is 8 bytes natively but "=L" is 4).
        self._slots: dict[int, str] = {}
        for kind, member in _VALUE_MEMBERS.items():
            if member in union:
                size = ctypes.sizeof(union[member])
                code = {"L": "Q", "l": "q"}.get(union[member]._type_, union[member]._type_) \
                    if size == 8 else union[member]._type_
                if struct.calcsize("=" + code) == size:
                    self._slots[kind] = f"{code}{8 - size}x"
        self._build(fields)

    def _build(self, fields: Sequence[tuple[int, str]]) -> None:
        self.fields = tuple(fields)
        self.keys = frozenset(key for _, key in self.fields)
        self._array = (self._value_type * len(self.fields))()
        for i, (fid, _) in enumerate(self.fields):
            self._array[i].fieldId = fid
            self._array[i].scopeId = 0
        self._count = ctypes.c_int32(len(self.fields))
        # (valueType, nvmlReturn, the 8 bytes of the value union) of every entry
        entry = self._value_type
        head = entry.valueType.offset
        gap = entry.value.offset - head - 8
        tail = ctypes.sizeof(entry) - entry.value.offset - 8
        self._unpack = struct.Struct(
            "=" + f"{head}xII{gap}x8s{tail}x" * len(self.fields)).unpack_from
        self._layout = (head, gap, tail)
        self._value_keys = tuple(key for _, key in self.fields)
        self._typed: Callable[..., tuple[Any, ...]] | None = None
        self._kinds: tuple[int, ...] = ()

    def _learn(self, kinds: tuple[int, ...]) -> None:
        """Build the typed unpack for value types ``kinds`` (one per field)."""
        if any(kind not in self._slots for kind in kinds):
            return
        head, gap, tail = self._layout
        self._typed = struct.Struct("=" + "".join(
            f"{head}xII{gap}x{self._slots[kind]}{tail}x" for kind in kinds)).unpack_from
        self._kinds = kinds

    def read(self, handle: Any, out: dict[str, float]) -> int:
        """Put each answered field's value in ``out`` under its key; return the failed count.

        Raises the pynvml error of the call itself, or of a field that says the GPU
        is gone.
        """
        if not self.fields:
            return 0
        ret = self._fn(handle, self._count, self._array)
        if ret != _SUCCESS:
            raise self._error(ret)
        if self._typed is not None:
            typed = self._typed(self._array)
            # every field answered (all codes 0), each with its usual type
            if typed[0::3] == self._kinds and not any(typed[1::3]):
                out.update(zip(self._value_keys, map(float, typed[2::3]), strict=False))
                return 0
        errors = 0
        dropped: list[int] = []
        kinds: list[int] = []
        answers = iter(self._unpack(self._array))
        decoders = self._decoders
        for (fid, key), kind, code, value in zip(
            self.fields, answers, answers, answers, strict=False
        ):
            if code == _SUCCESS:
                decode = decoders.get(kind)
                if decode is None:
                    errors += 1
                    continue
                out[key] = float(decode(value)[0])
                kinds.append(kind)
            elif code in _LOST_CODES:
                raise self._error(code)
            elif code in _FIELD_UNSUPPORTED_CODES:
                dropped.append(fid)
            else:
                errors += 1
        if dropped:
            log.debug("field ids %s not supported; not asked again", dropped)
            self._build([f for f in self.fields if f[0] not in dropped])
        elif len(kinds) == len(self.fields):
            self._learn(tuple(kinds))
        return errors

    def clear(self) -> None:
        """Ask for nothing from now on (the call itself is unsupported)."""
        self._build([])


def _union_fields(value_type: Any) -> list[tuple[str, Any]]:
    """The (member name, ctype) pairs of the value union inside a field-value struct."""
    union = dict(value_type._fields_)["value"]
    return [(name, ctype) for name, ctype in union._fields_]


class _GpmRequest:
    """A reusable ``nvmlGpmMetricsGet`` request for a fixed list of metric ids."""

    def __init__(self, metrics_type: Any, metric_ids: list[int]) -> None:
        self.ids = metric_ids
        self.last: dict[str, float] = {}  # what the latest computation gave
        self._plan = [_GPM_KEYS[metric_id][:3] for metric_id in metric_ids]
        request = metrics_type()
        request.version = _GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        for i, metric_id in enumerate(metric_ids):
            request.metrics[i].metricId = metric_id
        self._request = request
        self._ref = ctypes.byref(request)
        # (nvmlReturn, value) of every requested metric in one unpack of the array
        # (about 3x faster than reading the ctypes structs field by field).
        metric = type(request.metrics)._type_
        skip_id = metric.nvmlReturn.offset
        tail = ctypes.sizeof(metric) - metric.value.offset - 8
        gap = metric.value.offset - skip_id - 4
        self._unpack = struct.Struct("=" + f"{skip_id}xI{gap}xd{tail}x" * len(metric_ids))

    def compute(
        self, metrics_get: Callable[..., int], error: Callable[[int], BaseException],
        older: Any, newer: Any, values: dict[str, float],
    ) -> list[int]:
        """Put the scaled metrics between two samples in ``values``.

        ``metrics_get`` is the C ``nvmlGpmMetricsGet``. Returns the metric ids this
        GPU does not support. Raises the pynvml error of a failed call.
        """
        request = self._request
        request.sample1 = older
        request.sample2 = newer
        ret = metrics_get(self._ref)
        if ret:
            raise error(ret)
        unsupported: list[int] = []
        answers = iter(self._unpack.unpack_from(request.metrics))
        for metric_id, (key, scale, ratio), code, value in zip(
            self.ids, self._plan, answers, answers, strict=False
        ):
            if code != _SUCCESS:
                if code in _FIELD_UNSUPPORTED_CODES:
                    unsupported.append(metric_id)
                continue
            if not math.isfinite(value):
                continue  # e.g. occupancy over a window with no active SM
            value *= scale
            if ratio:
                value = 1.0 if value > 1.0 else 0.0 if value < 0.0 else value
            values[key] = value
        return unsupported


class _Gpm:
    """GPM state of one device: two sample buffers and reusable metrics requests.

    Metrics whose FieldSpec is on the SLOW tier are computed only on reads that
    ask for it (on an H200, GRAPHICS_UTIL alone costs 1.4-1.8 ms CPU per computation,
    the other metrics ~1 µs together).
    """

    def __init__(self, nvml: ModuleType, handle: Any, metrics_type: Any, at: float) -> None:
        """Allocate both buffers and take the baseline sample (time ``at``).

        Raises the pynvml error when GPM cannot be sampled here; nothing is leaked.
        """
        self._nvml = nvml
        self._handle = handle
        self._samples: list[Any] = []
        # The per-read calls go straight to C (see _resolve).
        lookup = getattr(nvml, "_nvmlGetFunctionPointer", None)
        self._error = nvml.NVMLError
        self._sample_get = (_resolve(lookup, "nvmlGpmSampleGet")
                            or _returning_code(nvml.nvmlGpmSampleGet))
        self._metrics_get = (_resolve(lookup, "nvmlGpmMetricsGet")
                             or _returning_code(lambda ref: nvml.nvmlGpmMetricsGet(ref._obj)))
        self._metrics_type = metrics_type
        self._build(list(_GPM_KEYS))
        try:
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            nvml.nvmlGpmSampleGet(handle, self._samples[0])
        except BaseException:
            self.free()
            raise
        self._previous_at = at

    def _build(self, supported: list[int]) -> None:
        self._supported = supported
        self._requests: dict[frozenset[Tier], _GpmRequest] = {}
        for tiers in (frozenset({Tier.FAST}), frozenset({Tier.SLOW}), _BOTH_TIERS):
            ids = [m for m in supported if _GPM_KEYS[m][3] in tiers]
            self._requests[tiers] = _GpmRequest(self._metrics_type, ids)

    def read(self, now: float, clock: Callable[[], float], tiers: frozenset[Tier],
             out: dict[str, float]) -> bool:
        """Sample and put the metrics of ``tiers`` since the previous sample in ``out``.

        Returns whether NVML was asked (not when there is nothing to compute, nor
        when the previous sample is too recent). Raises pynvml errors of
        ``nvmlGpmSampleGet`` / ``nvmlGpmMetricsGet``.
        """
        request = self._requests.get(tiers)
        if request is None or not request.ids:
            return False
        if now - self._previous_at < _GPM_MIN_INTERVAL:
            out.update(request.last)  # too close to the previous sample: keep its values
            return False
        previous, current = self._samples
        ret = self._sample_get(self._handle, current)
        if ret:
            raise self._error(ret)
        # The new sample is the next baseline whatever happens to the computation.
        self._samples.reverse()
        self._previous_at = clock()
        values: dict[str, float] = {}
        unsupported = request.compute(self._metrics_get, self._error, previous, current, values)
        request.last = values
        out.update(values)
        if unsupported:
            log.debug("GPM metrics %s not supported; not asked again", unsupported)
            self._build([m for m in self._supported if m not in unsupported])
        return True

    def free(self) -> None:
        """Release both sample buffers (errors ignored: this runs at shutdown)."""
        for sample in self._samples:
            with contextlib.suppress(Exception):  # best effort at shutdown
                self._nvml.nvmlGpmSampleFree(sample)
        self._samples = []


class _Device:
    """Everything the backend keeps for one GPU index."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.down_reason = ""  # non-empty: could not be set up at start; reads as down
        self.fast: list[tuple[str, Getter]] = []
        self.slow: list[tuple[str, Getter]] = []
        self.fast_fields: _FieldBatch | None = None
        self.slow_fields: _FieldBatch | None = None
        self.gpm: _Gpm | None = None
        self.no_fallback: set[str] = set()  # violation keys whose fallback is unsupported
        self.warned: set[str] = set()


class NvmlBackend:
    """GPU facts, readings and XID events from NVML (and GPM on Hopper and newer).

    ``nvml`` is the pynvml module (imported when not given; tests pass a fake).
    ``clock`` is the monotonic clock used to space GPM samples.
    Raises :class:`NoDriverError` when NVML cannot be loaded or initialised.
    Not thread-safe: one thread (the sampler's) calls it.
    """

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if nvml is None:
            try:
                import pynvml as nvml_module
            except ImportError as exc:
                raise NoDriverError(
                    f"the nvidia-ml-py package (import pynvml) is not installed: {exc}"
                ) from exc
            nvml = nvml_module
        self._nvml = nvml
        self._clock = clock
        self._closed = False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # every failure here means "no driver"
            cause = _INIT_MESSAGES.get(_code(exc), f"nvmlInit failed: {exc}")
            raise NoDriverError(f"NVML unavailable: {cause}") from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            raise NoDriverError(f"NVML unavailable: nvmlDeviceGetCount failed: {exc}") from exc
        self._field_fn, self._field_value_type = self._field_values_function()
        self._gpm_metrics_type = self._gpm_request_type()
        driver_version = self._driver_version()
        self._devices: list[_Device] = []
        self._infos: list[GpuInfo] = []
        for index in range(count):
            device, info = self._open(index, driver_version)
            self._devices.append(device)
            self._infos.append(info)
        self._event_set: Any = None
        self._by_address: dict[int, int] = {}
        self._open_events()

    # ----------------------------------------------------------------- start

    def _field_values_function(self) -> tuple[Callable[..., int] | None, Any]:
        nvml = self._nvml
        try:
            fn = nvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
            value_type = _plain_ctype(nvml.c_nvmlFieldValue_t)
        except Exception as exc:  # old driver or pynvml: no batched fields
            log.info("nvmlDeviceGetFieldValues unavailable (%s): field-id metrics absent", exc)
            return None, None
        return fn, value_type

    def _gpm_request_type(self) -> Any:
        try:
            return _plain_ctype(self._nvml.c_nvmlGpmMetricsGet_t)
        except Exception:  # pynvml without GPM
            return None

    def _driver_version(self) -> str:
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except Exception:
            return ""

    def _open(self, index: int, driver_version: str) -> tuple[_Device, GpuInfo]:
        """Get the handle and static facts of one GPU; never raises."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # this GPU's failure is this GPU's
            log.warning("GPU %d: no handle (%s); it reads as down", index, exc)
            device = _Device(index, None)
            device.down_reason = f"no NVML handle: {exc}"
            return device, GpuInfo(index, "", "", "", driver_version=driver_version)
        device = _Device(index, handle)
        facts: dict[str, Any] = {}

        def fact(name: str, call: Callable[[], Any]) -> None:
            try:
                facts[name] = call()
            except Exception as exc:
                if _code(exc) in _LOST_CODES or name == "uuid":
                    device.down_reason = f"{name}: {exc}"
                elif _code(exc) not in _UNSUPPORTED_CODES:
                    log.warning("GPU %d: reading %s failed: %s", index, name, exc)

        fact("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(handle)))
        fact("name", lambda: _text(nvml.nvmlDeviceGetName(handle)))
        fact("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        fact("serial", lambda: _text(nvml.nvmlDeviceGetSerial(handle)))
        fact("vbios_version", lambda: _text(nvml.nvmlDeviceGetVbiosVersion(handle)))
        fact("memory_total_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total / _MIB)
        fact("mig", lambda: nvml.nvmlDeviceGetMigMode(handle)[0])
        mig = facts.pop("mig", None)
        mig_mode = "unsupported" if mig is None else (
            "enabled" if mig == _NVML_DEVICE_MIG_ENABLE else "disabled")
        if device.down_reason:
            log.warning("GPU %d reads as down: %s", index, device.down_reason)
        else:
            self._build_getters(device)
            if mig_mode != "enabled":
                device.gpm = self._open_gpm(device)
        info = GpuInfo(
            index=index,
            uuid=facts.get("uuid", ""),
            name=facts.get("name", ""),
            pci_bus_id=facts.get("pci_bus_id", ""),
            driver_version=driver_version,
            serial=facts.get("serial", ""),
            vbios_version=facts.get("vbios_version", ""),
            memory_total_mib=facts.get("memory_total_mib"),
            profiling_supported=device.gpm is not None,
            mig_mode=mig_mode,
        )
        return device, info

    def _open_gpm(self, device: _Device) -> _Gpm | None:
        """GPM state if this GPU supports it and this user may sample it."""
        nvml = self._nvml
        if self._gpm_metrics_type is None:
            return None
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(device.handle).isSupportedDevice:
                return None
        except Exception as exc:  # pre-Hopper, old driver or pynvml
            log.debug("GPU %d: GPM support query failed: %s", device.index, exc)
            return None
        try:
            return _Gpm(nvml, device.handle, self._gpm_metrics_type, self._clock())
        except Exception as exc:  # e.g. profiling restricted to admins
            log.warning("GPU %d: GPM supported but not usable (%s): no profiling metrics",
                        device.index, exc)
            return None

    def _build_getters(self, device: _Device) -> None:
        """Bind each getter to the device handle and its own output buffer once.

        The getters call NVML's C functions directly (see :func:`_resolve`): a read
        does no lookups, allocates no ctypes objects and checks one int per call.
        """
        nvml = self._nvml
        h = device.handle
        error = nvml.NVMLError
        lookup = getattr(nvml, "_nvmlGetFunctionPointer", None)

        def c_function(*symbols: str, wrapper: str = "") -> Callable[..., int]:
            fn = _resolve(lookup, *symbols)
            return fn or _wrapper_as_c(getattr(nvml, wrapper or symbols[0]))

        utilization = c_function("nvmlDeviceGetUtilizationRates")
        clock_info = c_function("nvmlDeviceGetClockInfo")
        temperature = c_function("nvmlDeviceGetTemperature")
        power = c_function("nvmlDeviceGetPowerUsage")
        memory = c_function("nvmlDeviceGetMemoryInfo")
        # Renamed from "throttle reasons" in NVML 12.2 / nvidia-ml-py 12.535; the old
        # symbol is the same function under its old name.
        reasons = c_function(
            "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
            wrapper=("nvmlDeviceGetCurrentClocksEventReasons"
                     if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
                     else "nvmlDeviceGetCurrentClocksThrottleReasons"))
        energy = c_function("nvmlDeviceGetTotalEnergyConsumption")

        # One output buffer per getter, passed by a reference built once.
        util_out, util_ref = _buffer(_Utilization)
        sm_out, sm_ref = _buffer(ctypes.c_uint)
        mem_out, mem_ref = _buffer(ctypes.c_uint)
        temp_out, temp_ref = _buffer(ctypes.c_uint)
        power_out, power_ref = _buffer(ctypes.c_uint)
        memory_out, memory_ref = _buffer(_Memory)
        reasons_out, reasons_ref = _buffer(ctypes.c_ulonglong)
        energy_out, energy_ref = _buffer(ctypes.c_ulonglong)

        def get_utilization(out: dict[str, float]) -> None:
            ret = utilization(h, util_ref)
            if ret:
                raise error(ret)
            out["gpu_util"] = float(util_out.gpu)
            out["mem_copy_util"] = float(util_out.memory)

        def get_sm_clock(out: dict[str, float]) -> None:
            ret = clock_info(h, _NVML_CLOCK_SM, sm_ref)
            if ret:
                raise error(ret)
            out["sm_clock"] = float(sm_out.value)

        def get_mem_clock(out: dict[str, float]) -> None:
            ret = clock_info(h, _NVML_CLOCK_MEM, mem_ref)
            if ret:
                raise error(ret)
            out["mem_clock"] = float(mem_out.value)

        def get_temperature(out: dict[str, float]) -> None:
            ret = temperature(h, _NVML_TEMPERATURE_GPU, temp_ref)
            if ret:
                raise error(ret)
            out["gpu_temp"] = float(temp_out.value)

        def get_power(out: dict[str, float]) -> None:
            ret = power(h, power_ref)
            if ret:
                raise error(ret)
            out["power_usage"] = power_out.value / 1000.0

        def get_memory(out: dict[str, float]) -> None:
            ret = memory(h, memory_ref)
            if ret:
                raise error(ret)
            out["fb_used"] = memory_out.used / _MIB
            out["fb_free"] = memory_out.free / _MIB

        def get_reasons(out: dict[str, float]) -> None:
            ret = reasons(h, reasons_ref)
            if ret:
                raise error(ret)
            out["clocks_event_reasons"] = float(reasons_out.value)

        def get_energy(out: dict[str, float]) -> None:
            ret = energy(h, energy_ref)
            if ret:
                raise error(ret)
            out["total_energy"] = float(energy_out.value)

        device.fast = [
            ("utilization", get_utilization),
            ("sm_clock", get_sm_clock),
            ("mem_clock", get_mem_clock),
            ("gpu_temp", get_temperature),
            ("power_usage", get_power),
            ("memory_info", get_memory),
            ("clocks_event_reasons", get_reasons),
        ]
        device.slow = [("total_energy", get_energy)]
        if self._field_fn is not None:
            fn, error, value_type = self._field_fn, nvml.NVMLError, self._field_value_type
            device.fast_fields = _FieldBatch(fn, error, value_type, FAST_FIELD_IDS)
            device.slow_fields = _FieldBatch(fn, error, value_type, SLOW_FIELD_IDS)

    def _open_events(self) -> None:
        """One event set for XIDs on every GPU that supports them."""
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log.warning("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
            return
        for device in self._devices:
            if device.handle is None or device.down_reason:
                continue
            try:
                nvml.nvmlDeviceRegisterEvents(device.handle, _XID_EVENT, self._event_set)
            except Exception as exc:
                if _code(exc) in _UNSUPPORTED_CODES:
                    log.info("GPU %d: XID events not supported", device.index)
                else:
                    log.warning("GPU %d: XID event registration failed: %s", device.index, exc)
                continue
            address = _handle_address(device.handle)
            if address is not None:
                self._by_address[address] = device.index

    # ----------------------------------------------------------------- protocol

    def devices(self) -> Sequence[GpuInfo]:
        """Static facts of every GPU NVML enumerates, in index order."""
        return tuple(self._infos)

    def read(self, index: int, tiers: frozenset[Tier]) -> GpuReading:
        """Read the keys of ``tiers`` from GPU ``index``.

        Raises :class:`GpuUnavailable` when the device is gone, never anything else.
        """
        if self._closed:
            raise GpuUnavailable("NVML backend is closed")
        if not 0 <= index < len(self._devices):
            raise GpuUnavailable(f"no GPU with index {index}")
        device = self._devices[index]
        if device.down_reason:
            raise GpuUnavailable(device.down_reason)
        out: dict[str, float] = {}
        state = _Pass(device)
        if Tier.FAST in tiers:
            state.run(device.fast, out)
            if device.fast_fields is not None:
                self._read_fields(state, device.fast_fields, out)
        if device.gpm is not None:
            self._read_gpm(state, tiers, out)
        if Tier.SLOW in tiers:
            state.run(device.slow, out)
            self._read_slow_fields(state, out)
        state.finish()
        return GpuReading(out, state.errors)

    def _read_fields(self, state: _Pass, batch: _FieldBatch, out: dict[str, float]) -> None:
        try:
            state.errors += batch.read(state.device.handle, out)
            state.ok += 1
        except Exception as exc:  # classified by _Pass
            if state.failed("field_values", exc):
                batch.clear()

    def _read_slow_fields(self, state: _Pass, out: dict[str, float]) -> None:
        device = state.device
        batch = device.slow_fields
        if batch is not None:
            self._read_fields(state, batch, out)
        supported = batch.keys if batch is not None else frozenset()
        for key, parts, policy in _VIOLATIONS:
            if supported.issuperset(parts):
                if all(part in out for part in parts):
                    out[key] = sum(out[part] for part in parts)
                continue
            if key in device.no_fallback:
                continue
            try:
                status = self._nvml.nvmlDeviceGetViolationStatus(device.handle, policy)
                out[key] = float(status.violationTime)
                state.ok += 1
            except Exception as exc:  # classified by _Pass
                if state.failed(f"violation_status:{key}", exc):
                    device.no_fallback.add(key)

    def _read_gpm(self, state: _Pass, tiers: frozenset[Tier], out: dict[str, float]) -> None:
        device = state.device
        gpm = device.gpm
        assert gpm is not None
        try:
            if gpm.read(self._clock(), self._clock, tiers, out):
                state.ok += 1
        except Exception as exc:  # classified by _Pass
            if state.failed("gpm", exc):
                gpm.free()
                device.gpm = None

    def events(self) -> Sequence[XidEvent]:
        """Drain pending XID events without blocking (timeout 0)."""
        if self._event_set is None or self._closed:
            return []
        wait = self._nvml.nvmlEventSetWait_v2
        collected: list[XidEvent] = []
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                data = wait(self._event_set, 0)
            except Exception as exc:
                if _code(exc) != _TIMEOUT:  # timeout: nothing more pending
                    log.debug("nvmlEventSetWait_v2 failed: %s", exc)
                break
            if not data.eventType & _XID_EVENT:
                continue
            index = self._by_address.get(_handle_address(data.device) or 0)
            if index is None:
                log.debug("XID %d from an unknown device handle", data.eventData)
                continue
            collected.append(XidEvent(index=index, xid=int(data.eventData),
                                      timestamp=time.time()))
        return collected

    def close(self) -> None:
        """Free GPM samples and the event set, shut NVML down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for device in self._devices:
            if device.gpm is not None:
                device.gpm.free()
                device.gpm = None
        if self._event_set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._event_set)
            except Exception as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._event_set = None
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)


class _Pass:
    """Bookkeeping of one read of one device: successes, errors, "unknown" answers."""

    __slots__ = ("device", "errors", "ok", "unknown")

    def __init__(self, device: _Device) -> None:
        self.device = device
        self.errors = 0
        self.ok = 0
        self.unknown = 0

    def run(self, getters: list[tuple[str, Getter]], out: dict[str, float]) -> None:
        """Call each getter; drop those that turn out unsupported."""
        failed = 0
        dropped: list[str] = []
        for name, getter in getters:
            try:
                getter(out)
            except Exception as exc:  # classified below
                failed += 1
                if self.failed(name, exc):
                    dropped.append(name)
        self.ok += len(getters) - failed
        if dropped:
            getters[:] = [g for g in getters if g[0] not in dropped]

    def failed(self, name: str, exc: Exception) -> bool:
        """Classify a getter's exception. True: unsupported, do not call it again.

        Raises GpuUnavailable when the exception says the device is gone.
        """
        code = _code(exc)
        if code in _LOST_CODES:
            raise GpuUnavailable(f"{name}: {exc}")
        if code in _UNSUPPORTED_CODES:
            log.debug("GPU %d: %s not supported (%s); not asked again",
                      self.device.index, name, exc)
            return True
        self.errors += 1
        if code == _UNKNOWN:
            self.unknown += 1
        if name not in self.device.warned:
            self.device.warned.add(name)
            log.warning("GPU %d: %s failed: %s", self.device.index, name, exc)
        return False

    def finish(self) -> None:
        """A device that answered nothing but "unknown error" is treated as gone."""
        if self.ok == 0 and self.unknown:
            raise GpuUnavailable("every NVML call failed with Unknown Error")
