"""What the ingest does when it refuses a step: it says so, once in a while, to the
exporter's log and to the sending process; and whether a rank's process has exited,
so that a restarted rank can take its place at once.

A refused step used to vanish: a job restarted under the same name after a crash had
every datagram refused (``not_owner``) until the old rank expired, five minutes later,
and neither log said a word. Now:

- the exporter logs each (reason, job, rank) at most once a minute, with the number of
  refusals since it last said so;
- a sender whose Unix socket has an address (the SDK binds to an abstract name the
  kernel picks) gets a short answer (``shared.datagram.encode_refusal``) at most once
  every few seconds per reason, sent without blocking: a full or vanished receiver
  costs nothing. UDP is never answered (its source address is not authenticated);
- :func:`process_exited` tells the aggregator when a rank's process is gone, so the same
  user's new process takes the rank over on its first step.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepscope.ingest.aggregate import Sender
from stepscope.shared.datagram import REFUSAL_HINTS, StepRecord, encode_refusal

log = logging.getLogger("stepscope.ingest")

ANSWER_EVERY = 5.0  # seconds between answers to one sender for one reason
LOG_EVERY = 60.0  # seconds between log lines for one (reason, job, rank)
MAX_ANSWERS_PER_SECOND = 100  # a flood of refused senders costs at most this many sends
_REMEMBER = 4096  # distinct keys kept for the rate limits (cleared when full)


def process_exited(pid: int, proc: Path = Path("/proc")) -> bool:
    """Whether the process with kernel pid ``pid`` has exited: no longer in ``/proc``,
    or a zombie its parent has not reaped yet (a crashed rank under a launcher).

    A ``/proc`` that hides other users' processes (``hidepid``) hides only other users'
    ranks, and only the same user's process may take a rank over. Anything unreadable
    otherwise reads as alive: the rank then waits for its expiry, as before.
    """
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # "pid (comm) S ...": comm may hold spaces and parentheses; the state follows the last
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state in (b"Z", b"X")


class Refusals:
    """Logs refusals and answers refused senders, both rate-limited; never raises."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._answered: dict[tuple[Any, str], float] = {}
        self._logged: dict[tuple[str, str | None, int | None], tuple[float, int]] = {}
        self._second = 0.0
        self._answers = 0

    def refused(
        self,
        sock: socket.socket | None,
        address: Any,
        reason: str,
        rec: StepRecord | None,
        sender: Sender | None,
    ) -> None:
        """One step refused for ``reason``: log it (rate-limited) and, when the sender
        has an address on our Unix socket, answer it (rate-limited)."""
        now = self._clock()
        job, rank = (rec.job, rec.rank) if rec is not None else (None, None)
        self._log(now, reason, job, rank, sender)
        if sock is not None and address and sock.family == socket.AF_UNIX:
            self._answer(now, sock, address, reason, job, rank)

    def _log(
        self, now: float, reason: str, job: str | None, rank: int | None, sender: Sender | None
    ) -> None:
        key = (reason, job, rank)
        last, since = self._logged.get(key, (float("-inf"), 0))
        if now - last < LOG_EVERY:
            self._logged[key] = (last, since + 1)
            return
        if len(self._logged) >= _REMEMBER:
            self._logged.clear()
        self._logged[key] = (now, 0)
        who = f"rank {rank} of job {job!r}" if job is not None else "a datagram"
        by = f" from uid {sender.uid} pid {sender.pid}" if sender is not None else ""
        more = f"; {since} more since the last line" if since else ""
        hint = REFUSAL_HINTS.get(reason, "malformed")
        log.warning("ingest: refused %s%s: %s (%s)%s", who, by, reason, hint, more)

    def _answer(
        self,
        now: float,
        sock: socket.socket,
        address: Any,
        reason: str,
        job: str | None,
        rank: int | None,
    ) -> None:
        key = (address, reason)
        if now - self._answered.get(key, float("-inf")) < ANSWER_EVERY:
            return
        if now - self._second >= 1.0:
            self._second, self._answers = now, 0
        if self._answers >= MAX_ANSWERS_PER_SECOND:
            return
        if len(self._answered) >= _REMEMBER:
            self._answered.clear()
        self._answered[key] = now
        self._answers += 1
        # never blocks: a receiver that is full, gone or hostile costs one failed send
        with contextlib.suppress(OSError):
            sock.sendto(encode_refusal(reason, job, rank), socket.MSG_DONTWAIT, address)
