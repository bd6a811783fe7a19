"""What ``/proc`` says of a process: one reader of ``/proc/<pid>/stat`` for every package.

A pid alone does not name a process: the kernel hands a freed pid to the next process
that asks. A process is the pair (pid, start time in clock ticks since boot, ``stat``
field 22), which no two processes of one boot share.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# fields of /proc/<pid>/stat counted from the state (field 3, after the comm's ")")
STATE = 0  # field 3
PPID = 1  # field 4
STARTTIME = 19  # field 22: clock ticks since boot


def stat_fields(path: str) -> list[bytes] | None:
    """The fields of the ``stat`` file in the process directory ``path`` from the state
    on; None when the process is gone or the file does not parse. The comm before them
    may hold spaces and parentheses: the fields start after its last ")"."""
    try:
        with open(os.path.join(path, "stat"), "rb") as f:
            stat = f.read(4096)
        return stat[stat.rindex(b")") + 2 :].split(b" ")
    except (OSError, ValueError):
        return None


def stat_field(path: str, index: int) -> int | None:
    """Integer field ``index`` (counted from the state) of the ``stat`` file in the
    process directory ``path``; None when the process is gone or the field does not parse."""
    fields = stat_fields(path)
    try:
        return int(fields[index]) if fields is not None else None
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class ProcessStamp:
    """A process as first seen: its pid, start time (ticks since boot) and owner uid
    (of its ``/proc/<pid>`` directory); a process later found on the same pid with
    another start time or uid is another process. ``started``: the start as Unix time
    (:func:`started_unix`; None where the clocks do not say), for the goodput bill."""

    pid: int
    start: int
    uid: int
    started: float | None = None


def started_unix(ticks: int) -> float | None:
    """A start in clock ticks since boot (``stat`` field 22) as Unix time, to a tick
    (10 ms); None where the clocks do not say. psutil's ``create_time()`` adds the boot
    time's whole second, off by up to a second: the ticks are set against
    ``CLOCK_BOOTTIME`` instead, both read now."""
    try:
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):  # no CLOCK_BOOTTIME: not Linux
        return None
    return time.time() - max(0.0, age)


def process_stamp(pid: int, proc: Path = Path("/proc")) -> ProcessStamp | None:
    """The stamp of live process ``pid``; None where ``/proc`` does not say (gone,
    another PID namespace, unreadable)."""
    if pid <= 0:
        return None
    path = os.path.join(proc, str(pid))
    try:
        uid = os.stat(path).st_uid
    except OSError:
        return None
    start = stat_field(path, STARTTIME)
    return ProcessStamp(pid, start, uid, started_unix(start)) if start is not None else None


def process_exited(pid: int, stamp: ProcessStamp | None = None, proc: Path = Path("/proc")) -> bool:
    """Whether the process with kernel pid ``pid`` (first seen as ``stamp``) has exited:
    no longer in ``/proc``, a zombie its parent has not reaped yet (a crashed rank under
    a launcher), or, with a stamp, another process on the reused pid (another start time
    or owner).

    A ``/proc`` that hides other users' processes (``hidepid``) hides only other users'
    processes. Anything unreadable otherwise reads as alive.
    """
    path = os.path.join(proc, str(pid))
    try:
        uid = os.stat(path).st_uid
    except FileNotFoundError:
        return True
    except OSError:
        return False
    fields = stat_fields(path)
    if fields is None:
        return not os.path.exists(path)
    if fields[STATE] in (b"Z", b"X"):
        return True
    if stamp is None:
        return False
    try:
        start = int(fields[STARTTIME])
    except (ValueError, IndexError):
        return False
    return start != stamp.start or uid != stamp.uid
