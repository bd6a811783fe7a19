"""The per-GPU metric table: one row per served series family.

This table is the single source for four things: which keys a backend fills, how
the NVML backend reads each (its binding: a getter, a field id, a GPM metric, ...,
see :mod:`stepscope.gpu.bindings`), how the sampler tiers them, and how the renderer
names and types them. Names, types and units follow dcgm-exporter so existing
dashboards and alerts work; what is ours is ``stepscope_*`` in Prometheus base units.
docs/metrics.md is checked against this table by the tests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from stepscope.core.exposition import COUNTER, GAUGE
from stepscope.gpu.bindings import (
    Binding,
    EngineUtilization,
    FieldId,
    FieldRate,
    Getter,
    Gpm,
    LicenseStatus,
    Violation,
)
from stepscope.gpu.model import Tier

__all__ = ["COUNTER", "GAUGE"]  # re-exported: the table's rows name their type


_MIB = float(2**20)


@dataclass(frozen=True)
class FieldSpec:
    """One per-GPU scalar metric.

    ``key``: the name backends use in ``GpuReading.values``. ``binding``: how the NVML
    backend reads it (:mod:`stepscope.gpu.bindings`); its read lists are derived from
    these. ``note``: what the docs add to the binding's own description.
    """

    key: str
    name: str
    type: str
    help: str
    unit: str
    binding: Binding
    tier: Tier = Tier.FAST
    note: str = ""
    # served from the first pass its value is non-zero on the GPU (a tensor pipe the
    # GPU never ran, e.g. IMMA and DFMA under bf16 training, costs no series)
    once_active: bool = False

    @property
    def profiling(self) -> bool:
        """Comes from GPM: absent where GPM is unsupported."""
        return isinstance(self.binding, Gpm)

    @property
    def source(self) -> str:
        """The NVML call or field id it comes from, as the docs say it."""
        text = self.binding.describe()
        return f"{text} ({self.note})" if self.note else text


def _prof(
    key: str, name: str, help_: str, unit: str, metric: str, scale: float,
    tier: Tier = Tier.FAST, once_active: bool = False,
) -> FieldSpec:
    return FieldSpec(key, name, GAUGE, help_, unit, Gpm(f"NVML_GPM_METRIC_{metric}", scale),
                     tier, once_active=once_active)  # fmt: skip


FIELDS: tuple[FieldSpec, ...] = (
    # Activity
    FieldSpec(
        "gpu_util",
        "DCGM_FI_DEV_GPU_UTIL",
        GAUGE,
        "GPU utilization (in %): share of time any kernel ran; not how busy the SMs were.",
        "percent",
        Getter("nvmlDeviceGetUtilizationRates", "gpu"),
    ),
    FieldSpec(
        "mem_copy_util",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        GAUGE,
        "Memory copy utilization (in %).",
        "percent",
        Getter("nvmlDeviceGetUtilizationRates", "memory"),
    ),
    FieldSpec(
        "enc_util",
        "DCGM_FI_DEV_ENC_UTIL",
        GAUGE,
        "Encoder utilization (in %).",
        "percent",
        EngineUtilization("nvmlDeviceGetEncoderUtilization"),
    ),
    FieldSpec(
        "dec_util",
        "DCGM_FI_DEV_DEC_UTIL",
        GAUGE,
        "Decoder utilization (in %).",
        "percent",
        EngineUtilization("nvmlDeviceGetDecoderUtilization"),
    ),
    # Profiling (GPM), ratios 0-1 like DCGM's DCP fields
    _prof(
        "gr_engine_active",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active (0-1), over one interval, read on the "
        "slow tier.",
        "ratio",
        "GRAPHICS_UTIL",
        0.01,
        # On an H200 this one GPM metric costs ~1.4 ms of CPU per computation while the
        # other fourteen cost ~1 us together: computing it every pass would be ~95% of a
        # GPU's sampling cost.
        Tier.SLOW,
    ),
    _prof(
        "sm_active",
        "DCGM_FI_PROF_SM_ACTIVE",
        "Ratio of cycles an SM has at least one warp assigned (0-1).",
        "ratio",
        "SM_UTIL",
        0.01,
    ),
    _prof(
        "sm_occupancy",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "Ratio of resident warps on SMs to the maximum (0-1).",
        "ratio",
        "SM_OCCUPANCY",
        0.01,
    ),
    _prof(
        "pipe_tensor_active",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles any tensor pipe is active (0-1).",
        "ratio",
        "ANY_TENSOR_UTIL",
        0.01,
    ),
    _prof(
        "pipe_tensor_hmma_active",
        "stepscope_gpu_pipe_tensor_hmma_active_ratio",
        "Ratio of cycles the HMMA (fp16/bf16/tf32) tensor pipe is active (0-1).",
        "ratio",
        "HMMA_TENSOR_UTIL",
        0.01,
        once_active=True,
    ),
    _prof(
        "pipe_tensor_imma_active",
        "stepscope_gpu_pipe_tensor_imma_active_ratio",
        "Ratio of cycles the IMMA (integer) tensor pipe is active (0-1).",
        "ratio",
        "IMMA_TENSOR_UTIL",
        0.01,
        once_active=True,
    ),
    _prof(
        "pipe_tensor_dfma_active",
        "stepscope_gpu_pipe_tensor_dfma_active_ratio",
        "Ratio of cycles the DFMA (fp64) tensor pipe is active (0-1).",
        "ratio",
        "DFMA_TENSOR_UTIL",
        0.01,
        once_active=True,
    ),
    _prof(
        "pipe_fp64_active",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "Ratio of cycles the FP64 (non-tensor) pipe is active (0-1).",
        "ratio",
        "FP64_UTIL",
        0.01,
    ),
    _prof(
        "pipe_fp32_active",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "Ratio of cycles the FP32 (non-tensor) pipe is active (0-1).",
        "ratio",
        "FP32_UTIL",
        0.01,
    ),
    _prof(
        "pipe_fp16_active",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "Ratio of cycles the FP16 (non-tensor) pipe is active (0-1).",
        "ratio",
        "FP16_UTIL",
        0.01,
    ),
    _prof(
        "dram_active",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active (0-1).",
        "ratio",
        "DRAM_BW_UTIL",
        0.01,
    ),
    _prof(
        "pcie_tx_bytes",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "Rate of data transmitted over PCIe, headers and payload (in bytes/s).",
        "bytes/s",
        "PCIE_TX_PER_SEC",
        _MIB,
    ),
    _prof(
        "pcie_rx_bytes",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "Rate of data received over PCIe, headers and payload (in bytes/s).",
        "bytes/s",
        "PCIE_RX_PER_SEC",
        _MIB,
    ),
    _prof(
        "nvlink_tx_bytes",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "Rate of data transmitted over NVLink, all links (in bytes/s).",
        "bytes/s",
        "NVLINK_TOTAL_TX_PER_SEC",
        _MIB,
    ),
    _prof(
        "nvlink_rx_bytes",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "Rate of data received over NVLink, all links (in bytes/s).",
        "bytes/s",
        "NVLINK_TOTAL_RX_PER_SEC",
        _MIB,
    ),
    # A rate despite its counter type: DCGM computes it so and dcgm-exporter's default
    # counters call it a counter; both are kept so that its dashboards read the same.
    FieldSpec(
        "nvlink_bandwidth_total",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        COUNTER,
        "NVLink data received plus transmitted over all links, per second over the slow "
        "interval, in DCGM's unit: KiB/s / 1000 (a rate, though typed counter as in "
        "dcgm-exporter).",
        "KiB/s / 1000",
        # Neither needs a fresher reading: a rate over the slow interval is what
        # dcgm-exporter's 30 s default gives.
        FieldRate(("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
                   "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"), 1000.0),
        Tier.SLOW,
        note="counters in KiB; as DCGM computes it",
    ),
    # Clocks, thermal, power
    FieldSpec(
        "sm_clock",
        "DCGM_FI_DEV_SM_CLOCK",
        GAUGE,
        "SM clock frequency (in MHz).",
        "MHz",
        Getter("nvmlDeviceGetClockInfo", argument="NVML_CLOCK_SM"),
    ),
    FieldSpec(
        "mem_clock",
        "DCGM_FI_DEV_MEM_CLOCK",
        GAUGE,
        "Memory clock frequency (in MHz).",
        "MHz",
        Getter("nvmlDeviceGetClockInfo", argument="NVML_CLOCK_MEM"),
    ),
    FieldSpec(
        "gpu_temp",
        "DCGM_FI_DEV_GPU_TEMP",
        GAUGE,
        "GPU temperature (in C).",
        "C",
        Getter("nvmlDeviceGetTemperature", argument="NVML_TEMPERATURE_GPU"),
    ),
    FieldSpec(
        "memory_temp",
        "DCGM_FI_DEV_MEMORY_TEMP",
        GAUGE,
        "Memory temperature (in C).",
        "C",
        FieldId("NVML_FI_DEV_MEMORY_TEMP"),
    ),
    FieldSpec(
        "power_usage",
        "DCGM_FI_DEV_POWER_USAGE",
        GAUGE,
        "Power draw (in W).",
        "W",
        Getter("nvmlDeviceGetPowerUsage", divisor=1000.0),  # mW
    ),
    # The limits tell a GPU held at a lowered cap from one at its board's own: a busy bf16
    # GPU sits at its default cap all the time, which is no fault (the power-cap alert
    # compares the two). A limit changes only by an operator or the platform: slow tier.
    FieldSpec(
        "enforced_power_limit",
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        GAUGE,
        "Enforced power limit (in W): the effective limit after every limiter.",
        "W",
        Getter("nvmlDeviceGetEnforcedPowerLimit", divisor=1000.0),  # mW
        Tier.SLOW,
    ),
    FieldSpec(
        "power_mgmt_limit_def",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
        GAUGE,
        "Default power management limit (in W): the board's own, before any change.",
        "W",
        Getter("nvmlDeviceGetPowerManagementDefaultLimit", divisor=1000.0),  # mW
        Tier.SLOW,
    ),
    FieldSpec(
        "total_energy",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        COUNTER,
        "Total energy consumption since boot (in mJ).",
        "mJ",
        Getter("nvmlDeviceGetTotalEnergyConsumption"),  # ~2.8 ms CPU on an H200
        Tier.SLOW,
    ),
    # Throttling
    FieldSpec(
        "clocks_event_reasons",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        GAUGE,
        "Current clock event (throttle) reasons, NVML bitmask.",
        "bitmask",
        Getter("nvmlDeviceGetCurrentClocksEventReasons"),
    ),
    FieldSpec(
        "thermal_violation",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        COUNTER,
        "Throttling duration due to thermal constraints (in ns).",
        "ns",
        Violation(("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
                   "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
                  "NVML_PERF_POLICY_THERMAL"),
        Tier.SLOW,
    ),
    FieldSpec(
        "power_violation",
        "DCGM_FI_DEV_POWER_VIOLATION",
        COUNTER,
        "Throttling duration due to power constraints (in ns).",
        "ns",
        Violation(("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",), "NVML_PERF_POLICY_POWER"),
        Tier.SLOW,
    ),
    FieldSpec(
        "sync_boost_violation",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        COUNTER,
        "Throttling duration due to sync-boost constraints (in ns).",
        "ns",
        Violation(("NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",),
                  "NVML_PERF_POLICY_SYNC_BOOST"),
        Tier.SLOW,
    ),
    FieldSpec(
        "board_limit_violation",
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        COUNTER,
        "Throttling duration due to board limit constraints (in ns).",
        "ns",
        Violation(("NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT",), "NVML_PERF_POLICY_BOARD_LIMIT"),
        Tier.SLOW,
    ),
    # Memory. Version 2 as DCGM (drivers from 510 on): ``used`` without what the driver
    # and firmware reserve, which is ``reserved``. Version 1 where the driver has no v2:
    # its ``used`` includes the reserved memory, and there is no ``fb_reserved``.
    FieldSpec(
        "fb_used",
        "DCGM_FI_DEV_FB_USED",
        GAUGE,
        "Framebuffer memory used (in MiB), without the reserved memory.",
        "MiB",
        Getter("nvmlDeviceGetMemoryInfo_v2", "used", divisor=_MIB,
               fallback=Getter("nvmlDeviceGetMemoryInfo", "used", divisor=_MIB)),
        note="drivers before 510: reserved included",
    ),
    FieldSpec(
        "fb_free",
        "DCGM_FI_DEV_FB_FREE",
        GAUGE,
        "Framebuffer memory free (in MiB).",
        "MiB",
        Getter("nvmlDeviceGetMemoryInfo_v2", "free", divisor=_MIB,
               fallback=Getter("nvmlDeviceGetMemoryInfo", "free", divisor=_MIB)),
    ),
    FieldSpec(
        "fb_reserved",
        "DCGM_FI_DEV_FB_RESERVED",
        GAUGE,
        "Framebuffer memory reserved by the driver and firmware (in MiB).",
        "MiB",
        Getter("nvmlDeviceGetMemoryInfo_v2", "reserved", divisor=_MIB),
        note="absent before driver 510",
    ),
    # Errors
    FieldSpec(
        "ecc_sbe_vol_total",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        COUNTER,
        "Total number of single-bit volatile ECC errors.",
        "errors",
        FieldId("NVML_FI_DEV_ECC_SBE_VOL_TOTAL"),
    ),
    FieldSpec(
        "ecc_dbe_vol_total",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        COUNTER,
        "Total number of double-bit volatile ECC errors.",
        "errors",
        FieldId("NVML_FI_DEV_ECC_DBE_VOL_TOTAL"),
    ),
    FieldSpec(
        "ecc_sbe_agg_total",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        COUNTER,
        "Total number of single-bit persistent ECC errors.",
        "errors",
        FieldId("NVML_FI_DEV_ECC_SBE_AGG_TOTAL"),
    ),
    FieldSpec(
        "ecc_dbe_agg_total",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        COUNTER,
        "Total number of double-bit persistent ECC errors.",
        "errors",
        FieldId("NVML_FI_DEV_ECC_DBE_AGG_TOTAL"),
    ),
    FieldSpec(
        "correctable_remapped_rows",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        COUNTER,
        "Number of remapped rows for correctable errors.",
        "rows",
        FieldId("NVML_FI_DEV_REMAPPED_COR"),
    ),
    FieldSpec(
        "uncorrectable_remapped_rows",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        COUNTER,
        "Number of remapped rows for uncorrectable errors.",
        "rows",
        FieldId("NVML_FI_DEV_REMAPPED_UNC"),
    ),
    FieldSpec(
        "row_remap_pending",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        GAUGE,
        "Whether a row remap is pending a GPU reset (1) or not (0).",
        "bool",
        FieldId("NVML_FI_DEV_REMAPPED_PENDING"),
    ),
    FieldSpec(
        "row_remap_failure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        GAUGE,
        "Whether remapping of rows has failed (1) or not (0).",
        "bool",
        FieldId("NVML_FI_DEV_REMAPPED_FAILURE"),
    ),
    FieldSpec(
        "pcie_replay",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        COUNTER,
        "Total number of PCIe retries.",
        "retries",
        FieldId("NVML_FI_DEV_PCIE_REPLAY_COUNTER"),  # ~0.17 ms on an H200
        Tier.SLOW,
    ),
    FieldSpec(
        "vgpu_license_status",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        GAUGE,
        "vGPU license status: 1 licensed, 0 not licensed or vGPU licensing not supported "
        "(a bare-metal GPU).",
        "bool",
        LicenseStatus("nvmlDeviceGetGridLicensableFeatures_v4"),  # DCGM calls the same
        Tier.SLOW,  # a license changes rarely
        note="0 unless isGridLicenseSupported, else the vGPU feature's featureState > 0",
    ),
)

# dcgm-exporter serves the driver version as a label of this name on every series of
# its DCGM_FI_* families (a "label" line of its default counters), not as a series.
DRIVER_VERSION_LABEL = "DCGM_FI_DRIVER_VERSION"

# dcgm-exporter's default counters (NVIDIA/dcgm-exporter etc/default-counters.csv, commit
# d5e5f51, 2026-05-12; the same set as etc/dcp-metrics-included.csv): every line that is
# not a comment, in its order, as (field, type). Each is served (a test checks it).
DEFAULT_COUNTERS: tuple[tuple[str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_DRIVER_VERSION", "label"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
)

FIELDS_BY_KEY: dict[str, FieldSpec] = {f.key: f for f in FIELDS}
PROFILING_KEYS: frozenset[str] = frozenset(f.key for f in FIELDS if f.profiling)
SLOW_KEYS: frozenset[str] = frozenset(f.key for f in FIELDS if f.tier is Tier.SLOW)
# keys served only once they have been non-zero on the GPU (FieldSpec.once_active)
ONCE_ACTIVE_KEYS: tuple[str, ...] = tuple(f.key for f in FIELDS if f.once_active)


class ClockEvent(enum.IntFlag):
    """NVML's clock event (throttle) reason bits (``nvmlClocksEventReason*``).

    The member name, lower-cased, is the label value of
    ``stepscope_gpu_clock_event_active{reason=...}``.
    """

    GPU_IDLE = 0x001
    APPLICATIONS_CLOCKS_SETTING = 0x002
    SW_POWER_CAP = 0x004
    HW_SLOWDOWN = 0x008
    SYNC_BOOST = 0x010
    SW_THERMAL_SLOWDOWN = 0x020
    HW_THERMAL_SLOWDOWN = 0x040
    HW_POWER_BRAKE_SLOWDOWN = 0x080
    DISPLAY_CLOCK_SETTING = 0x100


# Clocks held down by temperature, and by power.
THERMAL_EVENTS = ClockEvent.SW_THERMAL_SLOWDOWN | ClockEvent.HW_THERMAL_SLOWDOWN
POWER_EVENTS = ClockEvent.SW_POWER_CAP | ClockEvent.HW_POWER_BRAKE_SLOWDOWN

# bit -> reason label value, in bit order
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = tuple(
    (int(e), str(e.name).lower()) for e in ClockEvent
)


@dataclass(frozen=True)
class ClockEventDuration:
    """Cumulative time clocks were held down for one reason (ns), a non-deprecated NVML
    field id read on the slow tier; served in s as
    ``stepscope_gpu_clock_event_seconds_total{reason=...}``."""

    reason: str  # a ClockEvent name, lower-cased
    binding: FieldId

    @property
    def key(self) -> str:
        """Its key in ``GpuReading.values``."""
        return f"clock_event_ns.{self.reason}"


CLOCK_EVENT_DURATIONS: tuple[ClockEventDuration, ...] = (
    ClockEventDuration("sw_power_cap", FieldId("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP")),
    ClockEventDuration("sync_boost", FieldId("NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST")),
    ClockEventDuration("sw_thermal_slowdown",
                       FieldId("NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN")),
    ClockEventDuration("hw_thermal_slowdown",
                       FieldId("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN")),
    ClockEventDuration("hw_power_brake_slowdown",
                       FieldId("NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN")),
)
# Key in GpuReading.values -> reason label value.
CLOCK_EVENT_DURATION_KEYS: tuple[tuple[str, str], ...] = tuple(
    (d.key, d.reason) for d in CLOCK_EVENT_DURATIONS)
SLOW_KEYS = SLOW_KEYS | frozenset(k for k, _ in CLOCK_EVENT_DURATION_KEYS)


def markdown_table() -> str:
    """The per-GPU field table as Markdown (docs/metrics.md embeds it: python -m generate)."""
    rows = [
        "| Metric | Type | Unit | Tier | Source (NVML) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in FIELDS:
        tier = "slow" if f.tier is Tier.SLOW else "fast"
        if f.profiling:
            tier += ", GPM"
        if f.once_active:
            tier += ", once active"
        rows.append(f"| `{f.name}` | {f.type} | {f.unit} | {tier} | {f.source} |")
    rows.append(f"| `{DRIVER_VERSION_LABEL}` | label | | at start | nvmlSystemGetDriverVersion(), "
                "a label of every DCGM_FI_* series |")
    return "\n".join(rows) + "\n"

