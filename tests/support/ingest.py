"""Steps as the SDK sends them, and the training series as the exporter serves them."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from tests.support import Exporter, parse_samples

H100_BF16 = 989.4e12

Samples = dict[str, list[tuple[dict[str, str], float]]]


def step(job: str, rank: int, i: int, t: float, uuid: str | None, **extra: Any) -> dict[str, Any]:
    # pid: this process's, as the SDK sends it (the exporter checks it against the kernel's)
    obj: dict[str, Any] = {
        "v": 1, "type": "step", "job": job, "rank": rank, "local_rank": rank, "world_size": 2,
        "pid": os.getpid(), "step": i, "t": t, "dur": 1.0, "data": 0.25, "compute": 0.5,
        "comm": 0.125, "tokens": 4096, "flops": 0.4 * H100_BF16, "warmup": False,
    }
    if uuid is not None:
        obj["uuid"] = uuid
    obj.update(extra)
    return obj


Datagrams = Iterable[tuple[dict[str, Any], tuple[str, int]]]


class UdpSteps:
    """A thread that sends step datagrams over UDP every ``period`` seconds until
    stopped: ``datagrams(n)`` gives the (datagram, (host, port)) pairs of round ``n``."""

    def __init__(self, period: float, datagrams: Callable[[int], Datagrams]) -> None:
        self.period, self.datagrams = period, datagrams
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            n = 0
            while not self.stopped.is_set():
                for obj, addr in self.datagrams(n):
                    sock.sendto(json.dumps(obj).encode(), addr)
                n += 1
                self.stopped.wait(self.period)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def scrape(exp: Exporter) -> Samples:
    return parse_samples(exp.metrics())


def value(fams: Samples, name: str, **labels: str) -> float | None:
    for lbl, v in fams.get(name, []):
        if all(lbl.get(k) == want for k, want in labels.items()):
            return v
    return None


# The uid of nobody: an attacker who is not the exporter's user.
NOBODY = 65534
