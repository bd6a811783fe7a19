"""A monotonic clock the test moves by hand."""

from __future__ import annotations


class ManualClock:
    """Reads ``t`` (``clock()``); the test moves it (``clock.t += 1.5``). ``sleep``
    moves it too and records each sleep, for code that waits on the clock it is given."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds
