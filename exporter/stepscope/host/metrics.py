"""Per-rank host families: the DataLoader workers and the CPU the rank's processes use.

Only what node_exporter does not already serve: per-CPU busy, iowait and pressure
are read for the diagnosis but not exported (node_exporter's ``node_cpu_seconds_total``
and ``node_pressure_*`` have them).
"""

from __future__ import annotations

from stepscope.core.exposition import GAUGE, Family, join_labels
from stepscope.core.labels import LabelSchema
from stepscope.host.model import HostReading

_MAIN = '{process="main"}'
_WORKERS = '{process="dataloader_workers"}'


def host_families(host: HostReading, labels: LabelSchema) -> list[Family]:
    """``stepscope_dataloader_workers`` and ``stepscope_rank_cpu_cores`` per visible rank."""
    if not host.processes:
        return []
    workers = Family(
        "stepscope_dataloader_workers",
        GAUGE,
        "Child processes of the rank's process other than multiprocessing helpers: its "
        "DataLoader workers. Absent when the rank's pid is not visible to the exporter.",
    )
    cpu = Family(
        "stepscope_rank_cpu_cores",
        GAUGE,
        "CPU cores busy (CPU seconds per second over the last interval) in the rank's "
        "own process (process=main) and in its DataLoader workers together.",
    )
    for r in labels.ranks:
        proc = host.processes.get(r.proc) if r.proc is not None else None
        if proc is None:
            continue
        lbl = labels.rank(r)
        workers.add(lbl, float(proc.workers))
        cpu.add(join_labels(lbl, _MAIN), proc.cpu_cores)
        cpu.add(join_labels(lbl, _WORKERS), proc.workers_cpu_cores)
    return [workers, cpu]
