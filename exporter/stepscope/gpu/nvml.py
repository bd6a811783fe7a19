"""The real GPU backend: NVML through nvidia-ml-py (``import pynvml``), plus GPM.

Every key of :mod:`stepscope.gpu.fields` comes from one of these calls. A FAST read
is what every sampling pass pays for every GPU, so it holds only calls that cost
microseconds; calls that cost milliseconds, or counters nobody needs each second,
are on the SLOW tier. NVML's codes, struct mirrors and error policy are in
:mod:`stepscope.gpu.libnvml`; this module is what the backend reads and when.

FAST tier (every sampling pass; on an H200 each call costs 1-5 µs CPU):

- :data:`FAST_GETTERS`: ``nvmlDeviceGetUtilizationRates`` (``gpu_util``,
  ``mem_copy_util``), ``nvmlDeviceGetClockInfo(SM / MEM)`` (``sm_clock``,
  ``mem_clock``), ``nvmlDeviceGetTemperature(GPU)`` (``gpu_temp``),
  ``nvmlDeviceGetPowerUsage`` (mW, served in W), ``nvmlDeviceGetMemoryInfo_v2`` (bytes,
  served in MiB: ``fb_used`` without the reserved memory, ``fb_free``, ``fb_reserved``,
  as DCGM; version 1 on drivers without it), ``nvmlDeviceGetCurrentClocksEventReasons``
- :data:`FAST_ENGINE_GETTERS`: ``nvmlDeviceGetEncoderUtilization`` and
  ``nvmlDeviceGetDecoderUtilization`` (``enc_util``, ``dec_util``, %). Not yet timed on
  an H200 (``benchmarks/gpu_counters_validation.py`` does); NVML keeps these samples as
  it keeps the utilisation rates', so they are expected to cost microseconds as those do
- one ``nvmlDeviceGetFieldValues`` call for ``memory_temp``, the ECC totals and the
  row-remapping fields (see :data:`FAST_FIELD_IDS`; ~2.5 µs for all nine)
- GPM (Hopper and newer): ``nvmlGpmSampleGet`` (~30 µs) and one ``nvmlGpmMetricsGet``
  for the profiling keys of :data:`stepscope.gpu.fields.GPM_METRICS` on this tier.
  Measured on an H200 (driver 580): NVML_GPM_METRIC_GRAPHICS_UTIL
  (``gr_engine_active``) alone costs 1.4-1.8 ms CPU per computation, the other
  fourteen metrics ~1 µs together. A profiling key whose FieldSpec is on the SLOW
  tier is computed only on reads that ask for SLOW.

SLOW tier (on the slower cadence; these calls cost milliseconds on an H200):

- :data:`SLOW_GETTERS`: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ; ~2.8 ms CPU)
- one ``nvmlDeviceGetFieldValues`` call (~0.7 ms; the hw thermal and power-brake
  durations ~0.65 ms each, the PCIe replay counter ~0.17 ms) for the clock-event
  durations, the board limit counter and the PCIe replay counter (see
  :data:`SLOW_FIELD_IDS`), giving ``thermal_violation`` (sw + hw thermal slowdown),
  ``power_violation`` (sw power cap), ``sync_boost_violation``,
  ``board_limit_violation``, ``pcie_replay`` and the ``clock_event_ns.*`` keys
- ``nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_*)`` (~0.6 ms each) for a violation
  counter only where its field ids are not supported by this driver or GPU
- one ``nvmlDeviceGetFieldValues`` call for the NVLink data counters summed over every
  link (:data:`NVLINK_FIELD_IDS`), from which ``nvlink_bandwidth_total`` is computed as
  DCGM computes it (a rate over the slow interval); and
  ``nvmlDeviceGetGridLicensableFeatures_v4`` for ``vgpu_license_status``. Both are new,
  untimed on an H200, and slow-tier because neither needs a fresher reading: a rate over
  the slow interval is what dcgm-exporter's 30 s default gives, and a license changes
  rarely

What does not work on a device is learnt on the first read and not asked again:
a getter that answers "not supported" is dropped, an unsupported field id is taken
out of its batch, and the violation fallback is used only where needed. The calls of
a read go straight to NVML's C functions with outputs built once; answers are decoded
with one ``struct`` unpack per batch. That keeps the sampling cost close to the cost
of the NVML calls themselves (``benchmarks/nvml_call_cost.py`` measures the ratio).

GPM needs two samples. The baseline is taken when the backend starts (which also
proves that GPM works under this user's permissions); every FAST read then takes a
new sample and computes the metrics over the time since the previous one. Reads
closer than 0.1 s to the previous sample reuse the last computed values, since GPM
over so short a window is noise. GPUs in MIG mode get no profiling keys: GPM on a
MIG-enabled GPU has to be sampled per GPU instance (``nvmlGpmMigSampleGet``), which
does not map onto one per-GPU series.

Errors follow :func:`stepscope.gpu.libnvml.classify`: "not supported" means the key
is absent; "GPU is lost" and the like raise :class:`GpuUnavailable` (that GPU is
marked down; the others keep reporting); a read in which no call succeeded and one
said "unknown error" raises :class:`GpuUnavailable`; any other failure counts as a
collect error.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress
from math import isfinite
from operator import attrgetter, mul, truediv
from types import ModuleType
from typing import Any

from stepscope.gpu import libnvml
from stepscope.gpu.fields import CLOCK_EVENT_DURATION_KEYS, FIELDS_BY_KEY, GPM_METRICS
from stepscope.gpu.libnvml import Failure, classify, error_code
from stepscope.gpu.model import (
    GpuInfo,
    GpuReading,
    GpuUnavailable,
    NoDriverError,
    Tier,
    XidEvent,
)

log = logging.getLogger(__name__)

_MIB = 1024.0 * 1024.0
_GPM_MIN_INTERVAL = 0.1  # seconds between GPM samples below which metrics are noise
_MAX_EVENTS_PER_DRAIN = 1024


@dataclass(frozen=True, slots=True)
class GetterSpec:
    """One NVML getter a read calls, as nvml.h declares it:
    ``symbol(device, [argument,] &output) -> nvmlReturn_t``.

    ``fallback``: the getter called instead, from the first read on, where this one
    turns out unsupported (a driver without the function). ``wrapper``: how to call
    pynvml where no symbol resolves (a module without C function pointers), when its
    wrapper is not simply the function named after a symbol.
    """

    name: str  # in logs
    symbols: tuple[str, ...]  # the first the library exports is called
    output: Callable[[], Any]  # makes the output: its ctypes type, or a function
    keys: tuple[tuple[str, str, float], ...]  # one or more (key, member of the output, divisor)
    argument: int | None = None
    fallback: GetterSpec | None = None
    wrapper: Callable[[Any], Callable[..., Any]] | None = None


@dataclass(frozen=True, slots=True)
class EngineUtilizationSpec:
    """An engine's utilisation getter: ``symbol(device, &utilization, &samplingPeriodUs)``.

    The percentage is served under ``key``; NVML's sampling period (which varies by
    product, as dcgm-exporter's default counters note) is not.
    """

    name: str  # in logs
    symbol: str
    key: str


#: The getters of every FAST read, in the order they are called.
FAST_GETTERS: tuple[GetterSpec, ...] = (
    GetterSpec("utilization", ("nvmlDeviceGetUtilizationRates",), libnvml.Utilization,
               (("gpu_util", "gpu", 1.0), ("mem_copy_util", "memory", 1.0))),
    GetterSpec("sm_clock", ("nvmlDeviceGetClockInfo",), ctypes.c_uint,
               (("sm_clock", "value", 1.0),), libnvml.NVML_CLOCK_SM),
    GetterSpec("mem_clock", ("nvmlDeviceGetClockInfo",), ctypes.c_uint,
               (("mem_clock", "value", 1.0),), libnvml.NVML_CLOCK_MEM),
    GetterSpec("gpu_temp", ("nvmlDeviceGetTemperature",), ctypes.c_uint,
               (("gpu_temp", "value", 1.0),), libnvml.NVML_TEMPERATURE_GPU),
    GetterSpec("power_usage", ("nvmlDeviceGetPowerUsage",), ctypes.c_uint,
               (("power_usage", "value", 1000.0),)),  # mW -> W
    # bytes -> MiB. Version 2 as DCGM (drivers from 510 on): ``used`` without what the
    # driver and firmware reserve, which is ``reserved``. Version 1 where the driver has no
    # v2: its ``used`` includes the reserved memory, and there is no ``fb_reserved``.
    GetterSpec("memory_info", ("nvmlDeviceGetMemoryInfo_v2",), libnvml.memory_v2,
               (("fb_used", "used", _MIB), ("fb_free", "free", _MIB),
                ("fb_reserved", "reserved", _MIB)),
               fallback=GetterSpec("memory_info_v1", ("nvmlDeviceGetMemoryInfo",),
                                   libnvml.Memory,
                                   (("fb_used", "used", _MIB), ("fb_free", "free", _MIB))),
               wrapper=lambda nvml: partial(nvml.nvmlDeviceGetMemoryInfo,
                                            version=libnvml.nvmlMemory_v2)),
    # Renamed from "throttle reasons" in NVML 12.2 / nvidia-ml-py 12.535; older drivers
    # export the same function under its old name only.
    GetterSpec("clocks_event_reasons", ("nvmlDeviceGetCurrentClocksEventReasons",
                                        "nvmlDeviceGetCurrentClocksThrottleReasons"),
               ctypes.c_ulonglong, (("clocks_event_reasons", "value", 1.0),)),
)

#: The engine utilisation getters of every FAST read (their own calling convention).
FAST_ENGINE_GETTERS: tuple[EngineUtilizationSpec, ...] = (
    EngineUtilizationSpec("encoder_utilization", "nvmlDeviceGetEncoderUtilization", "enc_util"),
    EngineUtilizationSpec("decoder_utilization", "nvmlDeviceGetDecoderUtilization", "dec_util"),
)

#: The getters of every SLOW read.
SLOW_GETTERS: tuple[GetterSpec, ...] = (
    GetterSpec("total_energy", ("nvmlDeviceGetTotalEnergyConsumption",), ctypes.c_ulonglong,
               (("total_energy", "value", 1.0),)),
)

#: The vGPU license status of every SLOW read: ``symbol(device, &features)``, decoded by
#: :func:`stepscope.gpu.libnvml.vgpu_license_status` (DCGM calls the same function).
LICENSE_SYMBOL = "nvmlDeviceGetGridLicensableFeatures_v4"

#: FAST-tier field ids read in one ``nvmlDeviceGetFieldValues`` call -> key.
FAST_FIELD_IDS: tuple[tuple[int, str], ...] = (
    (libnvml.NVML_FI_DEV_MEMORY_TEMP, "memory_temp"),
    (libnvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, "ecc_sbe_vol_total"),
    (libnvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL, "ecc_dbe_vol_total"),
    (libnvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL, "ecc_sbe_agg_total"),
    (libnvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL, "ecc_dbe_agg_total"),
    (libnvml.NVML_FI_DEV_REMAPPED_COR, "correctable_remapped_rows"),
    (libnvml.NVML_FI_DEV_REMAPPED_UNC, "uncorrectable_remapped_rows"),
    (libnvml.NVML_FI_DEV_REMAPPED_PENDING, "row_remap_pending"),
    (libnvml.NVML_FI_DEV_REMAPPED_FAILURE, "row_remap_failure"),
)

# Clock-event reason label of stepscope.gpu.fields -> its duration field id.
_CLOCK_EVENT_FIELD_IDS: dict[str, int] = {
    "sw_power_cap": libnvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    "sync_boost": libnvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    "sw_thermal_slowdown": libnvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal_slowdown": libnvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake_slowdown": libnvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}

#: SLOW-tier field ids read in one ``nvmlDeviceGetFieldValues`` call -> key. The
#: clock-event durations also feed the violation counters (see _VIOLATIONS).
SLOW_FIELD_IDS: tuple[tuple[int, str], ...] = (
    *((_CLOCK_EVENT_FIELD_IDS[reason], key) for key, reason in CLOCK_EVENT_DURATION_KEYS),
    (libnvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, "board_limit_violation"),
    (libnvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replay"),
)

#: SLOW-tier NVLink data counters (KiB since the driver loaded), asked summed over every
#: link (scopeId :data:`stepscope.gpu.libnvml.SCOPE_ALL_LINKS`) in one call: the
#: ``nvlink_bandwidth_total`` rate is computed from their sum, as DCGM computes
#: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL. These keys are not served themselves.
NVLINK_FIELD_IDS: tuple[tuple[int, str], ...] = (
    (libnvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, "nvlink_data_rx_kib"),
    (libnvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, "nvlink_data_tx_kib"),
)

# Violation counter -> (keys of SLOW_FIELD_IDS summed, NVML_PERF_POLICY_* of the
# fallback used where one of those field ids is not supported).
_VIOLATIONS: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("power_violation", ("clock_event_ns.sw_power_cap",), libnvml.NVML_PERF_POLICY_POWER),
    ("thermal_violation", ("clock_event_ns.sw_thermal_slowdown",
                           "clock_event_ns.hw_thermal_slowdown"), libnvml.NVML_PERF_POLICY_THERMAL),
    ("sync_boost_violation", ("clock_event_ns.sync_boost",), libnvml.NVML_PERF_POLICY_SYNC_BOOST),
    ("board_limit_violation", ("board_limit_violation",), libnvml.NVML_PERF_POLICY_BOARD_LIMIT),
)

# GPM metric id -> (key, scale, is a 0-1 ratio, tier), from the field table.
_GPM_KEYS: dict[int, tuple[str, float, bool, Tier]] = {
    metric_id: (key, scale, FIELDS_BY_KEY[key].unit == "ratio", FIELDS_BY_KEY[key].tier)
    for metric_id, key, scale in GPM_METRICS
}

# tiers -> (read FAST, read SLOW); membership of an Enum in a set hashes it in Python,
# and the sampler passes the same few frozensets every pass
_TIER_FLAGS: dict[frozenset[Tier], tuple[bool, bool]] = {}

Getter = Callable[[dict[str, float]], None]


def _bind(fn: Callable[..., int], spec: GetterSpec, handle: Any,
          error: Callable[[int], BaseException]) -> Getter:
    """``spec``'s C function bound to one device and its own output buffer, built once:
    a call does no lookup, allocates no ctypes object and checks one int."""
    output = spec.output()
    ref = ctypes.byref(output)
    args = (handle, ref) if spec.argument is None else (handle, spec.argument, ref)
    if len(spec.keys) == 1:
        ((key, member, divisor),) = spec.keys
        member_of = attrgetter(member)

        def get_one(out: dict[str, float]) -> None:
            ret = fn(*args)
            if ret:
                raise error(ret)
            out[key] = member_of(output) / divisor

        return get_one
    if len(spec.keys) == 2:
        ((key1, member1, divisor1), (key2, member2, divisor2)) = spec.keys
        members_of = attrgetter(member1, member2)

        def get_two(out: dict[str, float]) -> None:
            ret = fn(*args)
            if ret:
                raise error(ret)
            value1, value2 = members_of(output)
            out[key1] = value1 / divisor1
            out[key2] = value2 / divisor2

        return get_two
    keys = tuple(key for key, _, _ in spec.keys)
    divisors = tuple(divisor for _, _, divisor in spec.keys)
    all_of = attrgetter(*(member for _, member, _ in spec.keys))

    def get_many(out: dict[str, float]) -> None:
        ret = fn(*args)
        if ret:
            raise error(ret)
        out.update(zip(keys, map(truediv, all_of(output), divisors)))  # noqa: B905

    return get_many


def _bind_engine(fn: Callable[..., int], spec: EngineUtilizationSpec, handle: Any,
                 error: Callable[[int], BaseException]) -> Getter:
    """``spec``'s C function bound to one device and its two outputs, built once."""
    utilization, period = ctypes.c_uint(), ctypes.c_uint()
    args = (handle, ctypes.byref(utilization), ctypes.byref(period))
    key = spec.key

    def get(out: dict[str, float]) -> None:
        ret = fn(*args)
        if ret:
            raise error(ret)
        out[key] = float(utilization.value)

    return get


