"""``HostSource``: per-CPU busy, iowait, CPU/IO pressure, and the ranks' loader workers.

Read by the sampler thread once per pass (never by a scrape). CPU figures are
deltas since the previous read, so the first read reports the time since boot
for the CPUs and nothing for processes not seen before. Every read is a few
``/proc`` files plus, when there are training ranks, one scan of ``/proc`` for
their children (psutil's ``children()`` scans it once per call: once per rank).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from stepscope.core.exposition import Family
from stepscope.core.labels import LabelSchema
from stepscope.core.procfs import PPID, STARTTIME, started_unix, stat_field
from stepscope.core.source import ReadContext, Source
from stepscope.host.metrics import host_families
from stepscope.host.model import HOST_PART, HostReading, Pressure, ProcessReading, parse_pressure

log = logging.getLogger("stepscope.host")

# Children of a rank that are multiprocessing's helpers, not DataLoader workers.
_HELPERS = ("resource_tracker", "semaphore_tracker", "forkserver")


def _total(t: Any) -> float:
    # guest time is already counted in user/nice on Linux
    return float(sum(t)) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)


def _busy(prev: Any, cur: Any) -> tuple[float, float]:
    """(busy share, iowait share) of one CPU's time between two cpu_times readings."""
    total = _total(cur) - _total(prev)
    if total <= 0:
        return 0.0, 0.0
    idle = (cur.idle - prev.idle) + (getattr(cur, "iowait", 0.0) - getattr(prev, "iowait", 0.0))
    iowait = getattr(cur, "iowait", 0.0) - getattr(prev, "iowait", 0.0)
    return min(1.0, max(0.0, 1.0 - idle / total)), min(1.0, max(0.0, iowait / total))


@dataclass(slots=True)
class _Tracked:
    """A rank's process, the CPU seconds seen of it and of its children, and the
    children known to be multiprocessing's helpers (their command line read once)."""

    proc: psutil.Process
    cpu: float
    started: float | None = None
    children: dict[int, tuple[psutil.Process, float]] = field(default_factory=dict)
    helpers: set[int] = field(default_factory=set)


def process_started(pid: int, proc: Path = Path("/proc")) -> float | None:
    """When process ``pid`` started, as Unix time to a clock tick (10 ms); None where
    ``/proc`` does not say (:func:`stepscope.core.procfs.started_unix`)."""
    ticks = stat_field(os.path.join(proc, str(pid)), STARTTIME)
    return started_unix(ticks) if ticks is not None else None


