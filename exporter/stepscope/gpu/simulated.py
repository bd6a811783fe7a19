"""Simulated GPUs: the twin of the NVML backend, driven by a scenario.

Every value is a closed-form function of simulated time ``t`` (seconds since the
backend was built), so a reading at ``t`` is the same however often, or how
rarely, ``read`` was called before, and tests step time with a fake clock.

How it works: at construction each GPU's timeline is compiled into sorted,
piecewise-constant segments, each carrying the integrals (kernel-running time,
energy, throttle time) accumulated up to its start. A read finds the segment by
bisection and evaluates a few multiply-adds: counters are those integrals;
rate-like gauges (utilization, SM active, power) are averaged over the last
second from the same integrals, as NVML and GPM average over their sample
window. Jitter is a hash of (host, GPU, whole second): deterministic, no
``random``. A read costs a few microseconds and allocates only its result.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stepscope.gpu.fields import SLOW_KEYS, ClockEvent
from stepscope.gpu.model import GpuInfo, GpuReading, GpuUnavailable, Tier, XidEvent
from stepscope.gpu.scenario import (
    Activity,
    DeviceSpec,
    Kernels,
    Precision,
    Scenario,
    ScenarioError,
    Thermal,
    TimelineEntry,
    Wait,
    Workload,
    default_scenario,
    load_scenario,
    parse_scenario,
    shipped_scenarios,
)

__all__ = [
    "Scenario",
    "ScenarioError",
    "SimulatedBackend",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
    "shipped_scenarios",
]


@dataclass(frozen=True)
class _Profile:
    """Pipe activity per unit of SM active, and power draw, for one kind of work."""

    hmma: float = 0.0
    imma: float = 0.0
    dfma: float = 0.0
    fp64: float = 0.0
    fp32: float = 0.0
    fp16: float = 0.0
    dram: float = 0.4
    power: float = 0.8  # share of the (limit - idle) power headroom drawn at level 1


# Anchored on the H200 measurement (docs/validation/h200.md): a bf16 matmul read SM active
# 0.96 and tensor (HMMA) 0.93; an fp32 matmul read FP32 0.77 and tensor 0. At
# the default level 0.95 these give HMMA ~0.90 and FP32 ~0.75.
_PROFILES: dict[Precision, _Profile] = {
    "bf16": _Profile(hmma=0.95, fp32=0.08, fp16=0.05, dram=0.40, power=0.82),
    "fp16": _Profile(hmma=0.95, fp32=0.06, fp16=0.10, dram=0.40, power=0.82),
    "tf32": _Profile(hmma=0.90, fp32=0.10, fp16=0.02, dram=0.45, power=0.78),
    "fp32": _Profile(fp32=0.79, fp16=0.02, dram=0.30, power=0.62),
    "fp64": _Profile(dfma=0.80, fp64=0.25, fp32=0.05, dram=0.35, power=0.88),
    "int8": _Profile(imma=0.90, fp32=0.05, fp16=0.05, dram=0.45, power=0.75),
}
# Element-wise and normalisation kernels (``kernels: elementwise``), whatever the
# precision: the memory interface sets the pace. Anchored on the H200 figures in issue 13
# (SM active 0.99, DRAM active 0.81, tensor 0.007); PyTorch's bf16 element-wise kernels
# compute in fp32 registers, so the FP32 pipe carries the (little) math.
_ELEMENTWISE = _Profile(hmma=0.0075, fp32=0.35, fp16=0.02, dram=0.85, power=0.55)

COLLECTIVE_WAIT_SM = 0.12  # an NCCL kernel spinning on ~16 of 132 SMs
RESET_SECONDS = 2.0  # a GPU reset: the device does not answer NVML for this long
OCCUPANCY_PER_ACTIVE = 0.6  # "busy is not full": resident warps well below the maximum
THERMAL_ACTIVITY = 0.95  # a throttled GPU does slightly less per second
THERMAL_POWER = 0.85
SW_THERMAL_CLOCK = 0.71  # 1980 -> ~1400 MHz
HW_THERMAL_CLOCK = 0.60
POWER_CAP_CLOCK = 0.90
SW_THERMAL_TEMP_C = 87.0
HW_THERMAL_TEMP_C = 90.0
BUSY_TEMP_RISE_C = 35.0  # above idle, at 80% of the power headroom
TEMP_WINDOW_S = 30.0  # thermal inertia: temperature follows the last 30 s of power
TRAINING_MEMORY = 0.92
CONTEXT_MIB = 4
PCIE_RX_BUSY = 0.8e9  # bytes/s host-to-device while training (input batches)
PCIE_TX_BUSY = 0.1e9
PCIE_BASE = 2.0e6
# host-to-device from pageable memory in a sawtooth's gaps (``wait: copy``): measured on
# an H200, a step copying its batch with .to(device) from pageable memory, 6.9 GB/s
PCIE_RX_PAGEABLE = 6.9e9
NVLINK_BUSY = 45e9  # gradient all-reduce traffic per direction, multi-GPU nodes only
# What the driver and firmware keep of the framebuffer (NVML's ``reserved``): a few hundred
# MiB on these boards, taken here as a share of the total (an estimate, not a measurement).
RESERVED_SHARE = 0.0066
CLOCK_STEP_MHZ = 15  # NVML clocks move in 15 MHz bins on these boards

_BIT_IDLE = int(ClockEvent.GPU_IDLE)
_BIT_POWER_CAP = int(ClockEvent.SW_POWER_CAP)
_BIT_SW_THERMAL = int(ClockEvent.SW_THERMAL_SLOWDOWN)
_BIT_HW_THERMAL = int(ClockEvent.HW_THERMAL_SLOWDOWN)

_KIND_IDLE, _KIND_BUSY, _KIND_SAW = 0, 1, 2
_KINDS: dict[Activity, int] = {"idle": _KIND_IDLE, "busy": _KIND_BUSY, "sawtooth": _KIND_SAW}

# Bus ids of the 8 GPUs of an HGX H100 baseboard; further GPUs go to the next PCI domain.
_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_UUID_NAMESPACE = uuid.UUID("5b0f3a52-8f7e-4f3e-9c55-73746570736d")
_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class _State:
    """What a GPU does during one interval of the timeline, all overrides applied."""

    activity: Activity
    precision: Precision
    level: float
    period: float
    duty: float
    wait: Wait
    memory: float | None
    kernels: Kernels
    thermal: Thermal
    power_cap: bool
    sm_clock: float | None = None  # share of boost under load, no event reason


class _Segment:
    """A piecewise-constant interval, with integrals accumulated up to ``start``."""

    __slots__ = (
        "a", "b0", "clock", "dfma", "dp", "dram", "e0", "fp16", "fp32", "fp64", "hmma",
        "hw", "hw0", "imma", "kind", "mem_used", "on_len", "p_off", "p_on", "pc", "pc0",
        "period", "reasons", "start", "sw", "sw0", "temp_fixed", "tensor", "w_kernel", "w_rx",
        "w_sm",
    )

    def __init__(self, start: float, state: _State, dev: DeviceSpec) -> None:
        m = dev.model
        prof = _ELEMENTWISE if state.kernels == "elementwise" else _PROFILES[state.precision]
        thermal = state.thermal != "none"
        self.start = start
        self.kind = _KINDS[state.activity]
        self.period = state.period
        self.on_len = state.duty * state.period
        self.a = state.level * (THERMAL_ACTIVITY if thermal else 1.0)
        self.hmma, self.imma, self.dfma = prof.hmma, prof.imma, prof.dfma
        self.tensor = prof.hmma + prof.imma + prof.dfma  # one of them is non-zero
        self.fp64, self.fp32, self.fp16, self.dram = prof.fp64, prof.fp32, prof.fp16, prof.dram
        self.sw = state.thermal in ("sw", "both")
        self.hw = state.thermal in ("hw", "both")
        self.pc = state.power_cap
        headroom = m.power_limit_w - m.idle_power_w
        if state.power_cap:
            self.p_on = m.power_limit_w
        else:
            self.p_on = m.idle_power_w + headroom * self.a * prof.power * (
                THERMAL_POWER if thermal else 1.0)
        # What fills a sawtooth's gaps: nothing (waiting for data), or a collective
        # kernel spinning on a few SMs (waiting for peers): "util lies" in that case.
        collective = self.kind == _KIND_SAW and state.wait == "collective"
        self.w_kernel = 1.0 if collective else 0.0
        self.w_sm = COLLECTIVE_WAIT_SM if collective else 0.0
        copy = self.kind == _KIND_SAW and state.wait == "copy"
        self.w_rx = PCIE_RX_PAGEABLE if copy else 0.0  # PCIe receive in the gaps
        # Between steps of a sawtooth the clocks stay up; only a really idle GPU drops.
        gap_power = 0.0 if self.kind == _KIND_IDLE else (0.2 if collective else 0.1)
        self.p_off = m.idle_power_w + gap_power * headroom
        self.dp = self.p_on - self.p_off
        clock = float(m.max_sm_clock_mhz)
        if self.sw:
            clock = min(clock, SW_THERMAL_CLOCK * m.max_sm_clock_mhz)
        if self.hw:
            clock = min(clock, HW_THERMAL_CLOCK * m.max_sm_clock_mhz)
        if self.pc:
            clock = min(clock, POWER_CAP_CLOCK * m.max_sm_clock_mhz)
        if state.sm_clock is not None:  # held down with no event reason
            clock = min(clock, state.sm_clock * m.max_sm_clock_mhz)
        self.clock = float(
            m.idle_sm_clock_mhz if self.kind == _KIND_IDLE
            else CLOCK_STEP_MHZ * round(clock / CLOCK_STEP_MHZ)
        )
        self.temp_fixed = (HW_THERMAL_TEMP_C if self.hw else SW_THERMAL_TEMP_C) if thermal \
            else 0.0
        self.reasons = (
            (_BIT_IDLE if self.kind == _KIND_IDLE else 0)
            | (_BIT_SW_THERMAL if self.sw else 0)
            | (_BIT_HW_THERMAL if self.hw else 0)
        )
        share = state.memory if state.memory is not None else (
            0.0 if self.kind == _KIND_IDLE else TRAINING_MEMORY)
        self.mem_used = min(m.memory_total_mib, round(share * m.memory_total_mib) + CONTEXT_MIB)
        # Integrals up to ``start``: seconds of work, joules, seconds of sw/hw thermal
        # slowdown, seconds of work under the power cap. Filled in by _compile.
        self.b0 = self.e0 = self.sw0 = self.hw0 = self.pc0 = 0.0

    def on_time(self, x: float) -> float:
        """Seconds spent on the work (the busy part) in the first ``x`` s of this segment."""
        if self.kind == _KIND_BUSY:
            return x
        if self.kind == _KIND_IDLE:
            return 0.0
        full = math.floor(x / self.period)
        rem = min(max(x - full * self.period, 0.0), self.period)
        return full * self.on_len + min(rem, self.on_len)

    def running(self, x: float) -> bool:
        """Whether the work (not idle, not a gap) runs at ``x`` seconds into this segment."""
        if self.kind == _KIND_SAW:
            return x - math.floor(x / self.period) * self.period < self.on_len
        return self.kind == _KIND_BUSY


# The timeline keys that override a GPU's state over a window (the rest are events).
_STATE_KEYS = ("activity", "precision", "level", "period", "duty", "wait", "memory", "kernels",
               "thermal", "power_cap", "sm_clock")


def _overlay(base: Workload, active: Sequence[TimelineEntry]) -> _State:
    """The baseline with the active windows applied in order: later entries win."""
    s = {
        "activity": base.activity, "precision": base.precision, "level": base.level,
        "period": base.period, "duty": base.duty, "wait": base.wait, "memory": base.memory,
        "kernels": base.kernels, "thermal": "none", "power_cap": False, "sm_clock": None,
    }
    for e in active:
        for key in _STATE_KEYS:
            v = getattr(e, key)
            if v is not None:
                s[key] = v
    return _State(**s)  # type: ignore[arg-type]


def _compile(scenario: Scenario, index: int) -> tuple[list[float], list[_Segment]]:
    """One GPU's timeline as sorted segments with their prefix integrals."""
    dev = scenario.devices[index]
    windows = sorted(
        (e for e in scenario.timeline
         if index in e.gpus and any(getattr(e, k) is not None for k in _STATE_KEYS)),
        key=lambda e: e.at,  # stable: entries starting together apply in file order
    )
    breaks = sorted({0.0, *(e.at for e in windows),
                     *(e.until for e in windows if e.until is not None)})
    starts: list[float] = []
    segs: list[_Segment] = []
    prev_state: _State | None = None
    active: list[TimelineEntry] = []  # sweep: windows open at the current break, in order
    opened = 0
    for b in breaks:
        while opened < len(windows) and windows[opened].at <= b:
            active.append(windows[opened])
            opened += 1
        active = [e for e in active if e.until is None or b < e.until]
        state = _overlay(scenario.workload, active)
        if state == prev_state:
            continue  # merged: a sawtooth keeps its phase across a no-op boundary
        seg = _Segment(b, state, dev)
        if segs:
            p = segs[-1]
            x = b - p.start
            on = p.on_time(x)
            seg.b0 = p.b0 + on
            seg.e0 = p.e0 + p.p_off * x + p.dp * on
            seg.sw0 = p.sw0 + (x if p.sw else 0.0)
            seg.hw0 = p.hw0 + (x if p.hw else 0.0)
            seg.pc0 = p.pc0 + (on if p.pc else 0.0)
        starts.append(b)
        segs.append(seg)
        prev_state = state
    return starts, segs


