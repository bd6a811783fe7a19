"""What the ingest does when it refuses a step: it says so, on a budget, to the
exporter's log and to the sending process; and whether a rank's process has exited, so
that a restarted rank can take its place at once.

A refused step used to vanish: a job restarted under the same name after a crash had
every datagram refused (``not_owner``) until the old rank expired, five minutes later,
and neither log said a word. Now both logs say so, and neither can be turned against us
(docs/security.md#answers-to-refused-senders):

- **the log**: a (reason, job, rank) at most once a minute, within one budget per
  reason (:class:`stepscope.core.logbudget.LogBudget`: a few
  lines at once, then a few a minute, then one "N more suppressed" line a minute). The
  sender chooses its job, rank and address but not the reason, so it cannot reset the
  limit by varying them; ``stepscope_ingest_rejected_total`` still counts every datagram;
- **the answer** (``shared.datagram.encode_refusal``) goes only to the process that sent
  the refused datagram, verified with what the kernel vouches for: the sender's address
  must be an abstract name (the SDK autobinds one; a filesystem path is never answered:
  it would be resolved against our working directory and through symlinks, as root), the
  sender's pid (from ``SCM_CREDENTIALS``) must live in this exporter's network
  namespace (where the name is resolved: a sender in another pod's namespace is never
  answered, else whichever process of the host holds that name would be), and the socket
  bound to that name here must be one of that process's open files. Answers are spent
  from the sending uid's own budget (:data:`UID_BURST`, then :data:`UID_PER_SECOND`), so
  one uid's flood cannot use up another's; :data:`MAX_ANSWERS_PER_SECOND` over all uids
  is a last resort that also bounds the cost of the checks. At most one answer per
  (address, reason) every :data:`ANSWER_EVERY` seconds. Sent without blocking: a full or
  vanished receiver costs one failed send. UDP is never answered (its source address is
  not authenticated);
- :func:`process_exited` (``stepscope.core.procfs``) tells the aggregator when a rank's
  process is gone, comparing the start time and owner recorded at first sight, so a
  process on a reused pid is not the owner.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.core.logbudget import LogBudget
from stepscope.core.procfs import ProcessStamp, process_exited, process_stamp
from stepscope.ingest.aggregate import Sender
from stepscope.shared.datagram import REFUSAL_HINTS, StepRecord, encode_refusal

__all__ = [
    "ANSWER_EVERY",
    "LOG_EVERY",
    "MAX_ANSWERS_PER_SECOND",
    "UID_BURST",
    "UID_PER_SECOND",
    "PeerCheck",
    "ProcessStamp",
    "Refusals",
    "process_exited",
    "process_stamp",
]

log = logging.getLogger("stepscope.ingest")

ANSWER_EVERY = 5.0  # seconds between answers to one sender address for one reason
LOG_EVERY = 60.0  # seconds between lines for one (reason, job, rank), within the budget
UID_BURST = 16  # answers a uid may get at once (a job's ranks refused together)
UID_PER_SECOND = 2.0  # then this many a second, per uid
# over all uids: a last resort, and the bound on the /proc reads the checks cost
MAX_ANSWERS_PER_SECOND = 50
_ADDRESSES = 4096  # (address, reason) pairs remembered, least recent forgotten first
_LOG_KEYS = 4096  # (reason, job, rank) remembered for LOG_EVERY, least recent first
_UIDS = 1024  # uid budgets kept; a full (idle) one is forgotten first, never a spent one


class PeerCheck:
    """Whether an abstract Unix address belongs to the process the kernel names.

    Reads ``/proc``: the sender's network namespace against ours, the inode of the
    socket bound to the name in ours (``/proc/net/unix``), and whether that socket is
    one of the sender's open files (``/proc/<pid>/fd``). Anything unreadable fails the
    check: an exporter that is not root can verify only its own uid's processes.
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._netns = self._ns(os.path.join(proc, "self"))

    @staticmethod
    def _ns(process_dir: str) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(process_dir, "ns", "net"))
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def __call__(self, address: Any, pid: int) -> bool:
        name = _abstract_name(address)
        if name is None or pid <= 0 or self._netns is None:
            return False
        process_dir = os.path.join(self._proc, str(pid))
        if self._ns(process_dir) != self._netns:
            return False
        inode = self._bound_inode(name)
        return inode is not None and self._holds(process_dir, inode)

    def _bound_inode(self, name: str) -> int | None:
        """The inode of the socket bound to abstract ``@name`` in our namespace."""
        wanted = "@" + name
        try:
            with open(os.path.join(self._proc, "self", "net", "unix"), encoding="ascii",
                      errors="replace") as f:  # fmt: skip
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) == 8 and fields[7] == wanted:
                        return int(fields[6])
        except (OSError, ValueError):
            return None
        return None

    @staticmethod
    def _holds(process_dir: str, inode: int) -> bool:
        target = f"socket:[{inode}]"
        fd_dir = os.path.join(process_dir, "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return False
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(os.path.join(fd_dir, fd)) == target:
                    return True
        return False


def _abstract_name(address: Any) -> str | None:
    """The printable name of an abstract Unix address (``b"\\0name"``); None for a path,
    an unnamed socket, or a name ``/proc/net/unix`` cannot show unambiguously."""
    if not isinstance(address, bytes) or len(address) < 2 or address[0] != 0:
        return None
    name = address[1:]
    if not all(0x21 <= b <= 0x7E and b != 0x40 for b in name):  # printable, no "@"
        return None
    return name.decode("ascii")


@dataclass(slots=True)
class _Budget:
    tokens: float
    stamp: float


class Refusals:
    """Logs refusals and answers refused senders, both on budgets; never raises."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        peer_check: Callable[[Any, int], bool] | None = None,
    ) -> None:
        self._clock = clock
        self._peer_check = peer_check if peer_check is not None else PeerCheck()
        self._log = LogBudget(log, clock=clock)
        self._lock = threading.Lock()
        self._answered: OrderedDict[tuple[Any, str], float] = OrderedDict()
        self._logged: OrderedDict[tuple[str, str | None, int | None], float] = OrderedDict()
        self._uids: dict[int, _Budget] = {}
        self._second = 0.0
        self._answers = 0
        # what became of the answers (sent, or why not), for the status page and tests
        self.outcomes: dict[str, int] = dict.fromkeys(
            ("sent", "not_abstract", "repeat", "uid_budget", "global_budget", "unverified",
             "send_failed"), 0,
        )  # fmt: skip

    @property
    def log_budget(self) -> LogBudget:
        """The refusal lines' budget (its summary lines come from ``flush_all``)."""
        return self._log

    def refused(
        self,
        sock: socket.socket | None,
        address: Any,
        reason: str,
        rec: StepRecord | None,
        sender: Sender | None,
    ) -> None:
        """One step refused for ``reason``: log it and, when the sender is a verified
        process on our Unix socket, answer it (both on budgets)."""
        job, rank = (rec.job, rec.rank) if rec is not None else (None, None)
        if self._first_in_a_while((reason, job, rank)) and self._log.allow(reason):
            who = f"rank {rank} of job {job!r}" if job is not None else "a datagram"
            by = f" from uid {sender.uid} pid {sender.pid}" if sender is not None else ""
            hint = REFUSAL_HINTS.get(reason, "malformed")
            log.warning("ingest: refused %s%s: %s (%s)", who, by, reason, hint)
        if sock is not None and sender is not None and sock.family == socket.AF_UNIX:
            self._answer(sock, address, reason, job, rank, sender)

    def _first_in_a_while(self, key: tuple[str, str | None, int | None]) -> bool:
        """Whether ``key`` was not logged in the last :data:`LOG_EVERY` seconds: a
        restarted rank refused each step is one line, not one a step. Forgetting a key
        (the least recent, past :data:`_LOG_KEYS`) only lets the budget decide."""
        now = self._clock()
        with self._lock:
            last = self._logged.get(key)
            if last is not None and now - last < LOG_EVERY:
                return False
            self._logged[key] = now
            self._logged.move_to_end(key)
            while len(self._logged) > _LOG_KEYS:
                self._logged.popitem(last=False)
            return True

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def _answer(
        self,
        sock: socket.socket,
        address: Any,
        reason: str,
        job: str | None,
        rank: int | None,
        sender: Sender,
    ) -> None:
        if _abstract_name(address) is None:
            self._count("not_abstract")
            return
        now = self._clock()
        with self._lock:
            key = (address, reason)
            last = self._answered.get(key)
            if last is not None and now - last < ANSWER_EVERY:
                self._count("repeat")
                return
            if not self._spend_uid(sender.uid, now):
                self._count("uid_budget")
                return
            if now - self._second >= 1.0:
                self._second, self._answers = now, 0
            if self._answers >= MAX_ANSWERS_PER_SECOND:
                self._count("global_budget")
                return
            self._answers += 1
            self._answered[key] = now
            self._answered.move_to_end(key)
            while len(self._answered) > _ADDRESSES:
                self._answered.popitem(last=False)
        # the check reads /proc: after the budgets, so a flood pays for few of them
        if not self._peer_check(address, sender.pid):
            self._count("unverified")
            return
        # never blocks: a receiver that is full or gone costs one failed send
        try:
            sock.sendto(encode_refusal(reason, job, rank), socket.MSG_DONTWAIT, address)
        except OSError:
            self._count("send_failed")
        else:
            self._count("sent")

    def _spend_uid(self, uid: int, now: float) -> bool:
        budget = self._uids.get(uid)
        if budget is None:
            if len(self._uids) >= _UIDS and not self._forget_idle_uid(now):
                return False
            budget = self._uids[uid] = _Budget(float(UID_BURST), now)
        budget.tokens = min(float(UID_BURST), budget.tokens + (now - budget.stamp) * UID_PER_SECOND)
        budget.stamp = now
        if budget.tokens < 1.0:
            return False
        budget.tokens -= 1.0
        return True

    def _forget_idle_uid(self, now: float) -> bool:
        """Forget one uid whose budget has refilled (the same as never seen)."""
        for uid, budget in self._uids.items():
            if budget.tokens + (now - budget.stamp) * UID_PER_SECOND >= UID_BURST:
                del self._uids[uid]
                return True
        return False
