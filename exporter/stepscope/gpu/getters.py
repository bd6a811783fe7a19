"""The per-read getter calls: which a FAST or SLOW read makes, each bound once per GPU.

Which getter fills which key, at which tier and scale, is the field table's binding
(:class:`~stepscope.gpu.bindings.Getter`, :class:`~stepscope.gpu.bindings.EngineUtilization`,
:class:`~stepscope.gpu.bindings.LicenseStatus`); :data:`CALLS` is derived from it, rows
naming the same function and argument sharing one call. How each function is called
(its output, older names) is :data:`GETTER_CALLS`.

A bound getter goes straight to NVML's C function with its output built once: a call
does no lookup, allocates no ctypes object and checks one int, which keeps the sampling
cost close to the cost of the NVML calls themselves (``benchmarks/nvml_call_cost.py``
measures the ratio). Where the C function does not resolve, pynvml's wrapper is adapted
to the same convention.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from operator import attrgetter, truediv
from types import ModuleType
from typing import Any

from stepscope.gpu import pynvml_compat as compat
from stepscope.gpu.bindings import EngineUtilization, Getter, LicenseStatus
from stepscope.gpu.fields import FIELDS
from stepscope.gpu.model import Tier
from stepscope.gpu.read_pass import ReadPass

#: A getter bound to one device: puts its keys' values in the dict, or raises pynvml's
#: error.
ReadFn = Callable[[dict[str, float]], None]


@dataclass(frozen=True, slots=True)
class GetterCall:
    """How nvml.h declares a per-read getter: ``symbol(device, [argument,] &output)``.

    ``symbols``: the first the library exports is called (a renamed function keeps its
    old name in older drivers). ``wrapper``: how to call pynvml where no symbol resolves
    (a module without C function pointers), when its wrapper is not simply the function
    named after a symbol.
    """

    output: Callable[[], Any]  # makes the output: its ctypes type, or a function
    symbols: tuple[str, ...]
    wrapper: Callable[[Any], Callable[..., Any]] | None = None


def _plain(*calls: tuple[str, Callable[[], Any]]) -> dict[str, GetterCall]:
    return {symbol: GetterCall(output, (symbol,)) for symbol, output in calls}


#: The getters a :class:`~stepscope.gpu.bindings.Getter` may name, by function.
GETTER_CALLS: dict[str, GetterCall] = {
    **_plain(
        ("nvmlDeviceGetUtilizationRates", compat.Utilization),
        ("nvmlDeviceGetClockInfo", ctypes.c_uint),
        ("nvmlDeviceGetTemperature", ctypes.c_uint),
        ("nvmlDeviceGetPowerUsage", ctypes.c_uint),
        ("nvmlDeviceGetEnforcedPowerLimit", ctypes.c_uint),
        ("nvmlDeviceGetPowerManagementDefaultLimit", ctypes.c_uint),
        ("nvmlDeviceGetTotalEnergyConsumption", ctypes.c_ulonglong),
        ("nvmlDeviceGetMemoryInfo", compat.Memory),
    ),
    # pynvml has no function of this name: its nvmlDeviceGetMemoryInfo takes a version.
    "nvmlDeviceGetMemoryInfo_v2": GetterCall(
        compat.memory_v2, ("nvmlDeviceGetMemoryInfo_v2",),
        wrapper=lambda nvml: partial(nvml.nvmlDeviceGetMemoryInfo,
                                     version=compat.nvmlMemory_v2)),
    # Renamed from "throttle reasons" in NVML 12.2 / nvidia-ml-py 12.535; older drivers
    # export the same function under its old name only.
    "nvmlDeviceGetCurrentClocksEventReasons": GetterCall(
        ctypes.c_ulonglong, ("nvmlDeviceGetCurrentClocksEventReasons",
                             "nvmlDeviceGetCurrentClocksThrottleReasons")),
}


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

    The percentage is served under ``key``; NVML's sampling period is not.
    """

    name: str  # in logs
    symbol: str
    key: str


@dataclass(frozen=True, slots=True)
class LicenseSpec:
    """The vGPU license status: ``symbol(device, &features)``, decoded by
    :func:`stepscope.gpu.pynvml_compat.vgpu_license_status`."""

    name: str  # in logs
    symbol: str
    key: str


CallSpec = GetterSpec | EngineUtilizationSpec | LicenseSpec


def _name(keys: list[str], function: str) -> str:
    return f"{','.join(keys)} ({function})"


def _getter_spec(rows: list[tuple[str, Getter]]) -> GetterSpec:
    """The one call that fills ``rows`` (key, binding), which name the same function and
    argument; their fallbacks, which must name one function too, are its fallback."""
    first = rows[0][1]
    call = GETTER_CALLS[first.function]
    fallbacks = [(key, b.fallback) for key, b in rows if b.fallback is not None]
    if len({(b.function, b.argument) for _, b in fallbacks}) > 1:
        raise ValueError(f"{first.function}: its rows fall back to different getters")
    return GetterSpec(
        name=_name([key for key, _ in rows], first.function),
        symbols=call.symbols,
        output=call.output,
        keys=tuple((key, b.member, b.divisor) for key, b in rows),
        argument=None if first.argument is None else compat.constant(first.argument),
        fallback=_getter_spec(fallbacks) if fallbacks else None,
        wrapper=call.wrapper,
    )


