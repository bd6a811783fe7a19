"""Checks run in the background, one at a time, while the suite waits on servers' clocks.

While the scale-out tier waits (tests/e2e/conftest.py), most of the run's 2 cores are
idle. A check whose result does not depend on when or how fast it runs (a command, its
exit status and output: mypy, promtool's unit tests) can be queued then by its module's
``queue_early(lane)``. The lane runs its commands one after another on a thread of its
own (Go's runtime held to one thread), so it takes at most one core and the window's
servers keep the other; the window does not end before the lane has. The check's test
reads the result with :func:`result`; a check no lane ran is run by its test as before.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Done:
    """A command the lane ran: its exit status, its output (stdout and stderr) and how
    long it ran (for the run's summary)."""

    returncode: int
    output: str
    seconds: float = 0.0


class Lane:
    """Commands queued with :meth:`add`, run one after another once :meth:`start` is
    called; their output goes to files under ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self._queue: list[tuple[str, list[str], Path]] = []
        self._done: dict[str, Done] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, name: str, argv: Sequence[str], cwd: Path) -> None:
        self._queue.append((name, list(argv), cwd))

    @property
    def names(self) -> set[str]:
        return {name for name, _, _ in self._queue}

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        env = {**os.environ, "GOMAXPROCS": "1"}
        for i, (name, argv, cwd) in enumerate(self._queue):
            started = time.monotonic()
            path = self.tmp / f"{i}.out"
            with path.open("wb") as out:
                with self._lock:
                    if self._stopped:
                        return
                    try:
                        self._proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out,
                                                      stderr=subprocess.STDOUT)  # fmt: skip
                    except OSError as err:
                        self._done[name] = Done(127, f"{argv[0]}: {err}")
                        continue
                returncode = self._proc.wait()
            self._done[name] = Done(returncode, path.read_text(errors="replace"),
                                    time.monotonic() - started)

    def wait(self, timeout: float = 600) -> None:
        """Until every command has run (or the lane was stopped)."""
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the background checks ran past {timeout} s"

    def stop(self) -> None:
        """Kill the command running, start none more."""
        with self._lock:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
        if self._thread.ident is not None:
            self._thread.join(30)

    def done(self, name: str) -> Done | None:
        return self._done.get(name)

    @property
    def ran(self) -> dict[str, Done]:
        """Every command run so far, in the order run."""
        return dict(self._done)


LANE: Lane | None = None  # the run's lane, once tests/e2e/conftest.py started one


def result(name: str) -> Done | None:
    """The check ``name``'s result if the run's lane holds it (once the lane has run it),
    else None: its test then runs it itself."""
    lane = LANE
    if lane is None or name not in lane.names:
        return None
    lane.wait()
    return lane.done(name)
