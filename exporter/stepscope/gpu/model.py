"""Plain data shared by every GPU backend, the sampler and the metric mapping.

A backend turns a device into :class:`GpuInfo` (static facts, read once) and
:class:`GpuReading` (what one sampling pass read). Values are keyed by the
``key`` of a :class:`stepscope.gpu.fields.FieldSpec`; a key that is absent means
"not supported on this GPU" or "not read this pass", never zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

from stepscope.core.labels import GpuIdentity
from stepscope.core.source import PartKey, Tier

__all__ = [
    "GPU_PART",
    "GpuBackend",
    "GpuInfo",
    "GpuPart",
    "GpuReading",
    "GpuState",
    "GpuUnavailable",
    "NoDriverError",
    "Tier",
    "XidEvent",
]


class NoDriverError(RuntimeError):
    """NVML could not be loaded or initialised: there is no usable NVIDIA driver."""


class GpuUnavailable(RuntimeError):
    """The device stopped answering (fell off the bus, lost, reset): mark it down."""


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one GPU, read once at start."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    driver_version: str = ""
    serial: str = ""
    vbios_version: str = ""
    memory_total_mib: float | None = None
    profiling_supported: bool = False
    mig_mode: str = "unsupported"  # "enabled" | "disabled" | "unsupported"

    @property
    def device(self) -> str:
        """The ``device`` label dcgm-exporter uses: ``nvidia<index>``."""
        return f"nvidia{self.index}"

    @property
    def identity(self) -> GpuIdentity:
        """What names this GPU in labels."""
        return GpuIdentity(self.index, self.uuid, self.pci_bus_id, self.name)


@dataclass(frozen=True)
class XidEvent:
    """One XID reported by the driver for GPU ``index``."""

    index: int
    xid: int
    timestamp: float


@dataclass(frozen=True)
class GpuReading:
    """What one pass read from one GPU.

    ``values`` holds FieldSpec keys for the tiers that were asked for; absent keys
    are unsupported or failed. ``errors`` counts getters that failed for a reason
    other than "not supported" (those are reported as collect errors).
    """

    values: Mapping[str, float]
    errors: int = 0


class GpuBackend(Protocol):
    """A source of GPU facts, readings and XID events.

    ``read`` raises :class:`GpuUnavailable` when the device is gone; it must never
    raise for a single unsupported field. ``events`` never blocks.
    """

    name: str

    def devices(self) -> Sequence[GpuInfo]: ...

    def read(self, index: int, tiers: frozenset[Tier]) -> GpuReading: ...

    def events(self) -> Sequence[XidEvent]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class GpuState:
    """One GPU as the latest Snapshot saw it."""

    info: GpuInfo
    up: bool
    values: Mapping[str, float] = field(default_factory=dict)
    xid_counts: Mapping[int, int] = field(default_factory=dict)
    last_xid: int = 0
    sample_cpu_seconds: float = 0.0
    # the once-active keys (gpu.fields.ONCE_ACTIVE_KEYS) seen non-zero on this GPU so far
    active_keys: frozenset[str] = frozenset()


@dataclass(frozen=True)
class GpuPart:
    """The GPU source's part of a Snapshot: every GPU of the node, and the backend."""

    backend: str
    gpus: tuple[GpuState, ...] = ()

    @cached_property
    def by_uuid(self) -> Mapping[str, GpuState]:
        """The GPUs by UUID (built once per part: the diagnosis looks GPUs up by UUID)."""
        return {g.info.uuid: g for g in self.gpus}


GPU_PART: PartKey[GpuPart] = PartKey("gpu")