def _bind_license(read: Callable[[], Any]) -> Getter:
    """The vGPU license status from ``read`` (the features struct NVML filled, or raises)."""

    def get(out: dict[str, float]) -> None:
        status = libnvml.vgpu_license_status(read())
        if status is not None:
            out["vgpu_license_status"] = status

    return get


class _FieldBatch:
    """One device's ``nvmlDeviceGetFieldValues`` request: the field ids still asked, the
    prebuilt array (:class:`libnvml.FieldValueArray`) and what each answer means.

    Field ids the device does not support are dropped after their first answer.
    """

    def __init__(
        self,
        fn: Callable[..., int],
        error: Callable[[int], BaseException],
        fields: Sequence[tuple[int, str]],
        scope_id: int = 0,
    ) -> None:
        self._fn = fn
        self._error = error
        self._scope_id = scope_id
        self._build(fields)

    def _build(self, fields: Sequence[tuple[int, str]]) -> None:
        self.fields = tuple(fields)
        self.keys = frozenset(key for _, key in self.fields)
        self._value_keys = tuple(key for _, key in self.fields)
        self._request = libnvml.FieldValueArray([fid for fid, _ in self.fields], self._scope_id)
        # The answers of the previous read and their values by key: ECC and row-remap
        # counters and the memory temperature rarely change from one pass to the next.
        self._last_answers: tuple[int | float, ...] | None = None
        self._last: dict[str, float] = {}

    def read(self, state: _Pass, out: dict[str, float]) -> None:
        """Put each answered field's value in ``out`` under its key, counting on ``state``."""
        if not self.fields:
            return
        request = self._request
        errors = 0
        try:
            ret = self._fn(state.device.handle, request.count, request.array)
            if ret:
                raise self._error(ret)
            values = request.values()
            if values is not None:  # every field answered, each with its usual type
                if values != self._last_answers:
                    self._last_answers = values
                    # zip's strict= costs a keyword-argument call on every read
                    self._last = dict(zip(self._value_keys, map(float, values)))  # noqa: B905
                out.update(self._last)
            else:
                errors = self._decode_each(out)
        except Exception as exc:  # classified by _Pass
            if state.failed("field_values", exc):
                self._build([])
            return
        state.errors += errors
        state.ok += 1

    def _decode_each(self, out: dict[str, float]) -> int:
        """Decode field by field; the failed count. Raises the pynvml error of a field
        that says the GPU is gone."""
        errors = 0
        dropped: list[int] = []
        for key, (fid, code, value) in zip(self._value_keys, self._request.answers(),
                                           strict=True):
            if value is not None:
                out[key] = value
                continue
            failure = Failure.ERROR if code == libnvml.NVML_SUCCESS else classify(
                code, per_value=True)  # success with a value type we cannot decode
            if failure is Failure.GPU_LOST:
                raise self._error(code)
            if failure is Failure.UNSUPPORTED:
                dropped.append(fid)
            else:
                errors += 1
        if dropped:
            log.debug("field ids %s not supported; not asked again", dropped)
            self._build([f for f in self.fields if f[0] not in dropped])
        return errors