# A counter step: ``n`` events spread evenly over [t0, t1] (all at t0 when t0 == t1).
_Ramp = tuple[float, float, int]


def _count(ramps: Sequence[_Ramp], t: float) -> int:
    total = 0
    for t0, t1, n in ramps:
        if t >= t1:
            total += n
        elif t > t0:
            total += math.floor(n * (t - t0) / (t1 - t0))
    return total


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class _SimGpu:
    """One compiled GPU: its info, segments, fault times and counter steps."""

    def __init__(self, scenario: Scenario, index: int, hostname: str) -> None:
        dev = scenario.devices[index]
        m = dev.model
        self.salt = zlib.crc32(f"{hostname}/{index}".encode())
        domain, bus = divmod(index, len(_BUSES))
        self.info = GpuInfo(
            index=index,
            uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{hostname}/{index}')}",
            name=m.name,
            pci_bus_id=f"{domain:08X}:{_BUSES[bus]:02X}:00.0",
            driver_version=scenario.driver_version,
            serial=f"1654{self.salt % 10**9:09d}",
            vbios_version="96.00.99.00.01" if m.gpm else "92.00.45.00.05",
            memory_total_mib=float(m.memory_total_mib),
            profiling_supported=dev.profiling,
            mig_mode="disabled" if m.mig else "unsupported",
        )
        self.profiling = dev.profiling
        self.starts, self.segs = _compile(scenario, index)
        mine = [e for e in scenario.timeline if index in e.gpus]
        self.off_bus = sorted(e.at for e in mine if e.fall_off_bus)
        # a reset: unreachable for RESET_SECONDS, then back on the bus with its volatile
        # ECC counters cleared and pending row remaps applied
        self.resets = sorted(e.at for e in mine if e.reset)
        self.remap_failure_at = min((e.at for e in mine if e.row_remap_failure),
                                    default=math.inf)

        def ramps(key: str) -> tuple[_Ramp, ...]:
            return tuple((e.at, e.until if e.until is not None else e.at, getattr(e, key))
                         for e in mine if getattr(e, key))

        self.sbe, self.dbe, self.replay = ramps("ecc_sbe"), ramps("ecc_dbe"), ramps("pcie_replay")
        self.total_mib = m.memory_total_mib
        self.reserved_mib = float(round(RESERVED_SHARE * m.memory_total_mib))
        self.limit_w = m.power_limit_w
        self.idle_w = m.idle_power_w
        self.mem_clock = float(m.mem_clock_mhz)
        self.idle_temp = 29.0 + self.salt % 4
        self.temp_per_w = BUSY_TEMP_RISE_C / (0.8 * (m.power_limit_w - m.idle_power_w))
        self.nvlink = NVLINK_BUSY if scenario.gpus > 1 else 0.0
        # Energy "since boot" does not start at zero: a few days at idle power.
        self.boot_mj = m.idle_power_w * 1000.0 * 86400.0 * (2 + self.salt % 5)

    def integrals(self, t: float) -> tuple[float, float]:
        """(seconds of work, joules) from 0 to ``t``."""
        seg = self.segs[bisect.bisect_right(self.starts, t) - 1]
        x = t - seg.start
        on = seg.on_time(x)
        return seg.b0 + on, seg.e0 + seg.p_off * x + seg.dp * on

    def read(self, t: float, tiers: frozenset[Tier]) -> dict[str, float]:
        reset = self.resets[bisect.bisect_right(self.resets, t) - 1] if self.resets else None
        if reset is not None and reset <= t < reset + RESET_SECONDS:
            raise GpuUnavailable(f"GPU {self.info.index} is being reset (simulated)")
        off = self.off_bus[bisect.bisect_right(self.off_bus, t) - 1] if self.off_bus else None
        if off is not None and off <= t and (reset is None or off > reset):
            raise GpuUnavailable(
                f"GPU {self.info.index} fell off the bus at t={off:g} s (simulated)")
        if reset is not None and reset > t:
            reset = None
        seg = self.segs[bisect.bisect_right(self.starts, t) - 1]
        x = t - seg.start
        on_t = seg.on_time(x)
        busy_t = seg.b0 + on_t
        joules_t = seg.e0 + seg.p_off * x + seg.dp * on_t
        running = seg.running(x)
        # Rates over the last second, as NVML utilization and GPM sample windows do.
        if t > 0.0:
            lo = t - 1.0 if t > 1.0 else 0.0
            busy_lo, joules_lo = self.integrals(lo)
            on_frac = (busy_t - busy_lo) / (t - lo)
            watts = (joules_t - joules_lo) / (t - lo)
            lo = t - TEMP_WINDOW_S if t > TEMP_WINDOW_S else 0.0
            watts_slow = (joules_t - self.integrals(lo)[1]) / (t - lo)
        else:
            on_frac = 1.0 if running else 0.0
            watts = watts_slow = seg.p_on if running else seg.p_off

        h = _mix(self.salt ^ (int(t) * 0x9E3779B97F4A7C15 & _MASK64))
        j0 = (h & 1023) / 511.5 - 1.0  # six independent jitters in [-1, 1]
        j1 = (h >> 10 & 1023) / 511.5 - 1.0
        j2 = (h >> 20 & 1023) / 511.5 - 1.0
        j3 = (h >> 30 & 1023) / 511.5 - 1.0
        j4 = (h >> 40 & 1023) / 511.5 - 1.0
        j5 = (h >> 50 & 1023) / 511.5 - 1.0

        values: dict[str, float]
        if not tiers:
            return {}
        else:  # fast keys are computed for either tier; the tier filter is at the end
            a = min(1.0, seg.a * (1.0 + 0.01 * j0))
            active = on_frac * a  # the work itself; pipes and DRAM follow it
            gap = 1.0 - on_frac
            kernel = on_frac + gap * seg.w_kernel  # any kernel running, what util counts
            sm = active + gap * seg.w_sm
            dram = active * seg.dram
            if seg.temp_fixed:
                temp = float(round(seg.temp_fixed + j5))
            else:
                temp = float(round(self.idle_temp + self.temp_per_w * (watts_slow - self.idle_w)
                                   + 0.5 * j5))
            # A loaded GPU's clock dips a bin now and then; an idle one sits still.
            clock = seg.clock - (CLOCK_STEP_MHZ if seg.kind != _KIND_IDLE and j3 < -0.4 else 0)
            used = min(float(seg.mem_used + (round(16 * j1) if seg.mem_used > 1024 else 0)),
                       self.total_mib - self.reserved_mib)
            dbe = _count(self.dbe, t) if self.dbe else 0
            sbe = _count(self.sbe, t) if self.sbe else 0
            # volatile counts start again at a reset; aggregate ones and retired rows stay
            dbe_vol = dbe - (_count(self.dbe, reset) if reset is not None else 0)
            sbe_vol = sbe - (_count(self.sbe, reset) if reset is not None else 0)
            values = {
                "gpu_util": float(round(100.0 * kernel)),
                "mem_copy_util": float(round(100.0 * dram)),
                "sm_clock": clock,
                "mem_clock": self.mem_clock,
                "gpu_temp": temp,
                "memory_temp": temp + 3.0 + round(4.0 * on_frac),
                "power_usage": round(min(self.limit_w, watts * (1.0 + 0.005 * j4)), 3),
                "clocks_event_reasons": float(
                    seg.reasons | (_BIT_POWER_CAP if seg.pc and running else 0)),
                # used + free + reserved = total, as NVML's nvmlMemory_v2_t has them
                "fb_used": used,
                "fb_free": self.total_mib - self.reserved_mib - used,
                "fb_reserved": self.reserved_mib,
                # Training uses neither the video encoders nor the decoders (H100 and H200
                # have no NVENC; NVML answers 0 for them, as DCGM serves).
                "enc_util": 0.0,
                "dec_util": 0.0,
                "ecc_sbe_vol_total": float(sbe_vol),
                "ecc_dbe_vol_total": float(dbe_vol),
                "ecc_sbe_agg_total": float(sbe),
                "ecc_dbe_agg_total": float(dbe),
                # A double-bit error on HBM3 retires its row: pending until a GPU reset.
                "correctable_remapped_rows": 0.0,
                "uncorrectable_remapped_rows": float(dbe),
                "row_remap_pending": 1.0 if dbe_vol else 0.0,
                "row_remap_failure": 1.0 if t >= self.remap_failure_at else 0.0,
            }
            if self.profiling:
                values.update({
                    "gr_engine_active": on_frac * min(1.0, a + 0.03) + gap * seg.w_kernel,
                    "sm_active": sm,
                    "sm_occupancy": sm * OCCUPANCY_PER_ACTIVE * (1.0 + 0.02 * j1),
                    "pipe_tensor_active": active * seg.tensor,
                    "pipe_tensor_hmma_active": active * seg.hmma,
                    "pipe_tensor_imma_active": active * seg.imma,
                    "pipe_tensor_dfma_active": active * seg.dfma,
                    "pipe_fp64_active": active * seg.fp64,
                    "pipe_fp32_active": active * seg.fp32,
                    "pipe_fp16_active": active * seg.fp16,
                    "dram_active": dram,
                    "pcie_tx_bytes": PCIE_BASE + on_frac * PCIE_TX_BUSY * (1.0 + 0.05 * j2),
                    "pcie_rx_bytes": PCIE_BASE + (on_frac * PCIE_RX_BUSY + gap * seg.w_rx)
                    * (1.0 + 0.05 * j2),
                    "nvlink_tx_bytes": kernel * self.nvlink * (1.0 + 0.05 * j2),
                    "nvlink_rx_bytes": kernel * self.nvlink * (1.0 + 0.05 * j2),
                })
        if Tier.SLOW in tiers:
            sw_ns = math.floor((seg.sw0 + (x if seg.sw else 0.0)) * 1e9)
            hw_ns = math.floor((seg.hw0 + (x if seg.hw else 0.0)) * 1e9)
            pc_ns = math.floor((seg.pc0 + (on_t if seg.pc else 0.0)) * 1e9)
            values.update({
                "total_energy": float(math.floor(self.boot_mj + joules_t * 1000.0)),
                # fields.py defines thermal violation as the sum of the sw and hw fields.
                "thermal_violation": float(sw_ns + hw_ns),
                "power_violation": float(pc_ns),
                "sync_boost_violation": 0.0,
                "board_limit_violation": 0.0,
                "pcie_replay": float(_count(self.replay, t) if self.replay else 0),
                # a simulated board runs at its default limit (power_cap: the work hits it)
                "enforced_power_limit": self.limit_w,
                "power_mgmt_limit_def": self.limit_w,
                # DCGM's NVLink bandwidth: rx + tx data in KiB/s, / 1000 (fields.py)
                "nvlink_bandwidth_total": 2.0 * kernel * self.nvlink * (1.0 + 0.05 * j2)
                / 1024.0 / 1000.0,
                # a bare-metal GPU: vGPU licensing not supported, which DCGM reads as 0
                "vgpu_license_status": 0.0,
                "clock_event_ns.sw_power_cap": float(pc_ns),
                "clock_event_ns.sync_boost": 0.0,
                "clock_event_ns.sw_thermal_slowdown": float(sw_ns),
                "clock_event_ns.hw_thermal_slowdown": float(hw_ns),
                "clock_event_ns.hw_power_brake_slowdown": 0.0,
            })
        if len(tiers) == 1:  # fields.py decides each key's tier (gr_engine_active is slow)
            want_slow = Tier.SLOW in tiers
            values = {k: v for k, v in values.items() if (k in SLOW_KEYS) == want_slow}
        return values


