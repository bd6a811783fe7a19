"""Log lines that a sender can cause, on a budget no sender can reset.

A refused datagram, a takeover, a failed login: each is an event another process or a
network peer chooses when to cause. Logged as they come, a flood writes the log at the
sender's pace (150,000 refused datagrams once wrote 134,496 lines in 5 s, the exporter at
58% of a core), and a limit kept per key the sender picks (job, rank, address) holds only
per key. Here, as journald's ``RateLimitIntervalSec``/``RateLimitBurst`` and the kernel's
``printk_ratelimit``, each (logger, reason) has one token bucket: :data:`BURST` lines at
once, then :data:`PER_MINUTE` a minute. ``reason`` comes from the code's own vocabulary
(a reject reason, "takeover"), never from a sender. What the bucket refuses is counted and
said in one summary line a minute ("N more ... suppressed"), from :func:`flush_all`, which
the sampler calls once a pass, so the summary comes even after the flood stops.

The counters the lines are about (``stepscope_ingest_rejected_total``, ...) keep counting
every event: the budget limits words, not numbers.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

BURST = 5  # lines at once per (logger, reason)
PER_MINUTE = 5.0  # lines a minute per (logger, reason) after the burst
SUMMARY_EVERY = 60.0  # seconds between "N more suppressed" lines per (logger, reason)
# reasons are the code's own words, a few dozen at most; past this many, the rest share
# one bucket (never a reset of the others)
MAX_REASONS = 256
_SHARED = "(other reasons)"


@dataclass(slots=True)
class _Bucket:
    tokens: float
    refilled: float
    suppressed: int = 0
    summarised: float = 0.0  # when the last summary line (or the first refusal) was


class LogBudget:
    """Token buckets of log lines for one logger, one per reason; thread-safe.

    ``log(reason, level, msg, *args)`` writes the line when the reason's bucket has a
    token and returns True; else counts it for the next summary and returns False.
    """

    def __init__(
        self,
        logger: logging.Logger,
        burst: int = BURST,
        per_minute: float = PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = float(burst)
        self._rate = per_minute / 60.0
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, _Bucket] = {}
        _BUDGETS.add(self)

    def _bucket(self, reason: str, now: float) -> _Bucket:
        bucket = self._buckets.get(reason)
        if bucket is None:
            if len(self._buckets) >= MAX_REASONS:
                reason = _SHARED
                bucket = self._buckets.get(reason)
            if bucket is None:
                bucket = self._buckets[reason] = _Bucket(self._burst, now)
        return bucket

    def allow(self, reason: str) -> bool:
        """Take a token for one line of ``reason``; False (and one more suppressed) if
        the bucket is empty."""
        now = self._clock()
        with self._lock:
            bucket = self._bucket(reason, now)
            bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.refilled) * self._rate)
            bucket.refilled = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return True
            if not bucket.suppressed:
                bucket.summarised = now  # a summary a minute after the first suppressed line
            bucket.suppressed += 1
            return False

    def log(self, reason: str, level: int, msg: str, *args: object) -> bool:
        """Log ``msg % args`` at ``level`` if ``reason``'s budget allows; True if written."""
        if not self._logger.isEnabledFor(level):
            return False
        if not self.allow(reason):
            return False
        self._logger.log(level, msg, *args)
        return True

    def suppressed(self, reason: str) -> int:
        """Lines of ``reason`` suppressed since its last summary (for tests and status)."""
        with self._lock:
            bucket = self._buckets.get(reason)
            return bucket.suppressed if bucket is not None else 0

    def flush(self, force: bool = False) -> int:
        """Write the summary line of each reason with suppressed lines whose last summary
        is :data:`SUMMARY_EVERY` old (every one if ``force``); returns how many."""
        now = self._clock()
        due: list[tuple[str, int, float]] = []
        with self._lock:
            for reason, bucket in self._buckets.items():
                if bucket.suppressed and (force or now - bucket.summarised >= SUMMARY_EVERY):
                    due.append((reason, bucket.suppressed, now - bucket.summarised))
                    bucket.suppressed, bucket.summarised = 0, now
        for reason, count, seconds in due:
            self._logger.warning(
                "%d more log lines for %s suppressed in the last %.0f s (at most %d at once, "
                "then %g a minute; the counters count every event)",
                count, reason, seconds, int(self._burst), self._rate * 60.0,
            )  # fmt: skip
        return len(due)


_BUDGETS: weakref.WeakSet[LogBudget] = weakref.WeakSet()


def flush_all() -> None:
    """Write the due summary lines of every budget (the sampler calls it once a pass)."""
    for budget in list(_BUDGETS):
        budget.flush()
