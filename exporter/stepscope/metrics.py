"""Map a Snapshot to metric families: pure functions over plain data.

Per-GPU families come from the table in :mod:`stepscope.gpu.fields`; the rest
(up/info, clock-event one-hot, XIDs, the exporter's own health) are built here.
Every value was read by the sampler on its own interval, never at scrape time.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

from prometheus_client.process_collector import ProcessCollector

from stepscope import __version__
from stepscope.aws.metrics import node_families
from stepscope.diagnose.metrics import diagnosis_families
from stepscope.exposition import Family, from_client_metric, join_labels, label_string
from stepscope.gpu.fields import (
    CLOCK_EVENT_DURATION_KEYS,
    CLOCK_EVENT_REASONS,
    COUNTER,
    FIELDS,
    GAUGE,
)
from stepscope.gpu.model import GpuInfo
from stepscope.host.metrics import host_families
from stepscope.net.metrics import rdma_families
from stepscope.snapshot import Snapshot
from stepscope.training.metrics import training_families

_SAMPLED = " Sampled by the exporter every interval, not at scrape time."


def gpu_labels(info: GpuInfo, hostname: str, hpc_job: str | None = None) -> str:
    """The label set dcgm-exporter puts on every GPU series, rendered; ``hpc_job``
    (dcgm-exporter's name too) only when the job mapping is on."""
    pairs = [
        ("gpu", str(info.index)),
        ("UUID", info.uuid),
        ("pci_bus_id", info.pci_bus_id),
        ("device", info.device),
        ("modelName", info.name),
        ("Hostname", hostname),
    ]
    if hpc_job is not None:
        pairs.append(("hpc_job", hpc_job))
    return label_string(pairs)


class LabelCache:
    """Rendered GPU label strings, kept while a GPU's facts stay the same."""

    def __init__(self) -> None:
        self._cache: dict[tuple[GpuInfo, str, str | None], str] = {}

    def get(self, info: GpuInfo, hostname: str, hpc_job: str | None = None) -> str:
        key = (info, hostname, hpc_job)
        labels = self._cache.get(key)
        if labels is None:
            if len(self._cache) > 4096:  # hostnames and jobs change: don't grow forever
                self._cache.clear()
            labels = self._cache[key] = gpu_labels(info, hostname, hpc_job)
        return labels


def gpu_families(snapshot: Snapshot, labels: LabelCache) -> list[Family]:
    """All per-GPU families for the GPUs in ``snapshot``."""
    host = snapshot.hostname
    jobs = snapshot.hpc_jobs
    gpus = [
        (g, labels.get(g.info, host, None if jobs is None else jobs.get(g.info.index, "")))
        for g in snapshot.gpus
    ]
    live = [(g, lbl) for g, lbl in gpus if g.up]
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
            join_labels(
                lbl,
                label_string(
                    (
                        ("driver_version", i.driver_version),
                        ("serial", i.serial),
                        ("vbios_version", i.vbios_version),
                        ("profiling", "supported" if i.profiling_supported else "unsupported"),
                        ("mig_mode", i.mig_mode),
                    )
                ),
            ),
            1.0,
        )
        cpu.add(lbl, g.sample_cpu_seconds)
    fams += [up, info, cpu]

    for spec in FIELDS:
        fam = Family(spec.name, spec.type, spec.help + _SAMPLED)
        key = spec.key
        for g, lbl in live:
            v = g.values.get(key)
            if v is not None:
                fam.add(lbl, v)
        fams.append(fam)

    active = Family(
        "stepscope_gpu_clock_event_active",
        GAUGE,
        "Whether each clock event (throttle) reason is active now (one-hot per "
        "reason, decoded from DCGM_FI_DEV_CLOCKS_EVENT_REASONS).",
    )
    for g, lbl in live:
        mask = g.values.get("clocks_event_reasons")
        if mask is None:
            continue
        bits = int(mask)
        for bit, reason in CLOCK_EVENT_REASONS:
            active.add(join_labels(lbl, f'{{reason="{reason}"}}'), 1.0 if bits & bit else 0.0)
    fams.append(active)

    durations = Family(
        "stepscope_gpu_clock_event_seconds_total",
        COUNTER,
        "Cumulative time clocks were held down, by reason (NVML clock event reason field ids).",
    )
    for g, lbl in live:
        for key, reason in CLOCK_EVENT_DURATION_KEYS:
            ns = g.values.get(key)
            if ns is not None:
                durations.add(join_labels(lbl, f'{{reason="{reason}"}}'), ns / 1e9)
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
    for g, lbl in gpus:
        last_xid.add(lbl, float(g.last_xid))
        for code, count in sorted(g.xid_counts.items()):
            xids.add(join_labels(lbl, f'{{xid="{code}"}}'), float(count))
    fams += [last_xid, xids]
    return fams


def exporter_families(snapshot: Snapshot) -> list[Family]:
    """The exporter's own health: build, collection time, errors, staleness."""
    build = Family("stepscope_build_info", GAUGE, "stepscope build; the value is always 1.")
    build.add(
        label_string(
            (
                ("version", __version__),
                ("python_version", platform.python_version()),
                ("backend", snapshot.backend),
            )
        ),
        1.0,
    )
    duration = Family(
        "stepscope_collect_duration_seconds",
        GAUGE,
        "Wall time of the last sampling pass over all GPUs.",
    )
    duration.add("", snapshot.collect_duration_seconds)
    last = Family(
        "stepscope_last_collect_timestamp_seconds",
        GAUGE,
        "Unix time of the last completed sampling pass (staleness: compare to time()).",
    )
    last.add("", snapshot.timestamp)
    errors = Family(
        "stepscope_collect_errors_total",
        COUNTER,
        "Errors while sampling, by source (gpu: a getter failed; gpu_down: a GPU "
        "stopped answering; events: the XID event read failed; training: taking the "
        "training view failed).",
    )
    for source, count in sorted(snapshot.collect_errors.items()):
        errors.add(label_string((("source", source),)), float(count))
    intervals = Family(
        "stepscope_sampling_interval_seconds",
        GAUGE,
        "Configured sampling interval, by tier (fast: activity and clocks; slow: "
        "costly counters such as energy and violation times).",
    )
    intervals.add('{tier="fast"}', snapshot.interval)
    intervals.add('{tier="slow"}', snapshot.slow_interval)
    return [build, duration, last, errors, intervals]


_PROCESS = ProcessCollector(registry=None)


def process_families() -> Iterable[Family]:
    """process_* families (CPU, RSS, fds) from prometheus_client, Linux only."""
    return [from_client_metric(m) for m in _PROCESS.collect()]


def snapshot_families(snapshot: Snapshot, labels: LabelCache) -> list[Family]:
    """Every family served for ``snapshot``."""
    return [
        *gpu_families(snapshot, labels),
        *training_families(snapshot),
        *host_families(snapshot),
        *rdma_families(snapshot),
        *diagnosis_families(snapshot),
        *node_families(snapshot.node, snapshot.hostname),
        *exporter_families(snapshot),
        *process_families(),
    ]
