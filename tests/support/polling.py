"""Waiting for a condition with a deadline: the tests never sleep to synchronise."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s (last: {last!r})")
