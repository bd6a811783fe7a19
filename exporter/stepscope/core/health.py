"""The exporter's own health as metric families: build, the pass, every source, process.

Per source, node_exporter's convention: ``stepscope_collector_success{collector}``,
``stepscope_collector_duration_seconds{collector}`` and
``stepscope_collector_errors_total{collector}``, so an operator sees which source is
slow or failing rather than one global number.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping

from prometheus_client.process_collector import ProcessCollector

from stepscope import __version__
from stepscope.core.exposition import COUNTER, GAUGE, Family, from_client_metric, label_string
from stepscope.core.snapshot import Snapshot

_PROCESS = ProcessCollector(registry=None)


def process_families() -> Iterable[Family]:
    """process_* families (CPU, RSS, fds) from prometheus_client, Linux only."""
    return [from_client_metric(m) for m in _PROCESS.collect()]


def health_families(snapshot: Snapshot, build_labels: Mapping[str, str]) -> list[Family]:
    """Build info, the pass's duration and time, each source's health, the intervals."""
    build = Family("stepscope_build_info", GAUGE, "stepscope build; the value is always 1.")
    build.add(
        label_string(
            (
                ("version", __version__),
                ("python_version", platform.python_version()),
                *sorted(build_labels.items()),
            )
        ),
        1.0,
    )
    duration = Family.single(
        "stepscope_collect_duration_seconds",
        GAUGE,
        "Wall time of the last sampling pass over every source (reads, labels, analyses).",
        snapshot.collect_duration_seconds,
    )
    last = Family.single(
        "stepscope_last_collect_timestamp_seconds",
        GAUGE,
        "Unix time of the last completed sampling pass (staleness: compare to time()).",
        snapshot.timestamp,
    )
    success = Family(
        "stepscope_collector_success",
        GAUGE,
        "Whether the source's last read succeeded (1) or failed (0); a background read "
        "still running for the first time reads 0.",
    )
    seconds = Family(
        "stepscope_collector_duration_seconds",
        GAUGE,
        "Wall time of the source's last read (of the read in progress, while a first "
        "background read is pending).",
    )
    errors = Family(
        "stepscope_collector_errors_total",
        COUNTER,
        "Failed reads of the source plus partial errors inside reads (an NVML getter that "
        "failed, a file that could not be read), since the exporter started.",
    )
    for name, h in snapshot.health.items():
        lbl = label_string((("collector", name),))
        success.add(lbl, 1.0 if h.success else 0.0)
        seconds.add(lbl, h.duration_seconds)
        errors.add(lbl, float(h.errors_total))
    intervals = Family(
        "stepscope_sampling_interval_seconds",
        GAUGE,
        "Configured sampling interval, by tier (fast: activity and clocks; slow: "
        "costly counters such as energy and violation times).",
    )
    intervals.add('{tier="fast"}', snapshot.interval)
    intervals.add('{tier="slow"}', snapshot.slow_interval)
    return [build, duration, last, success, seconds, errors, intervals]