class SimulatedBackend:
    """A :class:`~stepscope.gpu.model.GpuBackend` serving scripted GPUs.

    Simulated time is ``clock() - clock()`` at construction: pass a fake clock to
    step it deterministically. ``hostname`` seeds UUIDs, serials and jitter, so
    two simulated nodes differ. Raises :class:`ScenarioError` for a scenario
    built by hand that is inconsistent.
    """

    name = "simulated"

    def __init__(self, scenario: Scenario, hostname: str = "sim",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.scenario = scenario
        self._clock = clock
        self._t0 = clock()
        # XID timestamps are wall-clock seconds, like the NVML backend's.
        self._wall0 = time.time()
        self._gpus = tuple(_SimGpu(scenario, i, hostname) for i in range(scenario.gpus))
        self._infos = tuple(g.info for g in self._gpus)
        self._xids = sorted(
            (e.at, i, e.xid) for e in scenario.timeline if e.xid is not None for i in e.gpus)
        self._next_xid = 0
        self._lock = threading.Lock()

    def now(self) -> float:
        """Simulated seconds since this backend was built (never negative)."""
        return max(0.0, self._clock() - self._t0)

    def devices(self) -> Sequence[GpuInfo]:
        """Static facts of every simulated GPU, in index order."""
        return self._infos

    def read(self, index: int, tiers: frozenset[Tier]) -> GpuReading:
        """Read GPU ``index`` now; raises GpuUnavailable once it has fallen off the bus."""
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no simulated GPU {index} (node has {len(self._gpus)})")
        return GpuReading(self._gpus[index].read(self.now(), tiers))

    def events(self) -> Sequence[XidEvent]:
        """XIDs whose time has come since the last call, each exactly once, in time order."""
        t = self.now()
        with self._lock:
            start = self._next_xid
            end = bisect.bisect_right(self._xids, (t, math.inf, math.inf), lo=start)
            self._next_xid = end
        return [XidEvent(i, xid, self._wall0 + at) for at, i, xid in self._xids[start:end]]

    def close(self) -> None:
        """Nothing to release; present for the protocol."""
