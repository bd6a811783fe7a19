"""Field-value reads: one ``nvmlDeviceGetFieldValues`` call per tier, the violation
counters summed from it, and the rates computed from counters.

Which field id fills which key, at which tier, is the field table's binding
(:class:`~stepscope.gpu.bindings.FieldId`, :class:`~stepscope.gpu.bindings.Violation`,
:class:`~stepscope.gpu.bindings.FieldRate`) and, for the clock-event durations,
:data:`stepscope.gpu.fields.CLOCK_EVENT_DURATIONS`; the read lists here are derived
from them.

FAST: ``memory_temp``, the ECC totals and the row-remapping fields in one call (~2.5 µs
for all nine on an H200). SLOW: one call (~0.7 ms; the hw thermal and power-brake
durations ~0.65 ms each, the PCIe replay counter ~0.17 ms) for the clock-event durations,
the board limit counter and the PCIe replay counter; a violation counter is their sum,
or ``nvmlDeviceGetViolationStatus`` (~0.6 ms each) only where one of its field ids is not
supported by this driver or GPU; and one call for the NVLink data counters summed over
every link, from which ``nvlink_bandwidth_total`` is computed as DCGM computes it.

A field id the device does not support is dropped from its batch after its first
answer; answers are decoded with one ``struct`` unpack per batch
(:class:`stepscope.gpu.pynvml_compat.FieldValueArray`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from stepscope.gpu import pynvml_compat as compat
from stepscope.gpu.bindings import FieldId, FieldRate, Violation
from stepscope.gpu.fields import CLOCK_EVENT_DURATIONS, FIELDS
from stepscope.gpu.model import Tier
from stepscope.gpu.pynvml_compat import Failure, classify
from stepscope.gpu.read_pass import ReadPass

log = logging.getLogger(__name__)


def _check_tiers() -> None:
    """Violation counters and rates are read on the slow tier only: a violation's
    fallback costs ~0.6 ms, and a rate is computed over the interval between slow reads."""
    for spec in FIELDS:
        if isinstance(spec.binding, Violation | FieldRate) and spec.tier is not Tier.SLOW:
            raise ValueError(f"{spec.key}: a {type(spec.binding).__name__} is read on the "
                             "slow tier only")


_check_tiers()


def _named_field_ids(tier: Tier) -> dict[str, str]:
    """The field ids of the field-value call of ``tier`` by name -> key, in the table's
    order: its FieldId rows, and the field ids its violation counters sum (each under the
    clock-event duration's key, or else its counter's own)."""
    named: dict[str, str] = {}
    if tier is Tier.SLOW:
        named.update((d.binding.field_id, d.key) for d in CLOCK_EVENT_DURATIONS)
    for spec in FIELDS:
        binding = spec.binding
        if spec.tier is not tier:
            continue
        if isinstance(binding, FieldId):
            named.setdefault(binding.field_id, spec.key)
        elif isinstance(binding, Violation):
            own = [name for name in binding.field_ids if name not in named]
            if len(own) > 1:
                raise ValueError(f"{spec.key}: only one field id it sums may be its own")
            named.update(dict.fromkeys(own, spec.key))
    return named


def field_ids_for(tier: Tier) -> tuple[tuple[int, str], ...]:
    """The field ids of the field-value call of a read of ``tier`` -> key."""
    return tuple((compat.constant(name), key) for name, key in _named_field_ids(tier).items())


#: FAST-tier field ids read in one ``nvmlDeviceGetFieldValues`` call -> key.
FAST_FIELD_IDS: tuple[tuple[int, str], ...] = field_ids_for(Tier.FAST)
#: SLOW-tier field ids read in one ``nvmlDeviceGetFieldValues`` call -> key. The
#: clock-event durations also feed the violation counters (see :data:`VIOLATIONS`).
SLOW_FIELD_IDS: tuple[tuple[int, str], ...] = field_ids_for(Tier.SLOW)


def _violations() -> tuple[tuple[str, tuple[str, ...], int], ...]:
    keys = _named_field_ids(Tier.SLOW)
    return tuple(
        (spec.key, tuple(keys[name] for name in binding.field_ids),
         compat.constant(binding.policy))
        for spec in FIELDS if isinstance(binding := spec.binding, Violation))


#: Violation counter -> (keys of SLOW_FIELD_IDS summed, NVML_PERF_POLICY_* of the
#: fallback used where one of those field ids is not supported).
VIOLATIONS: tuple[tuple[str, tuple[str, ...], int], ...] = _violations()


@dataclass(frozen=True, slots=True)
class RateSpec:
    """A rate computed from counters read in one call, asked summed over every NVLink
    (scopeId :data:`stepscope.gpu.pynvml_compat.SCOPE_ALL_LINKS`): ``key`` is the growth
    of their sum per second, divided by ``divisor``. The counters are not served."""

    key: str
    field_ids: tuple[tuple[int, str], ...]  # field id -> its name, a key of the batch only
    divisor: float


def _rates() -> tuple[RateSpec, ...]:
    return tuple(
        RateSpec(spec.key, tuple((compat.constant(name), name) for name in binding.field_ids),
                 binding.divisor)
        for spec in FIELDS if isinstance(binding := spec.binding, FieldRate))


#: The SLOW-tier rates (``nvlink_bandwidth_total`` from the NVLink data counters, in KiB
#: since the driver loaded, as DCGM computes DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).
RATES: tuple[RateSpec, ...] = _rates()


class FieldBatch:
    """One device's ``nvmlDeviceGetFieldValues`` request: the field ids still asked, the
    prebuilt array (:class:`~stepscope.gpu.pynvml_compat.FieldValueArray`) and what each
    answer means.

    Field ids the device does not support are dropped after their first answer.
    """

    def __init__(
        self,
        fn: Callable[..., int],
        error: Callable[[int], BaseException],
        handle: Any,
        fields: Sequence[tuple[int, str]],
        scope_id: int = 0,
    ) -> None:
        self._fn = fn
        self._error = error
        self._handle = handle
        self._scope_id = scope_id
        self._build(fields)

    def _build(self, fields: Sequence[tuple[int, str]]) -> None:
        self.fields = tuple(fields)
        self.keys = frozenset(key for _, key in self.fields)
        self._value_keys = tuple(key for _, key in self.fields)
        self._request = compat.FieldValueArray([fid for fid, _ in self.fields], self._scope_id)
        # The answers of the previous read and their values by key: ECC and row-remap
        # counters and the memory temperature rarely change from one pass to the next.
        self._last_answers: tuple[int | float, ...] | None = None
        self._last: dict[str, float] = {}

    def read(self, state: ReadPass, out: dict[str, float]) -> None:
        """Put each answered field's value in ``out`` under its key, counting on ``state``."""
        if not self.fields:
            return
        request = self._request
        errors = 0
        try:
            ret = self._fn(self._handle, request.count, request.array)
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
        except Exception as exc:  # classified by ReadPass
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
            failure = Failure.ERROR if code == compat.NVML_SUCCESS else classify(
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


class ViolationCounters:
    """One device's violation counters (:data:`VIOLATIONS`): the sum of their field ids
    where the slow batch reads them all, else ``nvmlDeviceGetViolationStatus``."""

    def __init__(self, nvml: ModuleType, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
        self._no_fallback: set[str] = set()  # counters whose fallback is unsupported too

    def read(self, state: ReadPass, batch: FieldBatch | None, out: dict[str, float]) -> None:
        """Put each counter in ``out``; ``batch`` has just been read into it."""
        supported = batch.keys if batch is not None else frozenset()
        for key, parts, policy in VIOLATIONS:
            if supported.issuperset(parts):
                if all(part in out for part in parts):
                    out[key] = sum(out[part] for part in parts)
                continue
            if key in self._no_fallback:
                continue
            try:
                status = self._nvml.nvmlDeviceGetViolationStatus(self._handle, policy)
                out[key] = float(status.violationTime)
                state.ok += 1
            except Exception as exc:  # classified by ReadPass
                if state.failed(f"violation_status:{key}", exc):
                    self._no_fallback.add(key)


class CounterRate:
    """One device's :class:`RateSpec`: its batch and the last (clock, sum) it read."""

    def __init__(self, batch: FieldBatch, spec: RateSpec, clock: Callable[[], float]) -> None:
        self._batch = batch
        self._spec = spec
        self._clock = clock
        self._last: tuple[float, float] | None = None

    def read(self, state: ReadPass, out: dict[str, float]) -> None:
        """The counters' growth since the previous read, per second, over the divisor.
        Absent on the first read (no window yet) and where a counter went back (a driver
        reload) or did not answer."""
        batch = self._batch
        if not batch.fields:
            return
        counters: dict[str, float] = {}
        batch.read(state, counters)
        if len(counters) != len(self._spec.field_ids):
            self._last = None
            return
        now, total = self._clock(), sum(counters.values())
        last, self._last = self._last, (now, total)
        if last is not None and now > last[0] and total >= last[1]:
            out[self._spec.key] = (total - last[1]) / (now - last[0]) / self._spec.divisor
