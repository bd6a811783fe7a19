"""A datagram collector: a Unix socket read on a thread, standing in for the exporter."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any


class Collector:
    """Reads datagrams from a Unix socket on a thread until told to stop."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.got: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.got.append(json.loads(self.sock.recv(4096)))
            except TimeoutError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