class _GpmRequest:
    """The GPM metrics of one set of tiers: the reusable request, scaled to DCGM's units."""

    def __init__(self, metric_ids: Sequence[int], samples: tuple[Any, Any]) -> None:
        # ratios first, so that one slice of the values holds every value to clamp
        self.ids = sorted(metric_ids, key=lambda metric_id: not _GPM_KEYS[metric_id][2])
        plan = [_GPM_KEYS[metric_id] for metric_id in self.ids]
        self._keys = tuple(key for key, _, _, _ in plan)
        self._scales = tuple(scale for _, scale, _, _ in plan)
        self._ratios = sum(ratio for _, _, ratio, _ in plan)
        self.request = libnvml.GpmMetricsRequest(self.ids, samples)
        # (keys, values) the latest computation gave
        self.last: tuple[tuple[str, ...], tuple[float, ...]] = ((), ())

    def compute(self, metrics_get: Callable[..., int],
                error: Callable[[int], BaseException]) -> list[int]:
        """Compute the metrics into :attr:`last` (the request's samples are set).

        ``metrics_get`` is the C ``nvmlGpmMetricsGet``. Returns the metric ids this
        GPU does not support. Raises the pynvml error of a failed call.
        """
        request = self.request
        ret = metrics_get(request.ref)
        if ret:
            raise error(ret)
        values = request.values()
        if values is None:  # some metric failed: one by one
            return self._compute_each(request.answers())
        # One C loop per step, not a Python loop per metric.
        scaled = tuple(map(mul, values, self._scales))
        ratios = self._ratios
        head: tuple[float, ...] = scaled[:ratios]
        finite = None
        if not isfinite(sum(values)):  # e.g. occupancy over a window with no active SM
            finite = tuple(map(isfinite, values))  # of the unscaled values, as documented
            head = tuple(compress(head, finite))
        # sorted() compares floats at C speed: half the cost of min() and max()
        if head and ((ordered := sorted(head))[0] < 0.0 or ordered[-1] > 1.0):
            scaled = (*(1.0 if v > 1.0 else 0.0 if v < 0.0 else v for v in scaled[:ratios]),
                      *scaled[ratios:])
        keys = self._keys
        if finite is not None:  # left out, not clamped
            keys = tuple(compress(keys, finite))
            scaled = tuple(compress(scaled, finite))
        self.last = (keys, scaled)
        return []

    def _compute_each(self, answers: list[tuple[int, int, float]]) -> list[int]:
        keys: list[str] = []
        values: list[float] = []
        unsupported: list[int] = []
        for metric_id, code, value in answers:
            if code != libnvml.NVML_SUCCESS:
                if classify(code, per_value=True) is Failure.UNSUPPORTED:
                    unsupported.append(metric_id)
                continue
            if not isfinite(value):
                continue
            key, scale, ratio, _ = _GPM_KEYS[metric_id]
            value *= scale
            if ratio:
                value = 1.0 if value > 1.0 else 0.0 if value < 0.0 else value
            keys.append(key)
            values.append(value)
        self.last = (tuple(keys), tuple(values))
        return unsupported


