"""Attacks on the exporter's HTTP side, run as another user (``python -m
tests.support.http_attacks ...`` under ``setpriv``: see :mod:`tests.support.attacker`).
The standard library only. Each prints ``started`` once the attack is in place, then,
when its time is up or on SIGTERM, one JSON line: what the server answered.

- ``flood ADDRESS SECONDS THREADS [USER]``: THREADS threads send basic-auth requests
  back to back over keep-alive, each with a new random password and, without USER, a
  new random user name (a stranger guessing); with USER, that name (a stranger who
  knows it). ``started`` after 20 answers.
- ``idle ADDRESS SECONDS COUNT``: hold COUNT connections open and silent, opening a
  new one for each the server closes. ``started`` once COUNT are open.
"""

from __future__ import annotations

import base64
import http.client
import json
import secrets
import selectors
import signal
import socket
import sys
import threading
import time
from collections import Counter

# ``python -c`` code that runs this module's main with the arguments after it (what
# :func:`tests.support.attacker.spawn_as` runs as another user).
RUN = "import runpy; runpy.run_module('tests.support.http_attacks', run_name='__main__')"
# Set by SIGTERM: the attack ends early and still prints its report.
STOP = threading.Event()


def flood(address: str, seconds: float, threads: int, user: str | None = None) -> Counter[str]:
    """Send wrong credentials from ``threads`` threads for ``seconds``; answers by status
    (``error`` for a connection the server dropped)."""
    host, port = address.rsplit(":", 1)
    answers: Counter[str] = Counter()
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    announced = threading.Event()

    def one() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        while time.monotonic() < stop and not STOP.is_set():
            name = user or secrets.token_hex(6)
            token = base64.b64encode(f"{name}:{secrets.token_hex(8)}".encode()).decode()
            try:
                conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
                response = conn.getresponse()
                response.read()
                status = str(response.status)
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                status = "error"
            with lock:
                answers[status] += 1
                if sum(answers.values()) >= 20 and not announced.is_set():
                    announced.set()
                    print("started", flush=True)
        conn.close()

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return answers


def hold_idle(address: str, seconds: float, count: int) -> Counter[str]:
    """Hold ``count`` silent connections for ``seconds`` after opening them (or after 5 s
    of trying: a server may hold back the handshakes), replacing each one the server
    closes; counts opened, closed by the server, and failed connects."""
    host, port = address.rsplit(":", 1)
    selector = selectors.DefaultSelector()  # epoll: select() stops at fd 1024
    counts: Counter[str] = Counter()
    ready_by = time.monotonic() + 5.0
    stop = float("inf")
    while time.monotonic() < stop and not STOP.is_set():
        while len(selector.get_map()) < count and time.monotonic() < min(stop, ready_by):
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                counts["connect_failed"] += 1
                continue
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
            counts["opened"] += 1
        if stop == float("inf") and (
            len(selector.get_map()) >= count or time.monotonic() > ready_by
        ):
            stop = ready_by = time.monotonic() + seconds  # then replace what is closed
            print("started", flush=True)
        for key, _ in selector.select(0.05):  # readable: the server closed it
            selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
            counts["closed_by_server"] += 1
    counts["held_at_end"] = len(selector.get_map())
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return counts


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    kind, address, seconds = argv[0], argv[1], float(argv[2])
    if kind == "flood":
        result = flood(address, seconds, int(argv[3]), argv[4] if len(argv) > 4 else None)
    elif kind == "idle":
        result = hold_idle(address, seconds, int(argv[3]))
    else:
        raise SystemExit(f"unknown attack {kind!r}")
    print(json.dumps(dict(result)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
