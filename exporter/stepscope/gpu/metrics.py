"""Map the GPU part of a Snapshot to metric families: pure functions over plain data.

Per-GPU families come from the table in :mod:`stepscope.gpu.fields`; up/info, the
active clock-event reasons and their durations, and XIDs are built here. Every series carries the
GPU's label set from the pass's label schema (dcgm-exporter's labels plus enrichment);
the ``DCGM_FI_*`` ones also carry ``DCGM_FI_DRIVER_VERSION``, as dcgm-exporter's do.
Every value was read by the sampler on its own interval, never at scrape time.
"""

from __future__ import annotations

from stepscope.core.exposition import COUNTER, GAUGE, Family, join_labels, label_string
from stepscope.core.labels import LabelSchema
from stepscope.gpu.fields import (
    CLOCK_EVENT_DURATION_KEYS,
    CLOCK_EVENT_REASONS,
    DRIVER_VERSION_LABEL,
    FIELDS,
)
from stepscope.gpu.model import GpuPart

_SAMPLED = " Sampled by the exporter every interval, not at scrape time."
_REASON = {reason: label_string((("reason", reason),)) for _, reason in CLOCK_EVENT_REASONS}
# Clock-event durations that a dcgm-exporter counter already serves, to the nanosecond
# from the same NVML field: DCGM_FI_DEV_POWER_VIOLATION (sw_power_cap) and
# DCGM_FI_DEV_SYNC_BOOST_VIOLATION (sync_boost). Served once, under DCGM's name; the
# stepscope family keeps what DCGM's do not split out: software vs hardware thermal
# slowdown (DCGM_FI_DEV_THERMAL_VIOLATION is their sum) and the hardware power brake.
_DURATIONS = tuple(
    (key, reason)
    for key, reason in CLOCK_EVENT_DURATION_KEYS
    if reason not in ("sw_power_cap", "sync_boost")
)


def gpu_families(part: GpuPart, labels: LabelSchema) -> list[Family]:
    """All per-GPU families for the GPUs in ``part``."""
    extend = labels.extend
    gpus = [(g, labels.gpu(g.info.uuid)) for g in part.gpus]
    # dcgm-exporter's DCGM_FI_* series carry the driver version as a label (its default
    # counters list DCGM_FI_DRIVER_VERSION as a "label"): one value per node, so no more
    # series; it changes only with the driver, which restarts the exporter anyway.
    dcgm = [extend(lbl, ((DRIVER_VERSION_LABEL, g.info.driver_version),)) for g, lbl in gpus]
    live = [(g, lbl, d) for (g, lbl), d in zip(gpus, dcgm, strict=True) if g.up]
    fams: list[Family] = []

    up = Family(
        "stepscope_gpu_up",
        GAUGE,
        "Whether the GPU answered its last sampling pass (1) or is down (0).",
    )
    info = Family("stepscope_gpu_info", GAUGE, "Static facts about the GPU; the value is always 1.")
    cpu = Family(
        "stepscope_gpu_sample_cpu_seconds_total",
        COUNTER,
        "CPU time the exporter spent reading this GPU (NVML calls included).",
    )
    for g, lbl in gpus:
        up.add(lbl, 1.0 if g.up else 0.0)
        i = g.info
        info.add(
            extend(
                lbl,
                (
                    ("driver_version", i.driver_version),
                    ("serial", i.serial),
                    ("vbios_version", i.vbios_version),
                    ("profiling", "supported" if i.profiling_supported else "unsupported"),
                    ("mig_mode", i.mig_mode),
                ),
            ),
            1.0,
        )
        cpu.add(lbl, g.sample_cpu_seconds)
    fams += [up, info, cpu]

    for spec in FIELDS:
        fam = Family(spec.name, spec.type, spec.help + _SAMPLED)
        key = spec.key
        ours = not spec.name.startswith("DCGM_")
        once = spec.once_active
        for g, lbl, d in live:
            v = g.values.get(key)
            if v is not None and (not once or key in g.active_keys):
                fam.add(lbl if ours else d, v)
        fams.append(fam)

    # A state set served as its active members only (9 reasons a GPU, almost all 0 most
    # of the time): the full state is DCGM_FI_DEV_CLOCKS_EVENT_REASONS' bit mask.
    active = Family(
        "stepscope_gpu_clock_event_active",
        GAUGE,
        "The clock event (throttle) reasons active now, decoded from "
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS: a series at 1 per active reason; absent "
        "otherwise.",
    )
    for g, lbl, _ in live:
        mask = g.values.get("clocks_event_reasons")
        if mask is None:
            continue
        bits = int(mask)
        for bit, reason in CLOCK_EVENT_REASONS:
            if bits & bit:
                active.add(join_labels(lbl, _REASON[reason]), 1.0)
    fams.append(active)

    durations = Family(
        "stepscope_gpu_clock_event_seconds_total",
        COUNTER,
        "Cumulative time clocks were held down, by reason (NVML clock event reason field "
        "ids): sw_thermal_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown (power cap "
        "and sync boost: DCGM_FI_DEV_POWER_VIOLATION, DCGM_FI_DEV_SYNC_BOOST_VIOLATION).",
    )
    for g, lbl, _ in live:
        for key, reason in _DURATIONS:
            ns = g.values.get(key)
            if ns is not None:
                durations.add(join_labels(lbl, _REASON[reason]), ns / 1e9)
    fams.append(durations)

    last_xid = Family(
        "DCGM_FI_DEV_XID_ERRORS",
        GAUGE,
        "Value of the last XID error encountered (0: none since the exporter started).",
    )
    xids = Family(
        "stepscope_xid_errors_total",
        COUNTER,
        "XID errors reported by the driver since the exporter started, by XID code.",
    )
    for (g, lbl), d in zip(gpus, dcgm, strict=True):
        last_xid.add(d, float(g.last_xid))
        for code, count in sorted(g.xid_counts.items()):
            xids.add(extend(lbl, (("xid", str(code)),)), float(count))
    fams += [last_xid, xids]
    return fams