class _Gpm:
    """GPM state of one device: two sample buffers and reusable metrics requests.

    Metrics whose FieldSpec is on the SLOW tier are computed only on reads that
    ask for it (on an H200, GRAPHICS_UTIL alone costs 1.4-1.8 ms CPU per computation,
    the other metrics ~1 µs together).
    """

    def __init__(self, nvml: ModuleType, handle: Any, clock: Callable[[], float]) -> None:
        """Allocate both buffers and take the baseline sample.

        ``clock`` is the monotonic clock that spaces samples. Raises the pynvml error
        when GPM cannot be sampled here; nothing is leaked.
        """
        self._nvml = nvml
        self._handle = handle
        self._clock = clock
        self._samples: list[Any] = []
        # The per-read calls go straight to C (see libnvml.resolve).
        self._error = nvml.NVMLError
        self._sample_get = (libnvml.resolve(nvml, "nvmlGpmSampleGet")
                            or libnvml.call_as_c(nvml.nvmlGpmSampleGet))
        self._metrics_get = (libnvml.resolve(nvml, "nvmlGpmMetricsGet")
                             or libnvml.call_as_c(lambda ref: nvml.nvmlGpmMetricsGet(ref._obj)))
        try:
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            self._samples.append(nvml.nvmlGpmSampleAlloc())
            nvml.nvmlGpmSampleGet(handle, self._samples[0])
        except BaseException:
            self.free()
            raise
        self._swapped = False  # False: the baseline is in samples[0]
        self._previous_at = clock()
        self._build(list(_GPM_KEYS))

    def _build(self, supported: list[int]) -> None:
        self._supported = supported
        samples = (self._samples[0], self._samples[1])
        self._requests: dict[frozenset[Tier], _GpmRequest] = {}
        for tiers in (frozenset({Tier.FAST}), frozenset({Tier.SLOW}),
                      frozenset({Tier.FAST, Tier.SLOW})):
            ids = [m for m in supported if _GPM_KEYS[m][3] in tiers]
            self._requests[tiers] = _GpmRequest(ids, samples)

    def read(self, state: _Pass, tiers: frozenset[Tier], out: dict[str, float]) -> None:
        """Sample and put the metrics of ``tiers`` since the previous sample in ``out``.

        NVML is not asked when there is nothing to compute, nor when the previous
        sample is too recent (the previous values are given). A failure is classified
        on ``state``; where GPM turns out unsupported, the device drops it.
        """
        request = self._requests.get(tiers)
        if request is None or not request.ids:
            return
        if self._clock() - self._previous_at < _GPM_MIN_INTERVAL:
            out.update(zip(*request.last))  # noqa: B905 (too close: the previous values)
            return
        try:
            swapped = self._swapped
            ret = self._sample_get(self._handle, self._samples[not swapped])
            if ret:
                raise self._error(ret)
            # The new sample is the next baseline whatever happens to the computation.
            self._swapped = not swapped
            self._previous_at = self._clock()
            request.request.set_order(swapped)
            unsupported = request.compute(self._metrics_get, self._error)
        except Exception as exc:  # classified by _Pass
            if state.failed("gpm", exc):
                self.free()
                state.device.gpm = None
            return
        state.ok += 1
        out.update(zip(*request.last))  # noqa: B905 (strict= costs a keyword call)
        if unsupported:
            log.debug("GPM metrics %s not supported; not asked again", unsupported)
            self._build([m for m in self._supported if m not in unsupported])

    def free(self) -> None:
        """Release both sample buffers (errors ignored: this runs at shutdown)."""
        for sample in self._samples:
            with contextlib.suppress(Exception):  # best effort at shutdown
                self._nvml.nvmlGpmSampleFree(sample)
        self._samples = []