class ProcessParents:
    """Every process's children, from ``/proc``, reading only what changed.

    A scan of ``/proc/<pid>/stat`` cost ~17 us a process each pass (a Kubernetes GPU
    node runs hundreds). A process's parent is remembered with the inode of its
    ``/proc/<pid>`` directory, which a new process given the same pid does not share,
    so only new processes are read. A parent changes only when the parent ends (the
    child is re-parented); the children of the parents asked for are read again each
    time, so none is counted under a parent that ended and whose pid came back.
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._ppid: dict[tuple[int, int], int] = {}  # (pid, inode) -> parent pid

    def children(self, parents: frozenset[int] | None = None) -> dict[int, list[int]]:
        """The children of each of ``parents`` (all processes when None) that have
        any. A process that ends meanwhile is skipped."""
        out: dict[int, list[int]] = {}
        known = self._ppid
        seen: dict[tuple[int, int], int] = {}  # processes gone are forgotten
        try:
            entries = os.scandir(self._proc)
        except OSError:
            self._ppid = seen
            return out
        with entries:
            for entry in entries:
                name = entry.name
                if not (name.isascii() and name.isdigit()):
                    continue
                try:
                    key = (int(name), entry.inode())
                except OSError:
                    continue
                ppid = known.get(key)
                if ppid is None or (parents is not None and ppid in parents):
                    ppid = stat_field(entry.path, PPID)
                    if ppid is None:
                        continue
                seen[key] = ppid
                if parents is None or ppid in parents:
                    out.setdefault(ppid, []).append(key[0])
        self._ppid = seen
        return out


def _cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


class HostSource(Source[HostReading]):
    """Reads the host; owns per-CPU and per-process baselines (sampler thread only).

    The pids it looks at are the training ranks' that the ingest named this pass.
    """

    key = HOST_PART

    def __init__(
        self,
        pressure_dir: Path = Path("/proc/pressure"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pressure_dir = pressure_dir
        self._clock = clock
        self._prev_cpus: list[Any] = list(psutil.cpu_times(percpu=True))
        self._prev_total: Any = psutil.cpu_times()
        self._prev_t = clock()
        self._procs: dict[int, _Tracked] = {}
        self._parents = ProcessParents()

    def _pressure(self, resource: str) -> Pressure | None:
        try:
            return parse_pressure((self._pressure_dir / resource).read_text())
        except OSError:  # no PSI on this kernel (or disabled): absent, not zero
            return None

    def _process(self, pid: int, dt: float, child_pids: list[int]) -> ProcessReading | None:
        tracked = self._procs.get(pid)
        try:
            if tracked is None:
                proc = psutil.Process(pid)
                tracked = self._procs[pid] = _Tracked(
                    proc, _cpu_seconds(proc), process_started(pid)
                )
                main = 0.0
            else:
                if not tracked.proc.is_running():  # ended, or its pid reused
                    raise psutil.NoSuchProcess(pid)
                cpu = _cpu_seconds(tracked.proc)
                main, tracked.cpu = max(0.0, cpu - tracked.cpu), cpu
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._procs.pop(pid, None)
            return None
        workers = 0
        workers_cpu = 0.0
        seen: dict[int, tuple[psutil.Process, float]] = {}
        helpers = tracked.helpers
        tracked.helpers = helpers & set(child_pids)
        for child_pid in child_pids:
            if child_pid in helpers:
                continue
            try:
                known = tracked.children.get(child_pid)
                child = known[0] if known is not None else psutil.Process(child_pid)
                if known is None and any(h in " ".join(child.cmdline()) for h in _HELPERS):
                    tracked.helpers.add(child_pid)
                    continue
                cpu = _cpu_seconds(child)
                # a child seen for the first time is only a baseline: its CPU before
                # this interval can't be told apart (create_time is only as exact as
                # the boot time's whole second), and counting it read 3.5 cores on 2
                if known is not None:
                    workers_cpu += max(0.0, cpu - known[1])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            seen[child.pid] = (child, cpu)
            workers += 1
        tracked.children = seen
        try:
            cpus = tuple(sorted(tracked.proc.cpu_affinity() or ()))
        except (psutil.Error, AttributeError, OSError):  # no affinity on this platform
            cpus = ()
        # CPU times tick in 10 ms jiffies: over a short dt one tick can read as several
        # cores; nothing uses more cores than it may run on
        limit = float(len(cpus) or psutil.cpu_count() or 1)
        return ProcessReading(
            pid,
            min(main / dt, limit),
            workers,
            min(workers_cpu / dt, limit),
            cpus,
            dt,
            tracked.started,
        )

    def read(self, ctx: ReadContext) -> HostReading:
        return self.read_pids(r.proc for r in ctx.ranks if r.proc is not None)

    def families(self, part: HostReading, labels: LabelSchema) -> Iterable[Family]:
        return host_families(part, labels)

    def read_pids(self, pids: Iterable[int] = ()) -> HostReading:
        """One reading; ``pids`` are the training ranks' processes to look at."""
        now = self._clock()
        dt = max(now - self._prev_t, 1e-3)
        self._prev_t = now
        cpus = list(psutil.cpu_times(percpu=True))
        busy = tuple(_busy(p, c)[0] for p, c in zip(self._prev_cpus, cpus, strict=False))
        total = psutil.cpu_times()
        iowait = _busy(self._prev_total, total)[1]
        self._prev_cpus, self._prev_total = cpus, total
        wanted = set(pids)
        for gone in set(self._procs) - wanted:
            del self._procs[gone]
        processes: dict[int, ProcessReading] = {}
        children = self._parents.children(frozenset(wanted)) if wanted else {}
        for pid in sorted(wanted):
            reading = self._process(pid, dt, children.get(pid, []))
            if reading is not None:
                processes[pid] = reading
        return HostReading(
            cpu_count=len(cpus),
            cpu_busy=busy,
            iowait=iowait,
            cpu_pressure=self._pressure("cpu"),
            io_pressure=self._pressure("io"),
            processes=processes,
            seconds=dt,
        )
