"""Free loopback ports for the servers a test starts."""

from __future__ import annotations

import socket


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port on 127.0.0.1 that nothing holds now (TCP, or UDP with ``SOCK_DGRAM``).

    The port is released before it is returned: a process the test starts binds it
    next, and a test that may race another binder retries on its own.
    """
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