@dataclass(slots=True)
class _Device:
    """Everything the backend keeps for one GPU index."""

    index: int
    handle: Any
    down_reason: str = ""  # non-empty: could not be set up at start; reads as down
    fast: list[tuple[str, Getter]] = field(default_factory=list)
    slow: list[tuple[str, Getter]] = field(default_factory=list)
    fast_fields: _FieldBatch | None = None
    slow_fields: _FieldBatch | None = None
    nvlink_fields: _FieldBatch | None = None
    nvlink_last: tuple[float, float] | None = None  # (clock, KiB rx + tx) of the last read
    fallbacks: dict[str, tuple[str, Getter]] = field(default_factory=dict)  # by getter name
    gpm: _Gpm | None = None
    no_fallback: set[str] = field(default_factory=set)  # violations without a fallback
    warned: set[str] = field(default_factory=set)


class NvmlBackend:
    """GPU facts, readings and XID events from NVML (and GPM on Hopper and newer).

    ``nvml`` is the pynvml module (the installed one when not given; tests pass a fake).
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
            nvml = libnvml.pynvml
        self._nvml = nvml
        self._clock = clock
        self._closed = False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # every failure here means "no driver"
            raise libnvml.no_driver(exc) from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            raise NoDriverError(f"NVML unavailable: nvmlDeviceGetCount failed: {exc}") from exc
        self._field_fn = libnvml.resolve(nvml, "nvmlDeviceGetFieldValues")
        if self._field_fn is None or libnvml.FieldValue is None:
            log.info("nvmlDeviceGetFieldValues unavailable (old driver or pynvml): "
                     "field-id metrics absent")
            self._field_fn = None
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

    def _driver_version(self) -> str:
        try:
            return libnvml.text(self._nvml.nvmlSystemGetDriverVersion())
        except Exception:
            return ""

    def _open(self, index: int, driver_version: str) -> tuple[_Device, GpuInfo]:
        """Get the handle and static facts of one GPU; never raises."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # this GPU's failure is this GPU's
            log.warning("GPU %d: no handle (%s); it reads as down", index, exc)
            device = _Device(index, None, down_reason=f"no NVML handle: {exc}")
            return device, GpuInfo(index, "", "", "", driver_version=driver_version)
        device = _Device(index, handle)
        facts: dict[str, Any] = {}

        def fact(name: str, call: Callable[[], Any]) -> None:
            try:
                facts[name] = call()
            except Exception as exc:
                failure = classify(error_code(exc))
                if failure is Failure.GPU_LOST or name == "uuid":
                    device.down_reason = f"{name}: {exc}"
                elif failure is not Failure.UNSUPPORTED:
                    log.warning("GPU %d: reading %s failed: %s", index, name, exc)

        text = libnvml.text
        fact("uuid", lambda: text(nvml.nvmlDeviceGetUUID(handle)))
        fact("name", lambda: text(nvml.nvmlDeviceGetName(handle)))
        fact("pci_bus_id", lambda: text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        fact("serial", lambda: text(nvml.nvmlDeviceGetSerial(handle)))
        fact("vbios_version", lambda: text(nvml.nvmlDeviceGetVbiosVersion(handle)))
        fact("memory_total_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total / _MIB)
        fact("mig", lambda: nvml.nvmlDeviceGetMigMode(handle)[0])
        mig = facts.pop("mig", None)
        mig_mode = "unsupported" if mig is None else (
            "enabled" if mig == libnvml.NVML_DEVICE_MIG_ENABLE else "disabled")
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
        if libnvml.GpmMetricsGet is None:
            return None
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(device.handle).isSupportedDevice:
                return None
        except Exception as exc:  # pre-Hopper, old driver or pynvml
            log.debug("GPU %d: GPM support query failed: %s", device.index, exc)
            return None
        try:
            return _Gpm(nvml, device.handle, self._clock)
        except Exception as exc:  # e.g. profiling restricted to admins
            log.warning("GPU %d: GPM supported but not usable (%s): no profiling metrics",
                        device.index, exc)
            return None

    def _c_function(self, symbols: tuple[str, ...], outputs: int = 1,
                    wrapper: Callable[[Any], Callable[..., Any]] | None = None,
                    ) -> Callable[..., int]:
        """The C function of the first of ``symbols`` NVML exports; else pynvml's wrapper
        (``wrapper(module)``, or the module's function of the first symbol it has) behind
        the same convention, ``outputs`` of its arguments being outputs. The wrapper
        answers "function not found" where the library lacks the symbol, and so does a
        function pynvml does not have."""
        nvml = self._nvml
        fn = libnvml.resolve(nvml, *symbols)
        if fn is not None:
            return fn
        if wrapper is not None:
            return libnvml.getter_as_c(wrapper(nvml), outputs)
        name = next((s for s in symbols if hasattr(nvml, s)), None)
        if name is None:
            return lambda *args: libnvml.NVML_ERROR_FUNCTION_NOT_FOUND
        return libnvml.getter_as_c(getattr(nvml, name), outputs)

    def _getter(self, spec: GetterSpec, device: _Device) -> tuple[str, Getter]:
        """``spec`` bound to the device; its fallback bound too, kept for when needed."""
        if spec.fallback is not None:
            device.fallbacks[spec.name] = self._getter(spec.fallback, device)
        fn = self._c_function(spec.symbols, wrapper=spec.wrapper)
        return spec.name, _bind(fn, spec, device.handle, self._nvml.NVMLError)

    def _license_getter(self, device: _Device) -> Getter:
        """The vGPU license getter: the C function into a reused struct, else pynvml's."""
        nvml, handle, error = self._nvml, device.handle, self._nvml.NVMLError
        fn = libnvml.resolve(nvml, LICENSE_SYMBOL)
        if fn is not None and libnvml.GridLicensableFeatures is not None:
            features = libnvml.GridLicensableFeatures()
            ref = ctypes.byref(features)

            def read() -> Any:
                ret = fn(handle, ref)
                if ret:
                    raise error(ret)
                return features

            return _bind_license(read)
        wrapper = getattr(nvml, LICENSE_SYMBOL, None)
        if wrapper is None:  # a pynvml without it: the function is as good as absent

            def absent() -> Any:
                raise error(libnvml.NVML_ERROR_FUNCTION_NOT_FOUND)

            return _bind_license(absent)
        return _bind_license(partial(wrapper, handle))

    def _build_getters(self, device: _Device) -> None:
        """Bind each getter and field batch to the device once (see :func:`_bind`)."""
        error = self._nvml.NVMLError
        device.fast[:] = [self._getter(spec, device) for spec in FAST_GETTERS]
        device.fast += [(spec.name, _bind_engine(self._c_function((spec.symbol,), outputs=2),
                                                 spec, device.handle, error))
                        for spec in FAST_ENGINE_GETTERS]
        device.slow[:] = [self._getter(spec, device) for spec in SLOW_GETTERS]
        device.slow.append(("vgpu_license", self._license_getter(device)))
        if self._field_fn is not None:
            device.fast_fields = _FieldBatch(self._field_fn, error, FAST_FIELD_IDS)
            device.slow_fields = _FieldBatch(self._field_fn, error, SLOW_FIELD_IDS)
            device.nvlink_fields = _FieldBatch(self._field_fn, error, NVLINK_FIELD_IDS,
                                               libnvml.SCOPE_ALL_LINKS)

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
                nvml.nvmlDeviceRegisterEvents(
                    device.handle, libnvml.nvmlEventTypeXidCriticalError, self._event_set)
            except Exception as exc:
                if classify(error_code(exc)) is Failure.UNSUPPORTED:
                    log.info("GPU %d: XID events not supported", device.index)
                else:
                    log.warning("GPU %d: XID event registration failed: %s", device.index, exc)
                continue
            address = libnvml.handle_address(device.handle)
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
        flags = _TIER_FLAGS.get(tiers)
        if flags is None:
            flags = _TIER_FLAGS[tiers] = (Tier.FAST in tiers, Tier.SLOW in tiers)
        out: dict[str, float] = {}
        state = _Pass(device)
        if flags[0]:
            state.run(device.fast, out)
            if device.fast_fields is not None:
                device.fast_fields.read(state, out)
        if device.gpm is not None:
            device.gpm.read(state, tiers, out)
        if flags[1]:
            state.run(device.slow, out)
            self._read_slow_fields(state, out)
            self._read_nvlink(state, out)
        if not state.ok and state.unknown:
            raise GpuUnavailable("every NVML call failed with Unknown Error")
        return GpuReading(out, state.errors)

    def _read_slow_fields(self, state: _Pass, out: dict[str, float]) -> None:
        device = state.device
        batch = device.slow_fields
        if batch is not None:
            batch.read(state, out)
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

    def _read_nvlink(self, state: _Pass, out: dict[str, float]) -> None:
        """``nvlink_bandwidth_total`` as DCGM computes DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL:
        the rx + tx data counters' growth since the previous read, in KiB, per second,
        divided by 1000. Absent on the first read (no window yet) and where a counter
        went back (a driver reload) or did not answer."""
        device = state.device
        batch = device.nvlink_fields
        if batch is None or not batch.fields:
            return
        counters: dict[str, float] = {}
        batch.read(state, counters)
        if len(counters) != len(NVLINK_FIELD_IDS):
            device.nvlink_last = None
            return
        now, total = self._clock(), sum(counters.values())
        last, device.nvlink_last = device.nvlink_last, (now, total)
        if last is not None and now > last[0] and total >= last[1]:
            out["nvlink_bandwidth_total"] = (total - last[1]) / (now - last[0]) / 1000.0

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
                if error_code(exc) != libnvml.NVML_ERROR_TIMEOUT:  # timeout: nothing pending
                    log.debug("nvmlEventSetWait_v2 failed: %s", exc)
                break
            if not data.eventType & libnvml.nvmlEventTypeXidCriticalError:
                continue
            index = self._by_address.get(libnvml.handle_address(data.device) or 0)
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


@dataclass(slots=True)
class _Pass:
    """Bookkeeping of one read of one device: successes, errors, "unknown" answers."""

    device: _Device
    errors: int = 0
    ok: int = 0
    unknown: int = 0

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
            fallbacks = self.device.fallbacks
            instead = [fallbacks.pop(name) for name in dropped if name in fallbacks]
            if instead:  # they answer this read already, and replace the dropped ones
                self.run(instead, out)
                getters += instead

    def failed(self, name: str, exc: Exception) -> bool:
        """Classify a call's exception. True: unsupported, do not call it again.

        Raises GpuUnavailable when the exception says the device is gone.
        """
        failure = classify(error_code(exc))
        if failure is Failure.GPU_LOST:
            raise GpuUnavailable(f"{name}: {exc}")
        if failure is Failure.UNSUPPORTED:
            log.debug("GPU %d: %s not supported (%s); not asked again",
                      self.device.index, name, exc)
            return True
        self.errors += 1
        if failure is Failure.UNKNOWN:
            self.unknown += 1
        if name not in self.device.warned:
            self.device.warned.add(name)
            log.warning("GPU %d: %s failed: %s", self.device.index, name, exc)
        return False
