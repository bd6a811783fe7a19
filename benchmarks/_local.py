"""Helpers the benchmark scripts share: free loopback ports and plain HTTP GETs.

The scripts run as ``python benchmarks/NAME.py``, so this module is importable as a
sibling (``from _local import free_port``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port nothing listens on at the moment, on 127.0.0.1 (TCP by default)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> bytes:
    """The body of a GET; raises OSError (URLError) when nothing answers."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def scrape(port: int, path: str = "/metrics") -> str:
    """``/metrics`` (or ``path``) of an exporter on 127.0.0.1:``port`` as text."""
    return get(f"http://127.0.0.1:{port}{path}").decode()


def wait_for_exporter(port: int, proc: subprocess.Popen[bytes], log: Path,
                      timeout: float = 60.0) -> bool:
    """Poll ``/metrics`` until it answers; False (and the log printed) if the exporter
    exited or the deadline passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            scrape(port)
            return True
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                print(log.read_text())
                return False
            time.sleep(0.2)


def start_detached_exporter(args: list[str], log: Path, env: dict[str, str]) -> int:
    """Start ``python -m stepscope serve ARGS`` detached from this process; its pid.

    A training script must not be the exporter's parent: stepscope counts a rank's child
    processes as its DataLoader workers (an idle child read as a blocked loader on the
    H200). ``sh`` starts it in the background and exits, so it is re-parented.
    """
    launcher = subprocess.run(
        ["sh", "-c", 'exec "$@" >"$LOG" 2>&1 </dev/null & echo $!', "sh", sys.executable,
         "-m", "stepscope", "serve", *args],
        env={**env, "LOG": str(log)}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(launcher.stdout.strip())


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_pid(pid: int, timeout: float = 15.0) -> None:
    """SIGTERM ``pid`` and wait (polling) until it is gone or ``timeout`` passes."""
    if pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
