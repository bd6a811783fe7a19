"""XID events: one NVML event set for every GPU that supports them, drained without
blocking."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from stepscope.gpu import pynvml_compat as compat
from stepscope.gpu.model import XidEvent
from stepscope.gpu.pynvml_compat import Failure, classify, error_code

log = logging.getLogger(__name__)

_MAX_EVENTS_PER_DRAIN = 1024


class XidEventSet:
    """XID critical-error events of the GPUs registered on one NVML event set."""

    def __init__(self, nvml: ModuleType, event_set: Any) -> None:
        self._nvml = nvml
        self._event_set: Any = event_set
        self._by_address: dict[int, int] = {}  # handle address -> GPU index

    @classmethod
    def open(cls, nvml: ModuleType, devices: Iterable[tuple[int, Any]]) -> XidEventSet | None:
        """An event set with every device of ``(index, handle)`` that supports XID events
        registered; None where NVML cannot create one."""
        try:
            events = cls(nvml, nvml.nvmlEventSetCreate())
        except Exception as exc:
            log.warning("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
            return None
        for index, handle in devices:
            events._register(index, handle)
        return events

    def _register(self, index: int, handle: Any) -> None:
        try:
            self._nvml.nvmlDeviceRegisterEvents(
                handle, compat.nvmlEventTypeXidCriticalError, self._event_set)
        except Exception as exc:
            if classify(error_code(exc)) is Failure.UNSUPPORTED:
                log.info("GPU %d: XID events not supported", index)
            else:
                log.warning("GPU %d: XID event registration failed: %s", index, exc)
            return
        address = compat.handle_address(handle)
        if address is not None:
            self._by_address[address] = index

    def drain(self) -> list[XidEvent]:
        """The pending XID events, without blocking (timeout 0)."""
        if self._event_set is None:
            return []
        wait = self._nvml.nvmlEventSetWait_v2
        collected: list[XidEvent] = []
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                data = wait(self._event_set, 0)
            except Exception as exc:
                if error_code(exc) != compat.NVML_ERROR_TIMEOUT:  # timeout: nothing pending
                    log.debug("nvmlEventSetWait_v2 failed: %s", exc)
                break
            if not data.eventType & compat.nvmlEventTypeXidCriticalError:
                continue
            index = self._by_address.get(compat.handle_address(data.device) or 0)
            if index is None:
                log.debug("XID %d from an unknown device handle", data.eventData)
                continue
            collected.append(XidEvent(index=index, xid=int(data.eventData),
                                      timestamp=time.time()))
        return collected

    def free(self) -> None:
        """Free the event set (errors ignored: this runs at shutdown). Safe to call twice."""
        if self._event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(self._event_set)
        except Exception as exc:
            log.debug("nvmlEventSetFree failed: %s", exc)
        self._event_set = None
