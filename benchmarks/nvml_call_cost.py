"""What each NVML call the exporter makes costs, and what a whole read costs.

Times every NVML call NvmlBackend makes (100 samples each) and full FAST / SLOW
reads through NvmlBackend, printing p50 wall and CPU (thread) time per call. The
last lines compare a FAST read with the sum of its NVML calls: the design target
is the exporter's sampling CPU within 1.2x the NVML calls' own cost. GRAPHICS_UTIL
(gr_engine_active) dominates GPM's cost, so the FAST read is also timed with that
metric moved to the SLOW tier.

How the "NVML calls alone" baseline is measured: each C function is called
directly through its function pointer (``pynvml._nvmlGetFunctionPointer``,
resolved once) with its output buffer and by-reference argument built beforehand,
so the row is the C call plus the bare ctypes call, the least any Python caller
pays; pynvml's wrappers (lookup, allocation, return check) are not in it (their
cost is printed on an information row). GPM is timed the same way, with only the
sample swap the backend needs between calls. Calls that cost under 200 µs are timed
in batches of 10 between two clock reads, so the per-row cost of reading the
thread CPU clock (a system call) does not pad the baseline; NvmlBackend reads are
timed the same way.

    python3 benchmarks/nvml_call_cost.py [--device N] [--calls 100]

Exits 2 with one line when there is no NVIDIA driver.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "exporter"))

from stepscope.gpu import nvml as nvml_module
from stepscope.gpu.fields import GPM_METRICS
from stepscope.gpu.model import NoDriverError, Tier
from stepscope.gpu.nvml import (
    FAST_FIELD_IDS,
    SLOW_FIELD_IDS,
    NvmlBackend,
    _plain_ctype,
)

Row = tuple[str, float, float, str]
GRAPHICS_UTIL = 1  # NVML_GPM_METRIC_GRAPHICS_UTIL, gr_engine_active


BATCH = 10  # calls per sample for calls under BATCH_BELOW_US
BATCH_BELOW_US = 200.0


def measure(name: str, call: Callable[[], Any], n: int) -> Row:
    """p50 wall and CPU microseconds per call of ``call`` over ``n`` samples.

    A call under BATCH_BELOW_US is made BATCH times per sample (the clocks are read
    once per sample), so the cost of reading the clocks is spread over the batch.
    """
    note = ""

    def one() -> None:
        nonlocal note
        try:
            call()
        except Exception as exc:  # an unsupported call is reported, not fatal
            note = f"{type(exc).__name__}: {exc}"

    w0 = time.perf_counter_ns()
    one()  # also tells how long a call is
    inner = BATCH if (time.perf_counter_ns() - w0) / 1000 < BATCH_BELOW_US else 1
    batch = range(inner)
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(n):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in batch:
            one()
        cpus.append((time.thread_time_ns() - c0) / 1000 / inner)
        walls.append((time.perf_counter_ns() - w0) / 1000 / inner)
    return name, statistics.median(walls), statistics.median(cpus), note


def c_call(nv: Any, symbols: tuple[str, ...], *args: Any, out: Any) -> Callable[[], int]:
    """A C getter called directly: ``fn(*args, byref(out))``, resolved and built once.

    Raises (so the row notes it) when the call does not answer NVML_SUCCESS.
    """
    fn = None
    for symbol in symbols:
        try:
            fn = nv._nvmlGetFunctionPointer(symbol)
            break
        except nv.NVMLError:
            continue
    if fn is None:
        raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
    call_args = (*args, ctypes.byref(out))
    ret: int = fn(*call_args)
    if ret != nv.NVML_SUCCESS:
        raise nv.NVMLError(ret)
    return lambda: fn(*call_args)


def report(what: str, parts: list[Row], read: Row) -> None:
    """Compare a read through NvmlBackend with the sum of its NVML calls."""
    nvml_cpu = sum(r[2] for r in parts)
    nvml_wall = sum(r[1] for r in parts)
    print(f"{what}: NVML calls alone {nvml_cpu:.1f} µs CPU / {nvml_wall:.1f} µs wall; "
          f"through NvmlBackend {read[2]:.1f} µs CPU / {read[1]:.1f} µs wall; "
          f"ratio {read[2] / nvml_cpu if nvml_cpu else float('nan'):.2f}x CPU (target <= 1.2x)")


class SteppingClock:
    """A monotonic clock that moves 1 s per call, so every read computes GPM."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    try:
        backend = NvmlBackend(clock=SteppingClock())
    except NoDriverError as exc:
        print(f"no NVIDIA driver: {exc}", file=sys.stderr)
        return 2
    import pynvml as nv

    n, index = args.calls, args.device
    info = backend.devices()[index]
    h = nv.nvmlDeviceGetHandleByIndex(index)
    print(f"GPU {index}: {info.name} {info.uuid} driver {info.driver_version} "
          f"profiling={info.profiling_supported} mig={info.mig_mode}")

    fast_ids = [fid for fid, _ in FAST_FIELD_IDS]
    slow_ids = [fid for fid, _ in SLOW_FIELD_IDS]
    field_fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    plain_value = _plain_ctype(nv.c_nvmlFieldValue_t)

    def direct(ids: list[int]) -> Callable[[], None]:
        array = (plain_value * len(ids))()
        for i, fid in enumerate(ids):
            array[i].fieldId = fid
        count = ctypes.c_int32(len(ids))
        return lambda: field_fn(h, count, array)

    uint, ull = ctypes.c_uint, ctypes.c_ulonglong
    getters: list[tuple[str, tuple[str, ...], tuple[Any, ...], Any]] = [
        ("nvmlDeviceGetUtilizationRates", ("nvmlDeviceGetUtilizationRates",), (h,),
         _plain_ctype(nv.c_nvmlUtilization_t)()),
        ("nvmlDeviceGetClockInfo(SM)", ("nvmlDeviceGetClockInfo",), (h, nv.NVML_CLOCK_SM),
         uint()),
        ("nvmlDeviceGetClockInfo(MEM)", ("nvmlDeviceGetClockInfo",), (h, nv.NVML_CLOCK_MEM),
         uint()),
        ("nvmlDeviceGetTemperature(GPU)", ("nvmlDeviceGetTemperature",),
         (h, nv.NVML_TEMPERATURE_GPU), uint()),
        ("nvmlDeviceGetPowerUsage", ("nvmlDeviceGetPowerUsage",), (h,), uint()),
        ("nvmlDeviceGetMemoryInfo", ("nvmlDeviceGetMemoryInfo",), (h,),
         _plain_ctype(nv.c_nvmlMemory_t)()),
        ("nvmlDeviceGetCurrentClocksEventReasons", ("nvmlDeviceGetCurrentClocksEventReasons",
         "nvmlDeviceGetCurrentClocksThrottleReasons"), (h,), ull()),
    ]
    rows: list[Row] = []
    fast_calls: list[tuple[str, Callable[[], Any]]] = []
    for name, symbols, getter_args, out in getters:
        try:
            fast_calls.append((f"{name} (C)", c_call(nv, symbols, *getter_args, out=out)))
        except nv.NVMLError as exc:  # unsupported here: noted, not in the baseline
            rows.append((f"{name} (C)", 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
    fast_calls.append(
        (f"nvmlDeviceGetFieldValues FAST x{len(fast_ids)} (C, reused array)", direct(fast_ids)))
    rows += [measure(name, call, n) for name, call in fast_calls]

    def wrappers() -> None:
        nv.nvmlDeviceGetUtilizationRates(h)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetMemoryInfo(h)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)

    info_rows: list[Row] = [
        measure("  [info] the seven getters above via pynvml wrappers", wrappers, n),
        measure(f"  [info] FieldValues FAST x{len(fast_ids)} via pynvml wrapper",
                lambda: nv.nvmlDeviceGetFieldValues(h, fast_ids), n),
    ]
    rows += info_rows

    gpm_rows: list[Row] = []
    gpm_full: Row | None = None
    gpm_cheap: Row | None = None
    if info.profiling_supported:
        samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        sample_get = nv._nvmlGetFunctionPointer("nvmlGpmSampleGet")
        metrics_get = nv._nvmlGetFunctionPointer("nvmlGpmMetricsGet")
        gpm_rows.append(measure("nvmlGpmSampleGet (C)",
                                lambda: sample_get(h, samples[1]), n))

        def sample_and_compute(ids: list[int]) -> Callable[[], Any]:
            # As the backend does it, C functions called directly: a new sample,
            # the metrics since the previous one, swap.
            request = _plain_ctype(nv.c_nvmlGpmMetricsGet_t)()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(ids)
            for i, metric_id in enumerate(ids):
                request.metrics[i].metricId = metric_id
            ref = ctypes.byref(request)
            nv.nvmlGpmSampleGet(h, samples[0])

            def call() -> None:
                sample_get(h, samples[1])
                request.sample1, request.sample2 = samples
                ret = metrics_get(ref)
                samples.reverse()
                if ret != nv.NVML_SUCCESS:
                    raise nv.NVMLError(ret)

            return call

        all_ids = [metric_id for metric_id, _, _ in GPM_METRICS]
        cheap_ids = [m for m in all_ids if m != GRAPHICS_UTIL]
        gpm_full = measure(f"nvmlGpmSampleGet + nvmlGpmMetricsGet x{len(all_ids)}",
                           sample_and_compute(all_ids), n)
        gpm_cheap = measure(f"nvmlGpmSampleGet + nvmlGpmMetricsGet x{len(cheap_ids)} "
                            "(all but gr_engine_active)", sample_and_compute(cheap_ids), n)
        gpm_rows += [gpm_full, gpm_cheap]
        gpm_rows += [measure(f"  nvmlGpmSampleGet + nvmlGpmMetricsGet x1 ({key})",
                             sample_and_compute([metric_id]), n)
                     for metric_id, key, _ in GPM_METRICS]
        for sample in samples:
            nv.nvmlGpmSampleFree(sample)
    rows += gpm_rows

    slow_rows: list[Row] = [
        measure("nvmlDeviceGetTotalEnergyConsumption",
                lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), n),
        measure(f"nvmlDeviceGetFieldValues SLOW x{len(slow_ids)} (C, reused array)",
                direct(slow_ids), n),
        *(measure(f"  nvmlDeviceGetFieldValues x1 ({key})", direct([fid]), n)
          for fid, key in SLOW_FIELD_IDS),
    ]
    def violation(policy: int) -> Callable[[], Any]:
        return lambda: nv.nvmlDeviceGetViolationStatus(h, policy)

    for name in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT"):
        slow_rows.append(measure(f"nvmlDeviceGetViolationStatus({name}) [fallback]",
                                 violation(getattr(nv, f"NVML_PERF_POLICY_{name}")), n))
    rows += slow_rows
    rows.append(measure("nvmlEventSetWait_v2(timeout 0) via events()", backend.events, n))

    backend.read(index, frozenset({Tier.FAST, Tier.SLOW}))  # learn what is unsupported
    fast_read = measure("NvmlBackend.read(FAST) incl. GPM compute",
                        lambda: backend.read(index, frozenset({Tier.FAST})), n)
    slow_read = measure("NvmlBackend.read(SLOW)",
                        lambda: backend.read(index, frozenset({Tier.SLOW})), n)
    both_read = measure("NvmlBackend.read(FAST+SLOW)",
                        lambda: backend.read(index, frozenset({Tier.FAST, Tier.SLOW})), n)
    rows += [fast_read, slow_read, both_read]
    backend.close()

    # The same FAST read with gr_engine_active moved to the SLOW tier (what a change
    # of its FieldSpec tier would give): GRAPHICS_UTIL dominates the GPM cost.
    key, scale, ratio, _ = nvml_module._GPM_KEYS[GRAPHICS_UTIL]
    nvml_module._GPM_KEYS[GRAPHICS_UTIL] = (key, scale, ratio, Tier.SLOW)
    light = NvmlBackend(clock=SteppingClock())
    light.read(index, frozenset({Tier.FAST, Tier.SLOW}))
    light_read = measure("NvmlBackend.read(FAST), gr_engine_active on SLOW",
                         lambda: light.read(index, frozenset({Tier.FAST})), n)
    rows.append(light_read)
    light.close()

    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  {'µs wall p50':>12}  {'µs CPU p50':>11}")
    for name, wall, cpu, note in rows:
        print(f"{name:<{width}}  {wall:>12.1f}  {cpu:>11.1f}  {note}")

    # The baseline: the C calls of a FAST read (getters and field values), plus GPM.
    base = [r for r in rows if r[0] in {name for name, _ in fast_calls} and not r[3]]
    report("FAST read", base + ([gpm_full] if gpm_full else []), fast_read)
    if gpm_cheap is not None:
        report("FAST read, gr_engine_active on SLOW", [*base, gpm_cheap], light_read)
    return 0


if __name__ == "__main__":
    sys.exit(main())
