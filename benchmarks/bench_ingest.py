"""Sustained ingest rate of a running exporter, with zero loss, and the per-datagram cost.

Three measurements:

- ``in-process``: parse + validate + aggregate per datagram, no socket (the floor);
- ``unix``: N datagrams from 8 simulated ranks over the Unix socket, blocking sends so
  the sender goes exactly as fast as the exporter keeps up (a full queue makes the
  sender wait instead of dropping); the rate is N over the time until the exporter
  counts all N in ``stepscope_ingest_datagrams_total``; lost = N - accepted;
- ``udp``: the same over UDP on loopback, paced at ``--udp-rate``; UDP drops silently
  when the receiver's buffer is full, so lost > 0 means the rate was not sustained.

The exporter's CPU during each run (``cpu %``, of one core) shows the headroom.

Usage (from the repo root)::

    python -m benchmarks.bench_ingest                 # N = 500,000
    python -m benchmarks.bench_ingest -n 1000000 --udp-rate 50000

Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks._local import free_port
from tests.support import REPO

RANKS = 8


@dataclass
class Row:
    transport: str
    datagrams: int
    accepted: int
    seconds: float
    cpu_pct: float | None

    @property
    def rate(self) -> float:
        return self.accepted / self.seconds if self.seconds else 0.0


def messages(uuid: str = "GPU-00000000-0000-0000-0000-000000000000") -> list[bytes]:
    """One realistic datagram per rank (what the SDK sends), pre-encoded. The pid is this
    process's: the exporter checks it against the sender's pid the kernel reports."""
    now = time.time()
    return [
        json.dumps(
            {"v": 1, "type": "step", "job": "bench-llama", "rank": r, "local_rank": r,
             "world_size": RANKS, "pid": os.getpid(), "uuid": uuid, "step": 12345,
             "warmup": False, "t": now, "dur": 0.512, "data": 0.011, "compute": 0.45,
             "comm": 0.031, "tokens": 16384, "flops": 1.2e15, "precision": "bf16",
             "dropped": 0},
            separators=(",", ":"),
        ).encode()
        for r in range(RANKS)
    ]


def in_process(n: int) -> Row:
    from stepscope.ingest.aggregate import Aggregator
    from stepscope.shared.datagram import Limits, StepRecord, parse_datagram

    agg = Aggregator()
    limits = Limits()
    msgs = messages()
    start = time.perf_counter()
    for i in range(n):
        rec = parse_datagram(msgs[i % RANKS], limits)
        if isinstance(rec, StepRecord):
            agg.add(rec)
    seconds = time.perf_counter() - start
    return Row("in-process (parse+aggregate)", n, agg.view().accepted, seconds, None)


class Exporter:
    def __init__(self, ingest: str) -> None:
        self.port = free_port(socket.SOCK_STREAM)
        env = {**os.environ, "PYTHONPATH": str(REPO / "exporter")}
        env.pop("STEPSCOPE_CONFIG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepscope", "serve", "--simulate", "1",
             "--listen", f"127.0.0.1:{self.port}", "--ingest", ingest, "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.accepted()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the exporter did not start")

    def accepted(self) -> int:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("stepscope_ingest_datagrams_total "):
                    return int(float(line.split()[1]))
        return 0

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def wait_accepted(self, n: int, timeout: float = 60.0) -> tuple[int, float]:
        """Poll until n are accepted or nothing moves for a while; (accepted, when)."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.perf_counter()
        while time.monotonic() < deadline:
            got = self.accepted()
            now = time.perf_counter()
            if got >= n:
                return got, now
            if got != last:
                last, last_change = got, now
            elif now - last_change > 3.0:
                return got, last_change
            time.sleep(0.01)
        return last, time.perf_counter()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)


def over_unix(n: int) -> Row:
    tmp = Path(tempfile.mkdtemp(prefix="ssb-", dir="/tmp"))
    path = tmp / "ingest.sock"
    exp = Exporter(f"unix://{path}")
    try:
        msgs = messages()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.connect(str(path))  # blocking: waits while the exporter's queue is full
        send = sock.send
        cpu0 = exp.cpu()
        start = time.perf_counter()
        for i in range(n):
            send(msgs[i % RANKS])
        accepted, end = exp.wait_accepted(n)
        cpu = exp.cpu() - cpu0
        sock.close()
        return Row("unix (blocking sender)", n, accepted, end - start, 100 * cpu / (end - start))
    finally:
        exp.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def over_udp(n: int, rate: float) -> Row:
    port = free_port(socket.SOCK_DGRAM)
    exp = Exporter(f"udp://127.0.0.1:{port}")
    try:
        msgs = messages()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect(("127.0.0.1", port))
        send = sock.send
        cpu0 = exp.cpu()
        start = time.perf_counter()
        batch = 500  # pace in batches: one clock read per 500 sends
        for i in range(0, n, batch):
            for j in range(i, min(i + batch, n)):
                send(msgs[j % RANKS])
            ahead = (i + batch) / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
        accepted, end = exp.wait_accepted(n)
        cpu = exp.cpu() - cpu0
        sock.close()
        label = f"udp (paced at {rate:,.0f}/s)"
        return Row(label, n, accepted, end - start, 100 * cpu / (end - start))
    finally:
        exp.stop()


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=500_000, help="datagrams per run")
    parser.add_argument("--udp-rate", type=float, default=50_000.0, help="UDP send rate")
    args = parser.parse_args()
    rows = [in_process(args.n), over_unix(args.n), over_udp(args.n, args.udp_rate)]
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {RANKS} ranks, "
          f"{len(messages()[0])}-byte datagrams\n")
    print("| run | sent | accepted | lost | seconds | datagrams/s | µs/datagram | exporter cpu % |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        cpu = f"{r.cpu_pct:.0f}" if r.cpu_pct is not None else ""
        us = 1e6 * r.seconds / r.accepted if r.accepted else float("nan")
        print(f"| {r.transport} | {r.datagrams:,} | {r.accepted:,} | {r.datagrams - r.accepted:,} "
              f"| {r.seconds:.2f} | {r.rate:,.0f} | {us:.1f} | {cpu} |")


if __name__ == "__main__":
    main()
