"""The per-GPU metric table: one row per served series family.

This table is the single source for three things: which keys a backend fills,
how the sampler tiers them, and how the renderer names and types them. Names,
types and units follow dcgm-exporter so existing dashboards and alerts work;
what is ours is ``stepscope_*`` in Prometheus base units. docs/metrics.md is
checked against this table by the tests.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from stepscope.core.exposition import COUNTER, GAUGE
from stepscope.gpu.model import Tier

__all__ = ["COUNTER", "GAUGE"]  # re-exported: the table's rows name their type


@dataclass(frozen=True)
class FieldSpec:
    """One per-GPU scalar metric.

    ``key``: the name backends use in ``GpuReading.values``. ``source``: the NVML
    call or field id it comes from (documentation). ``profiling``: comes from GPM,
    absent where GPM is unsupported.
    """

    key: str
    name: str
    type: str
    help: str
    unit: str
    source: str
    tier: Tier = Tier.FAST
    profiling: bool = False


def _prof(
    key: str, name: str, help_: str, unit: str, source: str, tier: Tier = Tier.FAST
) -> FieldSpec:
    return FieldSpec(key, name, GAUGE, help_, unit, source, tier, profiling=True)


FIELDS: tuple[FieldSpec, ...] = (
    # Activity
    FieldSpec(
        "gpu_util",
        "DCGM_FI_DEV_GPU_UTIL",
        GAUGE,
        "GPU utilization (in %): share of time any kernel ran; not how busy the SMs were.",
        "percent",
        "nvmlDeviceGetUtilizationRates().gpu",
    ),
    FieldSpec(
        "mem_copy_util",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        GAUGE,
        "Memory copy utilization (in %).",
        "percent",
        "nvmlDeviceGetUtilizationRates().memory",
    ),
    FieldSpec(
        "enc_util",
        "DCGM_FI_DEV_ENC_UTIL",
        GAUGE,
        "Encoder utilization (in %).",
        "percent",
        "nvmlDeviceGetEncoderUtilization()",
    ),
    FieldSpec(
        "dec_util",
        "DCGM_FI_DEV_DEC_UTIL",
        GAUGE,
        "Decoder utilization (in %).",
        "percent",
        "nvmlDeviceGetDecoderUtilization()",
    ),
    # Profiling (GPM), ratios 0-1 like DCGM's DCP fields
    _prof(
        "gr_engine_active",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active (0-1), over one interval, read on the "
        "slow tier.",
        "ratio",
        "GPM NVML_GPM_METRIC_GRAPHICS_UTIL / 100",
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
        "GPM NVML_GPM_METRIC_SM_UTIL / 100",
    ),
    _prof(
        "sm_occupancy",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "Ratio of resident warps on SMs to the maximum (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_SM_OCCUPANCY / 100",
    ),
    _prof(
        "pipe_tensor_active",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles any tensor pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100",
    ),
    _prof(
        "pipe_tensor_hmma_active",
        "stepscope_gpu_pipe_tensor_hmma_active_ratio",
        "Ratio of cycles the HMMA (fp16/bf16/tf32) tensor pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_HMMA_TENSOR_UTIL / 100",
    ),
    _prof(
        "pipe_tensor_imma_active",
        "stepscope_gpu_pipe_tensor_imma_active_ratio",
        "Ratio of cycles the IMMA (integer) tensor pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_IMMA_TENSOR_UTIL / 100",
    ),
    _prof(
        "pipe_tensor_dfma_active",
        "stepscope_gpu_pipe_tensor_dfma_active_ratio",
        "Ratio of cycles the DFMA (fp64) tensor pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_DFMA_TENSOR_UTIL / 100",
    ),
    _prof(
        "pipe_fp64_active",
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "Ratio of cycles the FP64 (non-tensor) pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_FP64_UTIL / 100",
    ),
    _prof(
        "pipe_fp32_active",
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "Ratio of cycles the FP32 (non-tensor) pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_FP32_UTIL / 100",
    ),
    _prof(
        "pipe_fp16_active",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "Ratio of cycles the FP16 (non-tensor) pipe is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_FP16_UTIL / 100",
    ),
    _prof(
        "dram_active",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface is active (0-1).",
        "ratio",
        "GPM NVML_GPM_METRIC_DRAM_BW_UTIL / 100",
    ),
    _prof(
        "pcie_tx_bytes",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "Rate of data transmitted over PCIe, headers and payload (in bytes/s).",
        "bytes/s",
        "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC * 2^20",
    ),
    _prof(
        "pcie_rx_bytes",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "Rate of data received over PCIe, headers and payload (in bytes/s).",
        "bytes/s",
        "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC * 2^20",
    ),
    _prof(
        "nvlink_tx_bytes",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "Rate of data transmitted over NVLink, all links (in bytes/s).",
        "bytes/s",
        "GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC * 2^20",
    ),
    _prof(
        "nvlink_rx_bytes",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "Rate of data received over NVLink, all links (in bytes/s).",
        "bytes/s",
        "GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC * 2^20",
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
        "fields NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX + _TX (KiB, all links): "
        "difference over the interval / s / 1000, as DCGM",
        Tier.SLOW,
    ),
    # Clocks, thermal, power
    FieldSpec(
        "sm_clock",
        "DCGM_FI_DEV_SM_CLOCK",
        GAUGE,
        "SM clock frequency (in MHz).",
        "MHz",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)",
    ),
    FieldSpec(
        "mem_clock",
        "DCGM_FI_DEV_MEM_CLOCK",
        GAUGE,
        "Memory clock frequency (in MHz).",
        "MHz",
        "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)",
    ),
    FieldSpec(
        "gpu_temp",
        "DCGM_FI_DEV_GPU_TEMP",
        GAUGE,
        "GPU temperature (in C).",
        "C",
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
    ),
    FieldSpec(
        "memory_temp",
        "DCGM_FI_DEV_MEMORY_TEMP",
        GAUGE,
        "Memory temperature (in C).",
        "C",
        "field NVML_FI_DEV_MEMORY_TEMP",
    ),
    FieldSpec(
        "power_usage",
        "DCGM_FI_DEV_POWER_USAGE",
        GAUGE,
        "Power draw (in W).",
        "W",
        "nvmlDeviceGetPowerUsage() / 1000",
    ),
    FieldSpec(
        "total_energy",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        COUNTER,
        "Total energy consumption since boot (in mJ).",
        "mJ",
        "nvmlDeviceGetTotalEnergyConsumption()",
        Tier.SLOW,
    ),
    # Throttling
    FieldSpec(
        "clocks_event_reasons",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        GAUGE,
        "Current clock event (throttle) reasons, NVML bitmask.",
        "bitmask",
        "nvmlDeviceGetCurrentClocksEventReasons()",
    ),
    FieldSpec(
        "thermal_violation",
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        COUNTER,
        "Throttling duration due to thermal constraints (in ns).",
        "ns",
        "fields NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN + HW_THERM_SLOWDOWN; "
        "fallback nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_THERMAL)",
        Tier.SLOW,
    ),
    FieldSpec(
        "power_violation",
        "DCGM_FI_DEV_POWER_VIOLATION",
        COUNTER,
        "Throttling duration due to power constraints (in ns).",
        "ns",
        "field NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP; "
        "fallback nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_POWER)",
        Tier.SLOW,
    ),
    FieldSpec(
        "sync_boost_violation",
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        COUNTER,
        "Throttling duration due to sync-boost constraints (in ns).",
        "ns",
        "field NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST; "
        "fallback nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_SYNC_BOOST)",
        Tier.SLOW,
    ),
    FieldSpec(
        "board_limit_violation",
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        COUNTER,
        "Throttling duration due to board limit constraints (in ns).",
        "ns",
        "field NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT; "
        "fallback nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_BOARD_LIMIT)",
        Tier.SLOW,
    ),
    # Memory
    FieldSpec(
        "fb_used",
        "DCGM_FI_DEV_FB_USED",
        GAUGE,
        "Framebuffer memory used (in MiB), without the reserved memory.",
        "MiB",
        "nvmlDeviceGetMemoryInfo_v2().used / 2^20; where the driver has no v2 (before "
        "510), nvmlDeviceGetMemoryInfo().used, reserved included",
    ),
    FieldSpec(
        "fb_free",
        "DCGM_FI_DEV_FB_FREE",
        GAUGE,
        "Framebuffer memory free (in MiB).",
        "MiB",
        "nvmlDeviceGetMemoryInfo_v2().free / 2^20 (v1 before 510)",
    ),
    FieldSpec(
        "fb_reserved",
        "DCGM_FI_DEV_FB_RESERVED",
        GAUGE,
        "Framebuffer memory reserved by the driver and firmware (in MiB).",
        "MiB",
        "nvmlDeviceGetMemoryInfo_v2().reserved / 2^20 (absent before 510)",
    ),
    # Errors
    FieldSpec(
        "ecc_sbe_vol_total",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        COUNTER,
        "Total number of single-bit volatile ECC errors.",
        "errors",
        "field NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    ),
    FieldSpec(
        "ecc_dbe_vol_total",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        COUNTER,
        "Total number of double-bit volatile ECC errors.",
        "errors",
        "field NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    ),
    FieldSpec(
        "ecc_sbe_agg_total",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        COUNTER,
        "Total number of single-bit persistent ECC errors.",
        "errors",
        "field NVML_FI_DEV_ECC_SBE_AGG_TOTAL",
    ),
    FieldSpec(
        "ecc_dbe_agg_total",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        COUNTER,
        "Total number of double-bit persistent ECC errors.",
        "errors",
        "field NVML_FI_DEV_ECC_DBE_AGG_TOTAL",
    ),
    FieldSpec(
        "correctable_remapped_rows",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        COUNTER,
        "Number of remapped rows for correctable errors.",
        "rows",
        "field NVML_FI_DEV_REMAPPED_COR",
    ),
    FieldSpec(
        "uncorrectable_remapped_rows",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        COUNTER,
        "Number of remapped rows for uncorrectable errors.",
        "rows",
        "field NVML_FI_DEV_REMAPPED_UNC",
    ),
    FieldSpec(
        "row_remap_pending",
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        GAUGE,
        "Whether a row remap is pending a GPU reset (1) or not (0).",
        "bool",
        "field NVML_FI_DEV_REMAPPED_PENDING",
    ),
    FieldSpec(
        "row_remap_failure",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        GAUGE,
        "Whether remapping of rows has failed (1) or not (0).",
        "bool",
        "field NVML_FI_DEV_REMAPPED_FAILURE",
    ),
    FieldSpec(
        "pcie_replay",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        COUNTER,
        "Total number of PCIe retries.",
        "retries",
        "field NVML_FI_DEV_PCIE_REPLAY_COUNTER",
        Tier.SLOW,
    ),
    FieldSpec(
        "vgpu_license_status",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        GAUGE,
        "vGPU license status: 1 licensed, 0 not licensed or vGPU licensing not supported "
        "(a bare-metal GPU).",
        "bool",
        "nvmlDeviceGetGridLicensableFeatures_v4(): 0 unless isGridLicenseSupported, else "
        "the vGPU feature's featureState > 0",
        Tier.SLOW,
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

# Cumulative time per clock-event reason, from the non-deprecated NVML field
# ids (slow tier). Key in GpuReading.values -> reason label value of
# stepscope_gpu_clock_event_seconds_total. Values are stored in ns, served in s.
CLOCK_EVENT_DURATION_KEYS: tuple[tuple[str, str], ...] = (
    ("clock_event_ns.sw_power_cap", "sw_power_cap"),
    ("clock_event_ns.sync_boost", "sync_boost"),
    ("clock_event_ns.sw_thermal_slowdown", "sw_thermal_slowdown"),
    ("clock_event_ns.hw_thermal_slowdown", "hw_thermal_slowdown"),
    ("clock_event_ns.hw_power_brake_slowdown", "hw_power_brake_slowdown"),
)
SLOW_KEYS = SLOW_KEYS | frozenset(k for k, _ in CLOCK_EVENT_DURATION_KEYS)

# GPM metric ids -> FieldSpec key and scale. GPM reports percentages (0-100)
# and MiB/s; DCGM serves ratios and bytes/s.
GPM_METRICS: tuple[tuple[int, str, float], ...] = (
    (1, "gr_engine_active", 0.01),  # GRAPHICS_UTIL
    (2, "sm_active", 0.01),  # SM_UTIL
    (3, "sm_occupancy", 0.01),  # SM_OCCUPANCY
    (5, "pipe_tensor_active", 0.01),  # ANY_TENSOR_UTIL
    (6, "pipe_tensor_dfma_active", 0.01),  # DFMA_TENSOR_UTIL
    (7, "pipe_tensor_hmma_active", 0.01),  # HMMA_TENSOR_UTIL
    (9, "pipe_tensor_imma_active", 0.01),  # IMMA_TENSOR_UTIL
    (10, "dram_active", 0.01),  # DRAM_BW_UTIL
    (11, "pipe_fp64_active", 0.01),  # FP64_UTIL
    (12, "pipe_fp32_active", 0.01),  # FP32_UTIL
    (13, "pipe_fp16_active", 0.01),  # FP16_UTIL
    (20, "pcie_tx_bytes", 1024.0 * 1024.0),  # PCIE_TX_PER_SEC (MiB/s)
    (21, "pcie_rx_bytes", 1024.0 * 1024.0),  # PCIE_RX_PER_SEC (MiB/s)
    (60, "nvlink_rx_bytes", 1024.0 * 1024.0),  # NVLINK_TOTAL_RX_PER_SEC (MiB/s)
    (61, "nvlink_tx_bytes", 1024.0 * 1024.0),  # NVLINK_TOTAL_TX_PER_SEC (MiB/s)
)


def markdown_table() -> str:
    """The per-GPU field table as Markdown (docs/metrics.md embeds it; a test checks)."""
    rows = [
        "| Metric | Type | Unit | Tier | Source (NVML) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for f in FIELDS:
        tier = "slow" if f.tier is Tier.SLOW else "fast"
        if f.profiling:
            tier += ", GPM"
        rows.append(f"| `{f.name}` | {f.type} | {f.unit} | {tier} | {f.source} |")
    rows.append(f"| `{DRIVER_VERSION_LABEL}` | label | | at start | nvmlSystemGetDriverVersion(), "
                "a label of every DCGM_FI_* series |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
