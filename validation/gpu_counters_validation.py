"""dcgm-exporter's default counters on a real GPU: what stepscope serves, next to NVML.

Run on a machine with an NVIDIA driver and nvidia-ml-py (no internet, no torch needed):

    python -m validation.gpu_counters_validation --out DIR

1. Reads every counter of dcgm-exporter's default list (``etc/default-counters.csv``)
   straight from NVML with pynvml's own wrappers, per GPU, independently of stepscope's
   backend (and, where ``nvidia-smi`` is installed, what ``nvidia-smi -q -x`` says for
   the new ones).
2. Times each NVML call the new counters added, as the backend makes it (C function,
   output built once): microseconds per call over ``--calls`` calls (default 1,000), and
   ``NvmlBackend.read`` of each tier, to compare with
   docs/validation/h200-2026-12-03/nvml_cost.txt.
3. Starts ``stepscope serve`` on NVML (interval 1 s, slow interval 2 s), waits until the
   NVLink bandwidth has its window (two slow passes), scrapes ``/metrics`` and reads NVML
   again right after.

Writes ``DIR/default-counters.md`` (one table per GPU: each default counter, whether
stepscope served it, its value, NVML's answer; then the cost table), the scrape
(``metrics.txt``) and the exporter's log. Exit status 2 with one line where there is no
NVIDIA driver or GPU; 1 if the exporter does not start.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks._local import free_port, scrape, wait_for_exporter
from stepscope.gpu import fields  # pure data: no NVML
from tests.support import REPO

DEFAULT_COUNTERS = fields.DEFAULT_COUNTERS
NEW = {"DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_FB_RESERVED",
       "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
       "DCGM_FI_DRIVER_VERSION", "DCGM_FI_DEV_FB_USED"}  # FB_USED: now v2, as DCGM
ALL_LINKS = 0xFFFFFFFF
SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> tuple[dict[str, str], dict[tuple[str, str], tuple[dict[str, str], float]]]:
    """(family -> TYPE, (family, gpu) -> (labels, value)) of an exposition."""
    types: dict[str, str] = {}
    samples: dict[tuple[str, str], tuple[dict[str, str], float]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif (m := SAMPLE.match(line)) is not None:
            labels = dict(LABEL.findall(m.group(2)))
            if "gpu" in labels:
                samples[(m.group(1), labels["gpu"])] = (labels, float(m.group(3)))
    return types, samples


def show(value: Any) -> str:
    """A value for the table: whole numbers without a fraction, others to 6 digits."""
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:.6g}"
    return str(value)


def answer(call: Callable[[], Any]) -> Any:
    """``call()``, or the NVML error's name as the answer."""
    try:
        return call()
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def nvml_direct(nv: Any, h: Any, window: float = 1.0) -> dict[str, Any]:
    """Every default counter of one GPU as plain pynvml reads it (``window`` s for rates)."""
    out: dict[str, Any] = {}

    def field(fid: int, scope: int = 0) -> Any:
        (v,) = nv.nvmlDeviceGetFieldValues(h, [(fid, scope)])
        if v.nvmlReturn != nv.NVML_SUCCESS:
            return f"error: nvmlReturn {v.nvmlReturn}"
        return {nv.NVML_VALUE_TYPE_DOUBLE: v.value.dVal,
                nv.NVML_VALUE_TYPE_UNSIGNED_INT: v.value.uiVal,
                nv.NVML_VALUE_TYPE_SIGNED_INT: v.value.siVal}.get(v.valueType, v.value.ullVal)

    def nvlink_kib() -> Any:
        rx = field(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS)
        tx = field(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS)
        return rx + tx if isinstance(rx, int) and isinstance(tx, int) else f"{rx} / {tx}"

    kib0, t0 = answer(nvlink_kib), time.monotonic()
    gpm = answer(lambda: gpm_direct(nv, h, window))  # also the NVLink window
    kib1, t1 = answer(nvlink_kib), time.monotonic()
    out["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = (
        f"{(kib1 - kib0) / (t1 - t0) / 1000:.3f} ((rx+tx KiB all links {kib0} -> {kib1}) "
        f"/ {t1 - t0:.2f} s / 1000)" if isinstance(kib0, int) and isinstance(kib1, int)
        else f"{kib0}")
    rx_field = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    per_link = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        got = answer(partial(field, rx_field, link))
        if not isinstance(got, int):
            break
        per_link.append(got)
    all_rx = answer(partial(field, rx_field, ALL_LINKS))
    out["nvlink_links"] = (f"{len(per_link)} links answer per link, their rx summing to "
                           f"{sum(per_link)} KiB; all links at once: rx {all_rx} KiB")
    out["DCGM_FI_DEV_SM_CLOCK"] = answer(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
    out["DCGM_FI_DEV_MEM_CLOCK"] = answer(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
    out["DCGM_FI_DEV_MEMORY_TEMP"] = answer(lambda: field(nv.NVML_FI_DEV_MEMORY_TEMP))
    out["DCGM_FI_DEV_GPU_TEMP"] = answer(
        lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
    out["DCGM_FI_DEV_POWER_USAGE"] = answer(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000)
    out["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] = answer(
        lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
    out["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] = answer(
        lambda: field(nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER))
    util = answer(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    out["DCGM_FI_DEV_GPU_UTIL"] = getattr(util, "gpu", util)
    out["DCGM_FI_DEV_MEM_COPY_UTIL"] = getattr(util, "memory", util)
    for name, fn in (("DCGM_FI_DEV_ENC_UTIL", "nvmlDeviceGetEncoderUtilization"),
                     ("DCGM_FI_DEV_DEC_UTIL", "nvmlDeviceGetDecoderUtilization")):
        got = answer(partial(getattr(nv, fn), h))
        out[name] = f"{got[0]} (sampling period {got[1]} µs)" if isinstance(got, list) else got
    out["DCGM_FI_DEV_XID_ERRORS"] = "(events: 0 unless an XID came while the exporter ran)"
    mem = answer(lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
    mib = 1024 * 1024
    for name, member in (("DCGM_FI_DEV_FB_FREE", "free"), ("DCGM_FI_DEV_FB_USED", "used"),
                         ("DCGM_FI_DEV_FB_RESERVED", "reserved")):
        out[name] = getattr(mem, member) / mib if hasattr(mem, member) else mem
    v1 = answer(lambda: nv.nvmlDeviceGetMemoryInfo(h))
    out["fb_v1"] = (f"v1: used {v1.used / mib:.0f} MiB (reserved included), free "
                    f"{v1.free / mib:.0f}, total {v1.total / mib:.0f}"
                    if hasattr(v1, "used") else v1)
    lic = answer(lambda: nv.nvmlDeviceGetGridLicensableFeatures_v4(h))
    if hasattr(lic, "isGridLicenseSupported"):
        feats = [(lic.gridLicensableFeatures[i].featureCode,
                  lic.gridLicensableFeatures[i].featureState)
                 for i in range(min(lic.licensableFeaturesCount, 3))]
        out["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] = (
            f"isGridLicenseSupported={lic.isGridLicenseSupported}, features "
            f"(code, state)={feats}")
    else:
        out["DCGM_FI_DEV_VGPU_LICENSE_STATUS"] = lic
    rows = answer(lambda: nv.nvmlDeviceGetRemappedRows(h))
    if isinstance(rows, tuple):
        out["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] = rows[0]
        out["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] = rows[1]
        out["DCGM_FI_DEV_ROW_REMAP_FAILURE"] = rows[3]
    else:
        for name in ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                     "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE"):
            out[name] = rows
    out["DCGM_FI_DRIVER_VERSION"] = answer(nv.nvmlSystemGetDriverVersion)
    if isinstance(gpm, dict):
        out.update(gpm)
    else:
        for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                     "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
                     "DCGM_FI_PROF_PCIE_RX_BYTES"):
            out[name] = gpm
    return out


def gpm_direct(nv: Any, h: Any, window: float) -> dict[str, float]:
    """The default counters' GPM metrics over ``window`` seconds, in DCGM's units."""
    metrics = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": (nv.NVML_GPM_METRIC_GRAPHICS_UTIL, 0.01),
               "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 0.01),
               "DCGM_FI_PROF_DRAM_ACTIVE": (nv.NVML_GPM_METRIC_DRAM_BW_UTIL, 0.01),
               "DCGM_FI_PROF_PCIE_TX_BYTES": (nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC, 2.0**20),
               "DCGM_FI_PROF_PCIE_RX_BYTES": (nv.NVML_GPM_METRIC_PCIE_RX_PER_SEC, 2.0**20)}
    samples = (nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc())
    try:
        nv.nvmlGpmSampleGet(h, samples[0])
        time.sleep(window)
        nv.nvmlGpmSampleGet(h, samples[1])
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        request.sample1, request.sample2 = samples
        for i, (metric_id, _) in enumerate(metrics.values()):
            request.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(request)
        return {name: request.metrics[i].value * scale
                for i, (name, (_, scale)) in enumerate(metrics.items())}
    finally:
        for sample in samples:
            nv.nvmlGpmSampleFree(sample)


def nvidia_smi() -> dict[int, dict[str, str]]:
    """What ``nvidia-smi -q -x`` says about the new counters, per GPU index ({} without it)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        root = ET.fromstring(subprocess.run([exe, "-q", "-x"], capture_output=True, text=True,
                                            timeout=60, check=True).stdout)
    except (subprocess.SubprocessError, ET.ParseError, OSError):
        return {}
    out: dict[int, dict[str, str]] = {}
    for i, gpu in enumerate(root.iter("gpu")):
        out[i] = {
            "DCGM_FI_DRIVER_VERSION": root.findtext("driver_version", ""),
            "DCGM_FI_DEV_FB_USED": gpu.findtext("fb_memory_usage/used", ""),
            "DCGM_FI_DEV_FB_FREE": gpu.findtext("fb_memory_usage/free", ""),
            "DCGM_FI_DEV_FB_RESERVED": gpu.findtext("fb_memory_usage/reserved", ""),
            "DCGM_FI_DEV_ENC_UTIL": gpu.findtext("utilization/encoder_util", ""),
            "DCGM_FI_DEV_DEC_UTIL": gpu.findtext("utilization/decoder_util", ""),
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": gpu.findtext(
                "gpu_virtualization_mode/virtualization_mode", ""),
        }
    return out


# ---------------------------------------------------------------- costs


def timed(call: Callable[[], Any], n: int) -> tuple[float, float]:
    """(µs wall, µs CPU) per call: the median of 5 batches of ``n`` // 5 calls."""
    batch = max(1, n // 5)
    walls, cpus = [], []
    for _ in range(5):
        w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(batch):
            call()
        cpus.append((time.thread_time_ns() - c0) / 1000 / batch)
        walls.append((time.perf_counter_ns() - w0) / 1000 / batch)
    return statistics.median(walls), statistics.median(cpus)


def costs(nv: Any, h: Any, n: int) -> list[tuple[str, str, float, float, str]]:
    """(call, tier, µs wall, µs CPU, answer) of each NVML call the new counters added,
    made as the backend makes it, and of the backend's reads."""
    from stepscope.gpu import pynvml_compat
    from stepscope.gpu.field_reads import RATES
    from stepscope.gpu.nvml_backend import NvmlBackend

    rows: list[tuple[str, str, float, float, str]] = []

    def c_call(name: str, tier: str, symbol: str, *args: Any) -> None:
        try:
            fn = nv._nvmlGetFunctionPointer(symbol)
        except nv.NVMLError as exc:
            rows.append((name, tier, 0.0, 0.0, f"not in this driver: {exc}"))
            return
        ret = fn(h, *args)
        wall, cpu = timed(lambda: fn(h, *args), n)
        rows.append((name, tier, wall, cpu, "success" if ret == nv.NVML_SUCCESS
                     else f"nvmlReturn {ret} ({nv.nvmlErrorString(ret)})"))

    mem2 = pynvml_compat.memory_v2()
    c_call("nvmlDeviceGetMemoryInfo_v2 (replaces v1)", "fast", "nvmlDeviceGetMemoryInfo_v2",
           ctypes.byref(mem2))
    mem1 = pynvml_compat.Memory()
    c_call("  [was] nvmlDeviceGetMemoryInfo (v1)", "fast", "nvmlDeviceGetMemoryInfo",
           ctypes.byref(mem1))
    for name in ("nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization"):
        util, period = ctypes.c_uint(), ctypes.c_uint()
        c_call(name, "fast", name, ctypes.byref(util), ctypes.byref(period))
    (nvlink,) = RATES  # nvlink_bandwidth_total's counters
    request = pynvml_compat.FieldValueArray([fid for fid, _ in nvlink.field_ids],
                                            pynvml_compat.SCOPE_ALL_LINKS)
    c_call("nvmlDeviceGetFieldValues NVLink data rx+tx, all links", "slow",
           "nvmlDeviceGetFieldValues", request.count, request.array)
    answers = ", ".join(f"{fid}: {code}" for fid, code, _ in request.answers())
    rows[-1] = (*rows[-1][:4], f"{rows[-1][4]}; per field (id: nvmlReturn) {answers}")
    if pynvml_compat.GridLicensableFeatures is not None:
        features = pynvml_compat.GridLicensableFeatures()
        c_call("nvmlDeviceGetGridLicensableFeatures_v4", "slow",
               "nvmlDeviceGetGridLicensableFeatures_v4", ctypes.byref(features))
    wall, cpu = timed(nv.nvmlSystemGetDriverVersion, min(n, 100))
    rows.append(("nvmlSystemGetDriverVersion (once, at start)", "start", wall, cpu, "success"))

    from stepscope.gpu.model import Tier

    clock = iter(range(10**9)).__next__  # 1 s per call: every read computes GPM
    backend = NvmlBackend(clock=lambda: float(clock()))
    try:
        for tier, tiers, calls in (("fast", frozenset({Tier.FAST}), n),
                                   ("slow", frozenset({Tier.SLOW}), max(10, n // 100))):
            reading = backend.read(0, tiers)
            wall, cpu = timed(partial(backend.read, 0, tiers), calls)
            rows.append((f"NvmlBackend.read({tier.upper()}), the whole read ({calls} reads)",
                         tier, wall, cpu, f"{len(reading.values)} keys, {reading.errors} errors"))
    finally:
        backend.close()
    return rows


# ---------------------------------------------------------------- report


def markdown(text: str, command: list[str], out: Path, names: list[str],
             direct: list[dict[str, Any]], smi: dict[int, dict[str, str]],
             cost_rows: list[tuple[str, str, float, float, str]], calls: int) -> str:
    """The report: per GPU, each default counter served and read directly; the costs."""
    types, samples = parse(text)

    lines = [
        "# dcgm-exporter's default counters: stepscope on NVML vs NVML read directly", "",
        f"Command: `python -m validation.gpu_counters_validation "
        f"--out {out}`; exporter: `{' '.join(command[1:])}`. Default counters from "
        "NVIDIA/dcgm-exporter `etc/default-counters.csv` (d5e5f51). Served values come from "
        "the scrape; the NVML column was read by this script with pynvml right after it "
        "(rates and utilisations over its own ~1 s window), so changing values differ a "
        "little. **New** marks what this change serves or reads differently.", "",
    ]
    for i, name_of_gpu in enumerate(names):
        lines += [f"## GPU {i}: {name_of_gpu}", "",
                  "| Counter | dcgm type | served type | served | stepscope value | NVML directly "
                  "| nvidia-smi -q |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for name, kind in DEFAULT_COUNTERS:
            tag = f"**{name}** (new)" if name in NEW else name
            if kind == "label":
                got = [lbl.get(name) for (fam, gpu), (lbl, _) in samples.items()
                       if gpu == str(i) and fam.startswith("DCGM_FI_")]
                value = ", ".join(sorted({v or "(absent)" for v in got})) or "(no series)"
                served, served_type = ("yes" if all(got) and got else "no"), "label"
            else:
                sample = samples.get((name, str(i)))
                served = "yes" if sample else "no"
                served_type = types.get(name, "")
                value = show(sample[1]) if sample else "(absent)"
            lines.append(f"| {tag} | {kind} | {served_type} | {served} | {value} | "
                         f"{show(direct[i].get(name, ''))} | {smi.get(i, {}).get(name, '')} |")
        lines += ["", f"Memory v1 for comparison: {direct[i]['fb_v1']}. NVLink: "
                  f"{direct[i]['nvlink_links']}.", ""]
    lines += ["## Cost of each new NVML call (GPU 0)", "",
              f"µs per call, median of 5 batches over {calls} calls, C function called "
              "as the backend calls it (output built once). A FAST call runs every interval "
              "for every GPU; the FAST read cost before this change was 69.6 µs CPU "
              "(docs/validation/h200-2026-12-03/nvml_cost.txt).", "",
              "| Call | Tier | µs wall | µs CPU | Answer |", "| --- | --- | --- | --- | --- |"]
    for name, tier, wall, cpu, note in cost_rows:
        costly = tier == "fast" and cpu > 20 and not name.startswith("NvmlBackend")
        flag = " **(costly for the fast tier)**" if costly else ""
        lines.append(f"| {name} | {tier} | {wall:.1f} | {cpu:.1f}{flag} | {note} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=1000, help="calls per cost measurement")
    args = ap.parse_args()
    try:
        import pynvml as nv

        nv.nvmlInit()
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            raise RuntimeError("NVML sees no GPU")
    except Exception as exc:
        print(f"gpu_counters_validation: no NVIDIA GPU or driver here: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    names = [nv.nvmlDeviceGetName(h) for h in handles]
    print(f"{count} GPU(s): {', '.join(map(str, names))}; timing the new NVML calls on GPU 0")
    cost_rows = costs(nv, handles[0], args.calls)

    port, ingest = free_port(), free_port(socket.SOCK_DGRAM)
    env = {**os.environ, "PYTHONPATH": str(REPO / "exporter"), "PYTHONUNBUFFERED": "1"}
    log_path = out / "exporter.log"
    command = [sys.executable, "-m", "stepscope", "serve", "--listen", f"127.0.0.1:{port}",
               "--interval", "1", "--slow-interval", "2", "--hostname", "validation",
               "--ingest", f"udp://127.0.0.1:{ingest}"]
    with open(log_path, "w") as log:
        exporter = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        if not wait_for_exporter(port, exporter, log_path):
            return 1
        # the NVLink rate needs two slow passes: wait for it (or give up after 20 s)
        deadline = time.monotonic() + 20.0
        text = scrape(port)
        while "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{" not in text and time.monotonic() < deadline:
            time.sleep(0.5)
            text = scrape(port)
        time.sleep(2.5)  # one more slow pass, so every slow counter is fresh
        text = scrape(port)
        direct = [nvml_direct(nv, h) for h in handles]
    finally:
        exporter.terminate()
        exporter.wait(timeout=30)
    smi = nvidia_smi()
    (out / "metrics.txt").write_text(text)
    report = out / "default-counters.md"
    report.write_text(markdown(text, command, out, names, direct, smi, cost_rows, args.calls))
    print(report.read_text())
    nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
