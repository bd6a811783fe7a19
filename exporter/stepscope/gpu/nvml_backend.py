"""The real GPU backend: NVML through nvidia-ml-py (``import pynvml``), plus GPM.

Every key of :mod:`stepscope.gpu.fields` is read as its binding says, at its tier. A
FAST read is what every sampling pass pays for every GPU, so it holds only calls that
cost microseconds (on an H200 each getter costs 1-5 µs CPU); calls that cost
milliseconds, or counters nobody needs each second, are on the SLOW tier. What a read
calls is derived from the field table by the modules it reads through:

- :mod:`stepscope.gpu.getters`: the getter calls of each tier (``nvmlDeviceGet*``),
  bound once per GPU to their C functions and output buffers;
- :mod:`stepscope.gpu.field_reads`: one ``nvmlDeviceGetFieldValues`` call per tier, the
  violation counters summed from the slow one (``nvmlDeviceGetViolationStatus`` where
  its field ids are unsupported), and the NVLink bandwidth rate;
- :mod:`stepscope.gpu.gpm`: GPM samples and the profiling metrics between them;
- :mod:`stepscope.gpu.xid_events`: the XID event set.

NVML's codes, struct mirrors and error policy are :mod:`stepscope.gpu.pynvml_compat`.
This module holds the devices and the read pass.

What does not work on a device is learnt on the first read and not asked again: a
getter that answers "not supported" is dropped (or replaced by its fallback), an
unsupported field id is taken out of its batch, and the violation fallback is used only
where needed.

Errors follow :func:`stepscope.gpu.pynvml_compat.classify`: "not supported" means the
key is absent; "GPU is lost" and the like raise :class:`GpuUnavailable` (that GPU is
marked down; the others keep reporting); a read in which no call succeeded and one said
"unknown error" raises :class:`GpuUnavailable`; any other failure counts as a collect
error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from stepscope.gpu import pynvml_compat as compat
from stepscope.gpu.field_reads import (
    FAST_FIELD_IDS,
    RATES,
    SLOW_FIELD_IDS,
    CounterRate,
    FieldBatch,
    ViolationCounters,
)
from stepscope.gpu.getters import (
    CALLS,
    CallSpec,
    GetterBinder,
    Getters,
    GetterSpec,
    ReadFn,
    run_getters,
)
from stepscope.gpu.gpm import GpmSampler, open_gpm
from stepscope.gpu.model import (
    GpuInfo,
    GpuReading,
    GpuUnavailable,
    NoDriverError,
    Tier,
    XidEvent,
)
from stepscope.gpu.pynvml_compat import Failure, classify, error_code
from stepscope.gpu.read_pass import ReadPass
from stepscope.gpu.xid_events import XidEventSet

log = logging.getLogger(__name__)

_MIB = 1024.0 * 1024.0

# tiers -> (read FAST, read SLOW); membership of an Enum in a set hashes it in Python,
# and the sampler passes the same few frozensets every pass
_TIER_FLAGS: dict[frozenset[Tier], tuple[bool, bool]] = {}


@dataclass(slots=True)
class _Device:
    """Everything the backend keeps for one GPU index."""

    index: int
    handle: Any
    down_reason: str = ""  # non-empty: could not be set up at start; reads as down
    fast: Getters = field(default_factory=list)
    slow: Getters = field(default_factory=list)
    fallbacks: dict[str, tuple[str, ReadFn]] = field(default_factory=dict)  # by getter name
    fast_fields: FieldBatch | None = None
    slow_fields: FieldBatch | None = None
    violations: ViolationCounters | None = None
    rates: list[CounterRate] = field(default_factory=list)
    gpm: GpmSampler | None = None
    warned: set[str] = field(default_factory=set)


class NvmlBackend:
    """GPU facts, readings and XID events from NVML (and GPM on Hopper and newer).

    ``nvml`` is the pynvml module (the installed one when not given; tests pass a fake).
    ``clock`` is the monotonic clock used to space GPM samples and NVLink rates.
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
            nvml = compat.pynvml
        self._nvml = nvml
        self._clock = clock
        self._closed = False
        try:
            nvml.nvmlInit()
        except Exception as exc:  # every failure here means "no driver"
            raise compat.no_driver(exc) from exc
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self._shutdown()
            raise NoDriverError(f"NVML unavailable: nvmlDeviceGetCount failed: {exc}") from exc
        self._binder = GetterBinder(nvml)
        self._field_fn = compat.resolve(nvml, "nvmlDeviceGetFieldValues")
        if self._field_fn is None or compat.FieldValue is None:
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
        self._events = XidEventSet.open(nvml, [
            (d.index, d.handle) for d in self._devices if d.handle is not None and not d.down_reason
        ])

    # ----------------------------------------------------------------- start

    def _driver_version(self) -> str:
        try:
            return compat.text(self._nvml.nvmlSystemGetDriverVersion())
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

        text = compat.text
        fact("uuid", lambda: text(nvml.nvmlDeviceGetUUID(handle)))
        fact("name", lambda: text(nvml.nvmlDeviceGetName(handle)))
        fact("pci_bus_id", lambda: text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        fact("serial", lambda: text(nvml.nvmlDeviceGetSerial(handle)))
        fact("vbios_version", lambda: text(nvml.nvmlDeviceGetVbiosVersion(handle)))
        fact("memory_total_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total / _MIB)
        fact("mig", lambda: nvml.nvmlDeviceGetMigMode(handle)[0])
        mig = facts.pop("mig", None)
        mig_mode = "unsupported" if mig is None else (
            "enabled" if mig == compat.NVML_DEVICE_MIG_ENABLE else "disabled")
        if device.down_reason:
            log.warning("GPU %d reads as down: %s", index, device.down_reason)
        else:
            self._bind_reads(device)
            if mig_mode != "enabled":
                device.gpm = open_gpm(nvml, handle, index, self._clock)
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

    def _bind_call(self, spec: CallSpec, device: _Device) -> tuple[str, ReadFn]:
        """``spec`` bound to the device; its fallback bound too, kept for when needed."""
        if isinstance(spec, GetterSpec) and spec.fallback is not None:
            device.fallbacks[spec.name] = self._bind_call(spec.fallback, device)
        return spec.name, self._binder.bind(spec, device.handle)

    def _bind_reads(self, device: _Device) -> None:
        """Bind each getter and field batch to the device once."""
        device.fast[:] = [self._bind_call(spec, device) for spec in CALLS[Tier.FAST]]
        device.slow[:] = [self._bind_call(spec, device) for spec in CALLS[Tier.SLOW]]
        device.violations = ViolationCounters(self._nvml, device.handle)
        fn, error, handle = self._field_fn, self._nvml.NVMLError, device.handle
        if fn is not None:
            device.fast_fields = FieldBatch(fn, error, handle, FAST_FIELD_IDS)
            device.slow_fields = FieldBatch(fn, error, handle, SLOW_FIELD_IDS)
            device.rates = [
                CounterRate(FieldBatch(fn, error, handle, rate.field_ids, compat.SCOPE_ALL_LINKS),
                            rate, self._clock)
                for rate in RATES
            ]

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
        state = ReadPass(device.index, device.warned)
        if flags[0]:
            run_getters(state, device.fast, device.fallbacks, out)
            if device.fast_fields is not None:
                device.fast_fields.read(state, out)
        if device.gpm is not None and not device.gpm.read(state, tiers, out):
            device.gpm = None  # unsupported after all
        if flags[1]:
            run_getters(state, device.slow, device.fallbacks, out)
            if device.slow_fields is not None:
                device.slow_fields.read(state, out)
            if device.violations is not None:
                device.violations.read(state, device.slow_fields, out)
            for rate in device.rates:
                rate.read(state, out)
        if not state.ok and state.unknown:
            raise GpuUnavailable("every NVML call failed with Unknown Error")
        return GpuReading(out, state.errors)

    def events(self) -> Sequence[XidEvent]:
        """Drain pending XID events without blocking (timeout 0)."""
        if self._events is None or self._closed:
            return []
        return self._events.drain()

    def close(self) -> None:
        """Free GPM samples and the event set, shut NVML down. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for device in self._devices:
            if device.gpm is not None:
                device.gpm.free()
                device.gpm = None
        if self._events is not None:
            self._events.free()
            self._events = None
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception as exc:
            log.debug("nvmlShutdown failed: %s", exc)
