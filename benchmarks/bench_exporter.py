"""Measure an exporter as Prometheus sees it: scrape latency, CPU, memory, size.

For each target (stepscope with N simulated GPUs, stepscope on the real GPUs, or a
peer exporter given as a command line) this starts the process, lets it settle,
then measures:

- sampling cost: the exporter's CPU seconds per wall second while nobody scrapes;
- scrape latency p50/p99 over sequential keep-alive scrapes with gzip (as Prometheus
  scrapes), and the exporter's CPU per scrape (CPU during the scrape loop minus the
  idle rate);
- RSS, series count and body size (plain and gzip).

Usage (from the repo root)::

    python -m benchmarks.bench_exporter --simulate 1 --simulate 8
    python -m benchmarks.bench_exporter --real \\
        --peer 'nvitop-exporter=python -m nvitop_exporter --bind-address 127.0.0.1 --port {port}'

Prints a Markdown table; ``--json FILE`` also writes the raw numbers.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from benchmarks._local import free_port
from tests.support import REPO


@dataclass
class Result:
    target: str
    gpus: str
    scrape_p50_ms: float
    scrape_p99_ms: float
    cpu_ms_per_scrape: float
    sampling_cpu_pct: float
    rss_mb: float
    series: int
    body_kb: float
    gzip_kb: float
    own_sample_cpu_ms_per_pass: float | None = None


def fetch(conn: http.client.HTTPConnection, path: str, gz: bool) -> bytes:
    conn.request("GET", path, headers={"Accept-Encoding": "gzip" if gz else "identity"})
    resp = conn.getresponse()
    body = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}")
    if resp.getheader("Content-Encoding") == "gzip":
        return gzip.decompress(body) if not gz else body
    return body


def wait_up(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exporter exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            fetch(conn, "/metrics", gz=False)
            conn.close()
            return
        except (OSError, RuntimeError):
            time.sleep(0.1)
    raise RuntimeError("exporter did not come up")


def cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return float(t.user + t.system)


def own_sampling_ms_per_pass(text: str) -> float | None:
    """Sum of stepscope_gpu_sample_cpu_seconds_total divided by passes so far."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("stepscope_gpu_sample_cpu_seconds_total{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total * 1e3 if found else None


def measure(name: str, gpus: str, cmd: list[str], port: int, scrapes: int, idle: float,
            settle: float, env: dict[str, str] | None = None) -> Result:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        wait_up(port, proc)
        ps = psutil.Process(proc.pid)
        time.sleep(settle)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(20):  # warm the connection and any lazy paths
            fetch(conn, "/metrics", gz=True)

        c0, w0 = cpu_seconds(ps), time.monotonic()
        time.sleep(idle)
        c1, w1 = cpu_seconds(ps), time.monotonic()
        idle_rate = (c1 - c0) / (w1 - w0)

        lat: list[float] = []
        c2, w2 = cpu_seconds(ps), time.monotonic()
        for _ in range(scrapes):
            t0 = time.perf_counter()
            fetch(conn, "/metrics", gz=True)
            lat.append(time.perf_counter() - t0)
        c3, w3 = cpu_seconds(ps), time.monotonic()
        scrape_cpu = max(0.0, (c3 - c2) - idle_rate * (w3 - w2)) / scrapes

        plain = fetch(http.client.HTTPConnection("127.0.0.1", port, timeout=10), "/metrics",
                      gz=False)
        text = plain.decode()
        series = sum(1 for ln in text.splitlines() if ln and not ln.startswith("#"))
        own = own_sampling_ms_per_pass(text)
        own_per_pass = None
        if own is not None:
            # CPU spent inside GPU reads since start, over the passes made since start
            interval = 1.0
            for line in text.splitlines():
                if line.startswith('stepscope_sampling_interval_seconds{tier="fast"}'):
                    interval = float(line.rsplit(" ", 1)[1])
            uptime = time.time() - ps.create_time()
            own_per_pass = own / max(1.0, uptime / interval)
        lat.sort()
        return Result(
            target=name,
            gpus=gpus,
            scrape_p50_ms=statistics.median(lat) * 1e3,
            scrape_p99_ms=lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
            cpu_ms_per_scrape=scrape_cpu * 1e3,
            sampling_cpu_pct=idle_rate * 100,
            rss_mb=ps.memory_info().rss / 1e6,
            series=series,
            body_kb=len(plain) / 1e3,
            gzip_kb=len(gzip.compress(plain, 1)) / 1e3,
            own_sample_cpu_ms_per_pass=own_per_pass,
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def stepscope_cmd(port: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "stepscope", "serve", "--listen", f"127.0.0.1:{port}",
            "--log-level", "warning", *extra]


def main() -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulate", type=int, action="append", default=[],
                    help="measure stepscope with N simulated GPUs (repeatable)")
    ap.add_argument("--real", action="store_true", help="measure stepscope on the real GPUs")
    ap.add_argument("--peer", action="append", default=[],
                    help="NAME=COMMAND for a peer exporter; {port} is replaced")
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds to measure idle CPU")
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not (args.simulate or args.real or args.peer):
        args.simulate = [1, 8]

    env = {"PYTHONPATH": str(REPO / "exporter") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results: list[Result] = []
    for n in args.simulate:
        port = free_port()
        results.append(measure("stepscope (simulated)", str(n),
                               stepscope_cmd(port, ["--simulate", str(n)]), port,
                               args.scrapes, args.idle, args.settle, env))
    if args.real:
        port = free_port()
        results.append(measure("stepscope (NVML)", "real", stepscope_cmd(port, []), port,
                               args.scrapes, args.idle, args.settle, env))
    for spec in args.peer:
        name, _, command = spec.partition("=")
        port = free_port()
        cmd = shlex.split(command.replace("{port}", str(port)))
        results.append(measure(name, "real", cmd, port, args.scrapes, args.idle, args.settle))

    print("| target | GPUs | scrape p50 ms | scrape p99 ms | CPU ms/scrape | sampling CPU % "
          "of a core | own GPU-read CPU ms/pass | RSS MB | series | body KB | gzip KB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        own = f"{r.own_sample_cpu_ms_per_pass:.2f}" if r.own_sample_cpu_ms_per_pass else "-"
        print(f"| {r.target} | {r.gpus} | {r.scrape_p50_ms:.2f} | {r.scrape_p99_ms:.2f} | "
              f"{r.cpu_ms_per_scrape:.3f} | {r.sampling_cpu_pct:.2f} | {own} | "
              f"{r.rss_mb:.1f} | {r.series} | {r.body_kb:.1f} | {r.gzip_kb:.1f} |")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
