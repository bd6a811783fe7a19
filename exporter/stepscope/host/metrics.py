"""Per-rank host families: the DataLoader workers and the CPU the rank's processes use.

Only what node_exporter does not already serve: per-CPU busy, iowait and pressure
are read for the diagnosis but not exported (node_exporter's ``node_cpu_seconds_total``
and ``node_pressure_*`` have them).
"""

from __future__ import annotations

from stepscope.exposition import Family, join_labels
from stepscope.gpu.fields import GAUGE
from stepscope.snapshot import Snapshot
from stepscope.training.metrics import rank_labels

_MAIN = '{process="main"}'
_WORKERS = '{process="dataloader_workers"}'


def host_families(snapshot: Snapshot) -> list[Family]:
    """``stepscope_dataloader_workers`` and ``stepscope_rank_cpu_cores`` per visible rank."""
    host = snapshot.host
    view = snapshot.training
    if host is None or view is None:
        return []
    by_uuid = {g.info.uuid: g.info for g in snapshot.gpus}
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
    for r in view.ranks:
        proc = host.processes.get(r.pid) if r.pid is not None else None
        if proc is None:
            continue
        lbl = rank_labels(r, by_uuid.get(r.uuid) if r.uuid else None, snapshot.hostname)
        workers.add(lbl, float(proc.workers))
        cpu.add(join_labels(lbl, _MAIN), proc.cpu_cores)
        cpu.add(join_labels(lbl, _WORKERS), proc.workers_cpu_cores)
    return [workers, cpu]
