"""Free loopback ports for the servers a test starts."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

_LOWEST = 20000  # below the kernel's ephemeral range, above the well-known services
_given: set[int] = set()
_lock = threading.Lock()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that nothing holds now (TCP, or UDP with ``SOCK_DGRAM``).

    The port is released before it is returned, for a process the test starts to bind
    next, seconds later at times (a DDP rank binds its rendezvous port after importing
    torch). A port the kernel picked (bind to port 0) lies in its ephemeral range, where
    any outgoing connection in between may take it: a DDP test failed that way now and
    then under load. So the port is taken below that range, where the kernel never
    places a connection, and none is handed out twice by this process.
    """
    high = _ephemeral_low()
    with _lock:
        if high - _LOWEST > 1000:
            for _ in range(200):
                port = random.randrange(_LOWEST, high)
                if port not in _given and _bindable(port, kind):
                    _given.add(port)
                    return port
        with socket.socket(socket.AF_INET, kind) as s:  # an odd range: the kernel's pick
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        _given.add(port)
        return port
