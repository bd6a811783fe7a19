"""A real ``stepscope serve`` process on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Exporter:
    """A `stepscope serve` subprocess on a free loopback port."""

    proc: subprocess.Popen[str]
    address: str
    stderr_lines: list[str]

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def get(
        self, path: str, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def metrics(self) -> str:
        status, _, body = self.get("/metrics")
        assert status == 200, body
        return body.decode()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)


# Every exporter process the tests started: one a test forgot to stop (a failed assertion
# before its finally) is killed when the run ends, so none outlives it. (Per session, not
# per test: module fixtures share an exporter between tests.)
STARTED: list[subprocess.Popen[str]] = []


def start_exporter(
    args: Sequence[str],
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    command: Sequence[str] | None = None,
    cwd: str | None = None,
) -> Exporter:
    """Start the exporter and wait (with a deadline) until it says where it serves.

    ``command`` replaces ``python -m stepscope serve --listen 127.0.0.1:0`` before
    ``args``: an installed ``stepscope`` entry point, or one run in a container.
    ``cwd``: the exporter's working directory (the test's, if None).
    """
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("STEPSCOPE_CONFIG", None)
    if command is None:
        command = [sys.executable, "-m", "stepscope", "serve", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*command, *args],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env=full_env,
        cwd=cwd,
    )
    STARTED.append(proc)
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stderr is not None
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        address = served_address(line)
        if address is not None:
            exporter = Exporter(proc, address, lines)
            _drain(proc, lines)
            return exporter
    proc.kill()
    raise AssertionError("exporter did not start:\n" + "".join(lines))


def refused_start(
    args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[int, str]:
    """Run ``stepscope serve`` that must not start: its exit status and stderr. One that
    starts serving instead runs into ``timeout`` (a failure, not a hang)."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("STEPSCOPE_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "serve", "--listen", "127.0.0.1:0", *args],
        capture_output=True, text=True, env=full_env, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done.returncode, done.stderr


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Keep reading stderr in the background so the pipe never fills."""
    def run() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=run, daemon=True).start()


def stop_all() -> None:
    """Kill every exporter process still running (the session's end)."""
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def kill_all(exporters: Sequence[Exporter]) -> None:
    """Kill the exporters still running and reap them all."""
    for exp in exporters:
        if exp.proc.poll() is None:
            exp.proc.kill()
        exp.proc.wait()


def served_address(line: str) -> str | None:
    """HOST:PORT from the start-up line that says where /metrics is served, else None."""
    if " on http" in line and "/metrics" in line:
        return line.rsplit("://", 1)[1].split("/metrics")[0]
    return None


def terminate(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """Stop a server process the test started: SIGTERM, then SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
