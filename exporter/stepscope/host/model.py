"""Plain data the host source produces, and the PSI parser. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from stepscope.core.source import PartKey


@dataclass(frozen=True)
class Pressure:
    """One line of ``/proc/pressure/<resource>``: share of wall time stalled (0-1).

    ``some``: at least one task stalled, averaged over the kernel's last 10 s (the
    ``full`` line is not used by any rule).
    """

    some_avg10: float


@dataclass(frozen=True)
class ProcessReading:
    """A training rank's process and its children (the DataLoader workers).

    CPU figures are cores busy (CPU seconds per second) since the previous read.
    ``workers`` counts the rank's child processes other than multiprocessing's
    own helpers (resource tracker, fork server): with PyTorch these are the
    DataLoader workers.
    ``cpus``: its CPU affinity (a cpuset or ``taskset``): "the CPUs are saturated"
    is judged over these, not over the whole host.
    ``seconds``: the time since the previous read, the weight of these rates in a mean.
    ``started``: when the process started (Unix time, to a clock tick), None if unknown.
    """

    pid: int
    cpu_cores: float
    workers: int
    workers_cpu_cores: float
    cpus: tuple[int, ...] = ()  # the CPUs the process may run on (affinity); () unknown
    seconds: float = 1.0
    started: float | None = None


@dataclass(frozen=True)
class HostReading:
    """What one pass read from the host.

    ``cpu_busy`` per logical CPU and ``iowait`` (share of all CPU time) are since
    the previous read, ``seconds`` ago: a mean over readings weighs each by it (a read
    that came 10 ms after the last one is a jiffy or two, all busy or all idle).
    ``cpu_pressure`` / ``io_pressure`` are None where the kernel has no PSI.
    ``processes`` holds the ranks' pids that could be read (a pid of another PID
    namespace is simply absent).
    """

    cpu_count: int
    cpu_busy: tuple[float, ...] = ()
    iowait: float = 0.0
    cpu_pressure: Pressure | None = None
    io_pressure: Pressure | None = None
    processes: Mapping[int, ProcessReading] = field(default_factory=dict)
    seconds: float = 1.0

    @property
    def busy(self) -> float:
        """Mean busy share over all CPUs (0-1)."""
        return sum(self.cpu_busy) / len(self.cpu_busy) if self.cpu_busy else 0.0


def parse_pressure(text: str) -> Pressure | None:
    """Parse ``/proc/pressure/cpu|io`` text; None when it has no ``some`` line.

    ``some avg10=1.03 avg60=0.78 avg300=0.60 total=21685014`` -> 0.0103.
    """
    some: float | None = None
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(part.split("=", 1) for part in rest.split() if "=" in part)
        try:
            avg10 = float(fields["avg10"]) / 100.0
        except (KeyError, ValueError):
            continue
        if kind == "some":
            some = avg10
    if some is None:
        return None
    return Pressure(some)


HOST_PART: PartKey[HostReading] = PartKey("host")
