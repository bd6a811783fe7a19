"""How a key of the field table is read from NVML: one typed binding per row.

A binding names NVML's functions and constants; it does not import them, so the field
table (and with it the simulated backend and the docs) loads without nvidia-ml-py. The
NVML backend resolves the names through :mod:`stepscope.gpu.pynvml_compat` when it
loads, and derives its read lists from the bindings: which getters a FAST or SLOW read
calls, which field ids it batches, which GPM metrics it computes.

``describe()`` is the "Source (NVML)" column of docs/metrics.md; ``nvml_names()`` the
NVML functions and constants a binding names, which a test checks against pynvml.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar


def _number(x: float) -> str:
    """``x`` as the docs write it: 2^20 for the powers of two units are made of."""
    exponent = math.log2(x)
    return f"2^{int(exponent)}" if x >= 1024 and exponent.is_integer() else f"{x:g}"


def _fields(names: tuple[str, ...]) -> str:
    return ("field " if len(names) == 1 else "fields ") + " + ".join(names)


@dataclass(frozen=True, slots=True)
class Getter:
    """``function(device, [argument,] &output)``, served as ``output.member / divisor``.

    Rows naming the same function and argument share one call. ``fallback``: the getter
    read instead, from the first read on, where ``function`` turns out unsupported (a
    driver without it). How each function is called (its output type, older names) is
    :data:`stepscope.gpu.getters.GETTER_CALLS`.
    """

    function: str
    member: str = "value"  # a scalar output's is "value"
    argument: str | None = None  # an NVML constant, e.g. NVML_CLOCK_SM
    divisor: float = 1.0  # NVML's unit per served unit
    fallback: Getter | None = None

    def describe(self) -> str:
        text = f"{self.function}({self.argument or ''})"
        if self.member != "value":
            text += f".{self.member}"
        if self.divisor != 1.0:
            text += f" / {_number(self.divisor)}"
        if self.fallback is not None:
            text += f"; where the driver lacks it, {self.fallback.describe()}"
        return text

    def nvml_names(self) -> tuple[str, ...]:
        names = (self.function,) if self.argument is None else (self.function, self.argument)
        return names + (self.fallback.nvml_names() if self.fallback is not None else ())


@dataclass(frozen=True, slots=True)
class EngineUtilization:
    """``function(device, &utilization, &samplingPeriodUs)``: the percentage.

    NVML's sampling period (which varies by product, as dcgm-exporter's default
    counters note) is not served.
    """

    function: str

    def describe(self) -> str:
        return f"{self.function}()"

    def nvml_names(self) -> tuple[str, ...]:
        return (self.function,)


@dataclass(frozen=True, slots=True)
class LicenseStatus:
    """``function(device, &features)``: DCGM's vGPU license status, decoded from the
    licensable features by :func:`stepscope.gpu.pynvml_compat.vgpu_license_status`."""

    function: str

    def describe(self) -> str:
        return f"{self.function}()"

    def nvml_names(self) -> tuple[str, ...]:
        return (self.function, "NVML_GRID_LICENSE_FEATURE_CODE_VGPU")


@dataclass(frozen=True, slots=True)
class FieldId:
    """One value of the ``nvmlDeviceGetFieldValues`` call of its tier (one call per tier)."""

    field_id: str  # NVML_FI_DEV_*

    def describe(self) -> str:
        return _fields((self.field_id,))

    def nvml_names(self) -> tuple[str, ...]:
        return (self.field_id,)


@dataclass(frozen=True, slots=True)
class Violation:
    """Throttled time (ns): the sum of ``field_ids``, read in the field-value call of its
    tier; where one of them is unsupported, ``nvmlDeviceGetViolationStatus(policy)``."""

    FALLBACK: ClassVar[str] = "nvmlDeviceGetViolationStatus"

    field_ids: tuple[str, ...]  # NVML_FI_DEV_*
    policy: str  # NVML_PERF_POLICY_*

    def describe(self) -> str:
        return f"{_fields(self.field_ids)}; fallback {self.FALLBACK}({self.policy})"

    def nvml_names(self) -> tuple[str, ...]:
        return (*self.field_ids, self.FALLBACK, self.policy)


@dataclass(frozen=True, slots=True)
class FieldRate:
    """The growth of the sum of ``field_ids`` (counters asked summed over every NVLink)
    since the previous read, per second, divided by ``divisor``. Absent on the first
    read (no window yet) and where a counter went back (a driver reload)."""

    field_ids: tuple[str, ...]  # NVML_FI_DEV_*
    divisor: float = 1.0

    def describe(self) -> str:
        text = f"{_fields(self.field_ids)}, all links: growth over the interval / s"
        return text + (f" / {_number(self.divisor)}" if self.divisor != 1.0 else "")

    def nvml_names(self) -> tuple[str, ...]:
        return self.field_ids


@dataclass(frozen=True, slots=True)
class Gpm:
    """A GPM metric over the time between two samples, times ``scale`` (GPM gives
    percentages and MiB/s; DCGM serves ratios and bytes/s). Ratios are clamped to 0-1."""

    metric: str  # NVML_GPM_METRIC_*
    scale: float

    def describe(self) -> str:
        if self.scale < 1.0:
            return f"GPM {self.metric} / {_number(1.0 / self.scale)}"
        return f"GPM {self.metric} * {_number(self.scale)}"

    def nvml_names(self) -> tuple[str, ...]:
        return (self.metric,)


#: Every kind of binding.
Binding = Getter | EngineUtilization | LicenseStatus | FieldId | Violation | FieldRate | Gpm
