"""GPM (GPU Performance Monitoring, Hopper and newer): samples, and the profiling metrics
computed between two of them.

Which GPM metric fills which key, at which tier and scale, is the field table's binding
(:class:`~stepscope.gpu.bindings.Gpm`); :data:`GPM_METRICS` is derived from it.

GPM needs two samples. The baseline is taken when the backend starts (which also proves
that GPM works under this user's permissions); every read then takes a new sample
(``nvmlGpmSampleGet``, ~30 µs on an H200) and computes the metrics of its tiers over the
time since the previous one in one ``nvmlGpmMetricsGet``. Reads closer than 0.1 s to the
previous sample reuse the last computed values, since GPM over so short a window is
noise. Measured on an H200 (driver 580): NVML_GPM_METRIC_GRAPHICS_UTIL
(``gr_engine_active``) alone costs 1.4-1.8 ms CPU per computation, the other fourteen
metrics ~1 µs together, so a metric whose row is on the SLOW tier is computed only on
reads that ask for SLOW. GPUs in MIG mode get no profiling keys: GPM on a MIG-enabled GPU
has to be sampled per GPU instance (``nvmlGpmMigSampleGet``), which does not map onto one
per-GPU series.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from itertools import compress
from math import isfinite
from operator import mul
from types import ModuleType
from typing import Any

from stepscope.gpu import pynvml_compat as compat
from stepscope.gpu.bindings import Gpm
from stepscope.gpu.fields import FIELDS, FIELDS_BY_KEY
from stepscope.gpu.model import Tier
from stepscope.gpu.pynvml_compat import Failure, classify
from stepscope.gpu.read_pass import ReadPass

log = logging.getLogger(__name__)

_GPM_MIN_INTERVAL = 0.1  # seconds between GPM samples below which metrics are noise


def _gpm_metrics() -> tuple[tuple[int, str, float], ...]:
    return tuple((compat.constant(binding.metric), spec.key, binding.scale)
                 for spec in FIELDS if isinstance(binding := spec.binding, Gpm))


#: GPM metric ids -> key and scale, from the field table, in its order.
GPM_METRICS: tuple[tuple[int, str, float], ...] = _gpm_metrics()

# GPM metric id -> (key, scale, is a 0-1 ratio, tier), from the field table.
_GPM_KEYS: dict[int, tuple[str, float, bool, Tier]] = {
    metric_id: (key, scale, FIELDS_BY_KEY[key].unit == "ratio", FIELDS_BY_KEY[key].tier)
    for metric_id, key, scale in GPM_METRICS
}


class _GpmRequest:
    """The GPM metrics of one set of tiers: the reusable request, scaled to DCGM's units."""

    def __init__(self, metric_ids: Sequence[int], samples: tuple[Any, Any]) -> None:
        # ratios first, so that one slice of the values holds every value to clamp
        self.ids = sorted(metric_ids, key=lambda metric_id: not _GPM_KEYS[metric_id][2])
        plan = [_GPM_KEYS[metric_id] for metric_id in self.ids]
        self._keys = tuple(key for key, _, _, _ in plan)
        self._scales = tuple(scale for _, scale, _, _ in plan)
        self._ratios = sum(ratio for _, _, ratio, _ in plan)
        self.request = compat.GpmMetricsRequest(self.ids, samples)
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
            if code != compat.NVML_SUCCESS:
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


class GpmSampler:
    """GPM state of one device: two sample buffers and reusable metrics requests."""

    def __init__(self, nvml: ModuleType, handle: Any, clock: Callable[[], float]) -> None:
        """Allocate both buffers and take the baseline sample.

        ``clock`` is the monotonic clock that spaces samples. Raises the pynvml error
        when GPM cannot be sampled here; nothing is leaked.
        """
        self._nvml = nvml
        self._handle = handle
        self._clock = clock
        self._samples: list[Any] = []
        # The per-read calls go straight to C (see pynvml_compat.resolve).
        self._error = nvml.NVMLError
        self._sample_get = (compat.resolve(nvml, "nvmlGpmSampleGet")
                            or compat.call_as_c(nvml.nvmlGpmSampleGet))
        self._metrics_get = (compat.resolve(nvml, "nvmlGpmMetricsGet")
                             or compat.call_as_c(lambda ref: nvml.nvmlGpmMetricsGet(ref._obj)))
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

    def read(self, state: ReadPass, tiers: frozenset[Tier], out: dict[str, float]) -> bool:
        """Sample and put the metrics of ``tiers`` since the previous sample in ``out``.

        NVML is not asked when there is nothing to compute, nor when the previous
        sample is too recent (the previous values are given). A failure is classified
        on ``state``. False where GPM turns out unsupported: the buffers are freed, and
        the device drops GPM.
        """
        request = self._requests.get(tiers)
        if request is None or not request.ids:
            return True
        if self._clock() - self._previous_at < _GPM_MIN_INTERVAL:
            out.update(zip(*request.last))  # noqa: B905 (too close: the previous values)
            return True
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
        except Exception as exc:  # classified by ReadPass
            if state.failed("gpm", exc):
                self.free()
                return False
            return True
        state.ok += 1
        out.update(zip(*request.last))  # noqa: B905 (strict= costs a keyword call)
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


def open_gpm(nvml: ModuleType, handle: Any, index: int,
             clock: Callable[[], float]) -> GpmSampler | None:
    """GPM state of GPU ``index`` if it supports GPM and this user may sample it."""
    if compat.GpmMetricsGet is None:
        return None
    try:
        if not nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
            return None
    except Exception as exc:  # pre-Hopper, old driver or pynvml
        log.debug("GPU %d: GPM support query failed: %s", index, exc)
        return None
    try:
        return GpmSampler(nvml, handle, clock)
    except Exception as exc:  # e.g. profiling restricted to admins
        log.warning("GPU %d: GPM supported but not usable (%s): no profiling metrics",
                    index, exc)
        return None
