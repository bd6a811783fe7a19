"""Helpers the benchmark scripts share: free loopback ports and plain HTTP GETs.

The scripts run as ``python benchmarks/NAME.py``, so this module is importable as a
sibling (``from _local import free_port``).
"""

from __future__ import annotations

import socket
import urllib.request


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
