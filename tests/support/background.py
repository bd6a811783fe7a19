"""Checks run in the background, one at a time, while the suite waits on servers' clocks.

While the scale-out tier waits (tests/e2e/conftest.py), most of the run's 2 cores are
idle. A check whose result does not depend on when or how fast it runs (a command, its
exit status and output: mypy, promtool's unit tests) can be queued then by its module's
``queue_early(lane)``. The lane runs its commands one after another on a thread of its
own (Go's runtime held to one thread), so it takes at most one core and the window's
servers keep the other; the window does not end before the lane has. The check's test
reads the result with :func:`result`; a check no lane ran is run by its test as before.

A module fixture's preparation whose outcome does not depend on timing either (an image
build, a release's sdist and wheel and their clean-venv installs: mostly one core's pip or
buildah work) can be queued as a call (:meth:`Lane.call`); the fixture takes what it
returned, or what it raised, with :func:`prepared`, which runs it there and then where no
lane did. Such a call should start its Go programs with :data:`LANE_ENV` (one thread).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
# what a call on the lane adds to its commands' environment: Go's runtime on one thread
LANE_ENV = {"GOMAXPROCS": "1"}


@dataclass(frozen=True)
class Done:
    """A command the lane ran: its exit status and its output (stdout and stderr)."""

    returncode: int
    output: str


@dataclass(frozen=True)
class Called:
    """A call the lane made: what it returned, or what it raised (a skip included)."""

    value: Any = None
    error: BaseException | None = None


class Lane:
    """Commands queued with :meth:`add`, run one after another once :meth:`start` is
    called; their output goes to files under ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self._queue: list[tuple[str, list[str] | Callable[[], Any], Path]] = []
        self._done: dict[str, Done | Called] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, name: str, argv: Sequence[str], cwd: Path) -> None:
        self._queue.append((name, list(argv), cwd))

    def call(self, name: str, fn: Callable[[], Any]) -> None:
        """Queue ``fn()`` (run on the lane's thread, in turn with the commands)."""
        self._queue.append((name, fn, self.tmp))

    @property
    def names(self) -> set[str]:
        return {name for name, _, _ in self._queue}

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        env = {**os.environ, **LANE_ENV}
        for i, (name, argv, cwd) in enumerate(self._queue):
            if callable(argv):
                if self._stopped:
                    return
                try:
                    self._done[name] = Called(value=argv())
                except BaseException as err:  # the fixture re-raises it (a skip too)
                    self._done[name] = Called(error=err)
                continue
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
            self._done[name] = Done(returncode, path.read_text(errors="replace"))

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

    def done(self, name: str) -> Done | Called | None:
        return self._done.get(name)


LANE: Lane | None = None  # the run's lane, once tests/e2e/conftest.py started one


def result(name: str) -> Done | None:
    """The check ``name``'s result if the run's lane holds it (once the lane has run it),
    else None: its test then runs it itself."""
    lane = LANE
    if lane is None or name not in lane.names:
        return None
    lane.wait()
    done = lane.done(name)
    assert not isinstance(done, Called), name
    return done


def prepared(name: str, fn: Callable[[], T]) -> T:
    """What ``fn()`` returned on the run's lane, where a module queued it as ``name``
    (what it raised is raised here); else ``fn()``, run now."""
    lane = LANE
    if lane is None or name not in lane.names:
        return fn()
    lane.wait()
    done = lane.done(name)
    if done is None:  # the lane was stopped before it
        return fn()
    assert isinstance(done, Called), name
    if done.error is not None:
        raise done.error
    return done.value  # type: ignore[no-any-return]
