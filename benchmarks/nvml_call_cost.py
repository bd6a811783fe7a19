"""What each NVML call the exporter makes costs, and what a whole read costs.

Times every NVML call NvmlBackend makes (100 samples each) and full FAST / SLOW
reads through NvmlBackend, printing p50 wall and CPU (thread) time per call. The
last table compares each read with the sum of its bare C calls: "FAST read / bare C
calls" is the ratio the design targets (the exporter's sampling CPU within 1.2x the
NVML calls' own cost).

How the "bare C calls" baseline is measured: each C function is called directly
through its function pointer (``pynvml._nvmlGetFunctionPointer``, resolved once)
with its output buffer and by-reference argument built beforehand, so the row is
the C call plus the bare ctypes call, the least any Python caller pays; pynvml's
wrappers (lookup, allocation, return check) are not in it (their cost is printed on
information rows). The calls are the backend's own read lists, derived from the field
table (``getters.CALLS``, ``FAST_FIELD_IDS``, ``SLOW_FIELD_IDS``), and GPM is timed with the
metrics the field table puts on each tier, with only the sample swap the backend
needs between calls. Calls that cost under 200 µs are timed in batches of 10
between two clock reads, so the per-row cost of reading the thread CPU clock (a
system call) does not pad the baseline; NvmlBackend reads are timed the same way.

    python3 -m benchmarks.nvml_call_cost [--device N] [--calls 100]

Exits 2 with one line when there is no NVIDIA driver.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from stepscope.gpu import pynvml_compat
from stepscope.gpu.field_reads import FAST_FIELD_IDS, SLOW_FIELD_IDS
from stepscope.gpu.fields import FIELDS_BY_KEY
from stepscope.gpu.getters import CALLS, GetterSpec
from stepscope.gpu.gpm import GPM_METRICS
from stepscope.gpu.model import NoDriverError, Tier
from stepscope.gpu.nvml_backend import NvmlBackend

# The plain getters of each tier, timed as C calls (the engine and license getters are not).
FAST_GETTERS = [spec for spec in CALLS[Tier.FAST] if isinstance(spec, GetterSpec)]
SLOW_GETTERS = [spec for spec in CALLS[Tier.SLOW] if isinstance(spec, GetterSpec)]

Row = tuple[str, float, float, str]
TARGET = 1.2  # FAST read / bare C calls, CPU

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


def c_getter(nv: Any, spec: GetterSpec, handle: Any) -> Callable[[], int]:
    """``spec``'s C function called directly: ``fn(handle, [arg,] byref(out))``.

    Raises (so the row notes it) when no symbol resolves or the call does not answer
    NVML_SUCCESS.
    """
    fn = pynvml_compat.resolve(nv, *spec.symbols)
    if fn is None:
        raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND)
    out = spec.output()
    args = (handle, ctypes.byref(out)) if spec.argument is None else (
        handle, spec.argument, ctypes.byref(out))
    ret: int = fn(*args)
    if ret != nv.NVML_SUCCESS:
        raise nv.NVMLError(ret)
    return lambda: fn(*args)


def c_field_values(nv: Any, handle: Any, fields: tuple[tuple[int, str], ...]) -> Callable[[], int]:
    """``nvmlDeviceGetFieldValues`` called directly with an array built once."""
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    request = pynvml_compat.FieldValueArray([fid for fid, _ in fields])
    return lambda: fn(handle, request.count, request.array)


def gpm_ids(tiers: frozenset[Tier]) -> list[int]:
    """The GPM metric ids a read of ``tiers`` computes (the field table's tiers)."""
    return [m for m, key, _ in GPM_METRICS if FIELDS_BY_KEY[key].tier in tiers]


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    # A clock that moves 1 s per call, so every read computes GPM; a C function, as
    # time.monotonic is in the exporter.
    try:
        backend = NvmlBackend(clock=itertools.count(time.monotonic(), 1.0).__next__)
    except NoDriverError as exc:
        print(f"no NVIDIA driver: {exc}", file=sys.stderr)
        return 2
    nv = pynvml_compat.pynvml

    n, index = args.calls, args.device
    info = backend.devices()[index]
    h = nv.nvmlDeviceGetHandleByIndex(index)
    print(f"GPU {index}: {info.name} {info.uuid} driver {info.driver_version} "
          f"profiling={info.profiling_supported} mig={info.mig_mode}")

    rows: list[Row] = []
    # What each read's baseline sums: rows that timed without an error.
    baseline: dict[str, list[Row]] = {"FAST": [], "SLOW": []}

    def timed(tier: str, name: str, call: Callable[[], Any]) -> None:
        row = measure(name, call, n)
        rows.append(row)
        if not row[3]:
            baseline[tier].append(row)

    for tier, specs, fields in (("FAST", FAST_GETTERS, FAST_FIELD_IDS),
                                ("SLOW", SLOW_GETTERS, SLOW_FIELD_IDS)):
        for spec in specs:
            name = f"{spec.name} (C)"
            try:
                timed(tier, name, c_getter(nv, spec, h))
            except nv.NVMLError as exc:  # unsupported here: noted, not in the baseline
                rows.append((name, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))
        timed(tier, f"nvmlDeviceGetFieldValues {tier} x{len(fields)} (C, reused array)",
              c_field_values(nv, h, fields))

    fast_ids = [fid for fid, _ in FAST_FIELD_IDS]

    def wrappers() -> None:
        nv.nvmlDeviceGetUtilizationRates(h)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
        nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        nv.nvmlDeviceGetPowerUsage(h)
        nv.nvmlDeviceGetMemoryInfo(h)
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)

    rows += [
        measure(f"  [info] the {len(FAST_GETTERS)} FAST getters via pynvml wrappers",
                wrappers, n),
        measure(f"  [info] FieldValues FAST x{len(fast_ids)} via pynvml wrapper",
                lambda: nv.nvmlDeviceGetFieldValues(h, fast_ids), n),
        *(measure(f"  [info] nvmlDeviceGetFieldValues x1 ({key})",
                  c_field_values(nv, h, ((fid, key),)), n) for fid, key in SLOW_FIELD_IDS),
    ]

    if info.profiling_supported:
        samples = (nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc())
        sample_get = nv._nvmlGetFunctionPointer("nvmlGpmSampleGet")
        metrics_get = nv._nvmlGetFunctionPointer("nvmlGpmMetricsGet")
        nv.nvmlGpmSampleGet(h, samples[0])

        def sample_and_compute(ids: list[int]) -> Callable[[], Any]:
            # As the backend does it, C functions called directly: a new sample, the
            # metrics since the previous one, swap.
            request = pynvml_compat.GpmMetricsRequest(ids, samples)
            swapped = [False]

            def call() -> None:
                newer = samples[not swapped[0]]
                sample_get(h, newer)
                request.set_order(swapped[0])
                ret = metrics_get(request.ref)
                swapped[0] = not swapped[0]
                if ret != nv.NVML_SUCCESS:
                    raise nv.NVMLError(ret)

            return call

        rows.append(measure("  [info] nvmlGpmSampleGet (C)",
                            lambda: sample_get(h, samples[1]), n))
        for tier, tiers in (("FAST", frozenset({Tier.FAST})), ("SLOW", frozenset({Tier.SLOW}))):
            ids = gpm_ids(tiers)
            timed(tier, f"nvmlGpmSampleGet + nvmlGpmMetricsGet x{len(ids)} ({tier} metrics)",
                  sample_and_compute(ids))
        rows += [measure(f"  [info] nvmlGpmSampleGet + nvmlGpmMetricsGet x1 ({key})",
                         sample_and_compute([metric_id]), n)
                 for metric_id, key, _ in GPM_METRICS]
        for sample in samples:
            nv.nvmlGpmSampleFree(sample)

    def violation(policy: int) -> Callable[[], Any]:
        return lambda: nv.nvmlDeviceGetViolationStatus(h, policy)

    for name in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT"):
        rows.append(measure(f"  [info] nvmlDeviceGetViolationStatus({name}) (fallback)",
                            violation(getattr(nv, f"NVML_PERF_POLICY_{name}")), n))
    rows.append(measure("nvmlEventSetWait_v2(timeout 0) via events()", backend.events, n))

    backend.read(index, frozenset({Tier.FAST, Tier.SLOW}))  # learn what is unsupported
    reads = {
        "FAST": measure("NvmlBackend.read(FAST)",
                        lambda: backend.read(index, frozenset({Tier.FAST})), n),
        "SLOW": measure("NvmlBackend.read(SLOW)",
                        lambda: backend.read(index, frozenset({Tier.SLOW})), n),
    }
    rows += [*reads.values(), measure("NvmlBackend.read(FAST+SLOW)", lambda: backend.read(
        index, frozenset({Tier.FAST, Tier.SLOW})), n)]
    backend.close()

    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  {'µs wall p50':>12}  {'µs CPU p50':>11}")
    for name, wall, cpu, note in rows:
        print(f"{name:<{width}}  {wall:>12.1f}  {cpu:>11.1f}  {note}")

    print()
    print(f"{'read / bare C calls':<28}  {'bare C µs CPU':>13}  {'read µs CPU':>11}  "
          f"{'Python µs':>9}  {'ratio':>6}  target")
    for tier, read in reads.items():
        bare = sum(row[2] for row in baseline[tier])
        ratio = read[2] / bare if bare else float("nan")
        target = f"<= {TARGET:.2f}x" if tier == "FAST" else "-"
        print(f"{tier + ' read / bare C calls':<28}  {bare:>13.1f}  {read[2]:>11.1f}  "
              f"{read[2] - bare:>9.1f}  {ratio:>5.2f}x  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
