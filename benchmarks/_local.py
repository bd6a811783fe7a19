"""Helpers the benchmark scripts share: free loopback ports and plain HTTP GETs.

The scripts run as ``python benchmarks/NAME.py``, so this module is importable as a
sibling (``from _local import free_port``).
"""

from __future__ import annotations

import socket
import subprocess
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