def calls_for(tier: Tier) -> tuple[CallSpec, ...]:
    """The getter calls of a read of ``tier``, in the field table's order (a call that
    fills several keys where its first row is)."""
    rows: dict[tuple[str, str | None], list[tuple[str, Getter]]] = {}
    calls: list[CallSpec | tuple[str, str | None]] = []  # a tuple: the getter of its rows
    for spec in FIELDS:
        binding = spec.binding
        if spec.tier is not tier:
            continue
        if isinstance(binding, Getter):
            call = (binding.function, binding.argument)
            if call not in rows:
                rows[call] = []
                calls.append(call)
            rows[call].append((spec.key, binding))
        elif isinstance(binding, EngineUtilization):
            calls.append(EngineUtilizationSpec(
                _name([spec.key], binding.function), binding.function, spec.key))
        elif isinstance(binding, LicenseStatus):
            calls.append(LicenseSpec(
                _name([spec.key], binding.function), binding.function, spec.key))
    return tuple(_getter_spec(rows[c]) if isinstance(c, tuple) else c for c in calls)


#: The getter calls of every read of each tier, in the order they are called.
CALLS: dict[Tier, tuple[CallSpec, ...]] = {tier: calls_for(tier) for tier in Tier}


def _bind(fn: Callable[..., int], spec: GetterSpec, handle: Any,
          error: Callable[[int], BaseException]) -> ReadFn:
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
                 error: Callable[[int], BaseException]) -> ReadFn:
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


def _bind_license(read: Callable[[], Any], key: str) -> ReadFn:
    """The vGPU license status from ``read`` (the features struct NVML filled, or raises)."""

    def get(out: dict[str, float]) -> None:
        status = compat.vgpu_license_status(read())
        if status is not None:
            out[key] = status

    return get


class GetterBinder:
    """Binds call specs to devices through one pynvml module (the installed one, or a
    test's fake)."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self._error = nvml.NVMLError

    def bind(self, spec: CallSpec, handle: Any) -> ReadFn:
        """``spec`` bound to the device of ``handle``."""
        if isinstance(spec, GetterSpec):
            fn = self._c_function(spec.symbols, wrapper=spec.wrapper)
            return _bind(fn, spec, handle, self._error)
        if isinstance(spec, EngineUtilizationSpec):
            return _bind_engine(self._c_function((spec.symbol,), outputs=2), spec, handle,
                                self._error)
        return self._bind_license(spec, handle)

    def _c_function(self, symbols: tuple[str, ...], outputs: int = 1,
                    wrapper: Callable[[Any], Callable[..., Any]] | None = None,
                    ) -> Callable[..., int]:
        """The C function of the first of ``symbols`` NVML exports; else pynvml's wrapper
        (``wrapper(module)``, or the module's function of the first symbol it has) behind
        the same convention, ``outputs`` of its arguments being outputs. The wrapper
        answers "function not found" where the library lacks the symbol, and so does a
        function pynvml does not have."""
        nvml = self._nvml
        fn = compat.resolve(nvml, *symbols)
        if fn is not None:
            return fn
        if wrapper is not None:
            return compat.getter_as_c(wrapper(nvml), outputs)
        name = next((s for s in symbols if hasattr(nvml, s)), None)
        if name is None:
            return lambda *args: compat.NVML_ERROR_FUNCTION_NOT_FOUND
        return compat.getter_as_c(getattr(nvml, name), outputs)

    def _bind_license(self, spec: LicenseSpec, handle: Any) -> ReadFn:
        """The vGPU license getter: the C function into a reused struct, else pynvml's."""
        nvml, error = self._nvml, self._error
        fn = compat.resolve(nvml, spec.symbol)
        if fn is not None and compat.GridLicensableFeatures is not None:
            features = compat.GridLicensableFeatures()
            ref = ctypes.byref(features)

            def read() -> Any:
                ret = fn(handle, ref)
                if ret:
                    raise error(ret)
                return features

            return _bind_license(read, spec.key)
        wrapper = getattr(nvml, spec.symbol, None)
        if wrapper is None:  # a pynvml without it: the function is as good as absent

            def absent() -> Any:
                raise error(compat.NVML_ERROR_FUNCTION_NOT_FOUND)

            return _bind_license(absent, spec.key)
        return _bind_license(partial(wrapper, handle), spec.key)


#: Bound getters of one device, by name, in call order.
Getters = list[tuple[str, ReadFn]]


def run_getters(state: ReadPass, getters: Getters, fallbacks: dict[str, tuple[str, ReadFn]],
                out: dict[str, float]) -> None:
    """Call each getter; drop those that turn out unsupported, and put the fallbacks of
    dropped getters (by name) in their place."""
    failed = 0
    dropped: list[str] = []
    for name, getter in getters:
        try:
            getter(out)
        except Exception as exc:  # classified below
            failed += 1
            if state.failed(name, exc):
                dropped.append(name)
    state.ok += len(getters) - failed
    if dropped:
        getters[:] = [g for g in getters if g[0] not in dropped]
        instead = [fallbacks.pop(name) for name in dropped if name in fallbacks]
        if instead:  # they answer this read already, and replace the dropped ones
            run_getters(state, instead, fallbacks, out)
            getters += instead
