"""A long soak of a real exporter under churn and abuse: scrape latency, memory, CPU.

    python -m benchmarks.bench_soak [--minutes 30] [--ranks 512] [--hostile-rate 5000]
                                    [--idle 200] [--warmup 5]

What runs, all against one ``stepscope serve --simulate 8 --ingest unix://...``:

- **training churn**: ``--ranks`` SDK-like ranks in jobs of 64, each job a process of its
  own sending one step per rank per second over the Unix socket; a job runs 2 to 6
  minutes, then its process ends and a new job (a new name) takes its slot 5 to 20 s
  later, so ranks finish, go silent and expire (``rank_expiry`` 60 s, ``max_jobs`` 16:
  finished jobs linger beside the live ones until they expire);
- **a hostile sender** (same uid: the socket lets it in) at ``--hostile-rate`` datagrams
  a second: random bytes, JSON that is not an object, oversize datagrams, schema
  violations, and forged steps for the live jobs' ranks (claiming the job's pid:
  ``bad_pid``; or its own: ``not_owner``);
- ``--idle`` **idle TCP connections** held open against the HTTP port, each one
  reopened as soon as the exporter closes it;
- **a scraper**: ``/metrics`` every second (gzip accepted, keep-alive, as Prometheus
  scrapes), ``/api/v1/diagnosis`` every 30 s and ``/`` every 60 s.

It prints a line a minute and at the end a table: scrape latency p50/p99/max (after the
warm-up), the exporter's RSS at start, after ``--warmup`` minutes and at the end, and its
growth as a trend (sampled every 5 s: the median over the last stretch minus that over
the first after the warm-up), its CPU share of one core after the warm-up (from
/proc), the datagrams the hostile sender sent and the exporter counted as rejected, the
idle connections reopened, and the machine's load average.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import re
import selectors
import socket
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._local import (
    ServedExporter,
    TrainingJobs,
    gpu_uuids,
    load_average,
    scrape,
)

JOB_RANKS = 64
CONFIG = "rank_expiry: 60\nmax_jobs: 16\n"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


# ---------------------------------------------------------------- the hostile sender


def _hostile(path: str, rate: float, seconds: float, targets: Any, counts: Any) -> None:
    """Sends garbage and forged datagrams at ``rate`` a second for ``seconds``."""
    rng = random.Random(1)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.connect(path)
    sock.setblocking(False)
    me = os.getpid()

    def forged() -> bytes:
        job, pid = "job-0", me
        with targets.get_lock():
            raw = bytes(targets[:]).split(b"\0", 1)[0].decode()
        if raw:
            job, _, p = rng.choice(raw.split(";")).partition(":")
            pid = int(p) if rng.random() < 0.5 else me  # the job's pid, or its own
        return json.dumps({
            "v": 1, "type": "step", "job": job, "rank": rng.randrange(JOB_RANKS),
            "local_rank": 0, "world_size": JOB_RANKS, "pid": pid, "step": 1, "warmup": False,
            "t": time.time(), "dur": 1000.0, "data": 999.0, "compute": 0.5, "comm": 0.1,
            "tokens": 1, "flops": 1.0, "precision": "bf16", "dropped": 0,
        }).encode()  # fmt: skip

    kinds = [
        lambda: rng.randbytes(rng.randrange(1, 600)),
        lambda: b"[1, 2, 3]",
        lambda: b"x" * 70_000,
        lambda: json.dumps({"v": 1, "type": "step", "job": "j", "rank": -1}).encode(),
        lambda: json.dumps({"v": 9, "type": "step"}).encode(),
        forged,
        forged,
    ]
    start = time.monotonic()
    sent = full = 0
    batch = max(1, int(rate / 100))  # a burst every 10 ms
    tick = 0
    while time.monotonic() - start < seconds:
        for _ in range(batch):
            try:
                sock.send(rng.choice(kinds)())
                sent += 1
            except BlockingIOError:
                full += 1  # the exporter's queue is full: this one is lost, as a flood's is
            except OSError:
                full += 1
        tick += 1
        ahead = start + tick * batch / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        if tick % 100 == 0:
            with counts.get_lock():
                counts[0] += sent
                counts[1] += full
            sent = full = 0
    with counts.get_lock():
        counts[0] += sent
        counts[1] += full


# ---------------------------------------------------------------- idle connections


class IdleConnections(threading.Thread):
    """Holds ``n`` TCP connections that never send a byte; reopens each one closed."""

    def __init__(self, port: int, n: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.n = n
        self.reopened = 0
        self.failed = 0
        self.stop = threading.Event()
        self._sel = selectors.DefaultSelector()

    def _open(self) -> None:
        s = socket.socket()
        try:
            s.connect(("127.0.0.1", self.port))
        except OSError:
            self.failed += 1
            s.close()
            return
        self._sel.register(s, selectors.EVENT_READ)

    def run(self) -> None:
        for _ in range(self.n):
            self._open()
        while not self.stop.is_set():
            for key, _ in self._sel.select(timeout=0.5):
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:  # closed by the exporter: hold another one
                    self._sel.unregister(s)
                    s.close()
                    self.reopened += 1
            missing = self.n - len(self._sel.get_map())
            for _ in range(missing):
                self._open()
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


# ---------------------------------------------------------------- the scraper


@dataclass
class Scrapes:
    metrics: list[float] = field(default_factory=list)  # seconds, after the warm-up
    api: list[float] = field(default_factory=list)
    page: list[float] = field(default_factory=list)
    failures: int = 0
    body: bytes = b""
    slow: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, s) > 10 ms


def scraper(port: int, stop: threading.Event, warm: threading.Event, out: Scrapes) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    tick = 0
    start = time.monotonic()
    while not stop.is_set():
        tick += 1
        paths = ["/metrics"]
        if tick % 30 == 0:
            paths.append("/api/v1/diagnosis")
        if tick % 60 == 0:
            paths.append("/")
        for path in paths:
            t0 = time.perf_counter()
            try:
                conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
            except (OSError, http.client.HTTPException):
                out.failures += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                continue
            elapsed = time.perf_counter() - t0
            if warm.is_set() and path == "/metrics" and elapsed > 0.010:
                out.slow.append((time.monotonic(), elapsed))
            if warm.is_set():
                {"/metrics": out.metrics, "/api/v1/diagnosis": out.api, "/": out.page}[
                    path
                ].append(elapsed)
            if path == "/metrics":
                out.body = body
        stop.wait(max(0.0, start + tick - time.monotonic()))


def counter_sum(text: str, name: str) -> float:
    """Sum of a family's samples in exposition ``text``."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


# ---------------------------------------------------------------- the soak


def soak(minutes: float, ranks: int, hostile_rate: float, idle: int, warmup_min: float
         ) -> dict[str, Any]:  # fmt: skip
    import multiprocessing

    cfg_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    cfg = cfg_dir / f"stepscope-soak-{os.getpid()}.yaml"
    cfg.write_text(CONFIG)
    exporter = ServedExporter(8, extra=["--config", str(cfg)])
    rng = random.Random(2)
    mp = multiprocessing.get_context("fork")
    targets = mp.Array("c", 4096)  # "job:pid;..." of the live jobs, for forged datagrams
    hostile_counts = mp.Array("q", 2)
    jobs = TrainingJobs(exporter.socket, gpu_uuids(exporter.port))
    idlers = IdleConnections(exporter.port, idle)
    scrapes = Scrapes()
    stop, warm = threading.Event(), threading.Event()
    scrape_thread = threading.Thread(target=scraper, args=(exporter.port, stop, warm, scrapes),
                                     daemon=True)  # fmt: skip
    rss_start = exporter.rss_bytes()
    hostile = mp.Process(target=_hostile, daemon=True, args=(
        exporter.socket, hostile_rate, minutes * 60 + 5, targets, hostile_counts))  # fmt: skip
    slots = ranks // JOB_RANKS
    ends: dict[str, float] = {}  # job -> when it finishes
    waiting: list[float] = []  # when an empty slot takes a new job
    events: list[tuple[float, str]] = []  # (monotonic, what): job starts and ends
    t0 = time.monotonic()
    result: dict[str, Any] = {}
    try:
        for _ in range(slots):
            name = f"job-{jobs.started}"
            jobs.start(name, JOB_RANKS)
            events.append((t0, f"{name} started"))
            ends[name] = t0 + rng.uniform(120, 360)
        idlers.start()
        scrape_thread.start()
        if hostile_rate > 0:
            hostile.start()
        warm_at = t0 + warmup_min * 60
        end_at = t0 + minutes * 60
        next_report = t0 + 60
        rss_warm = cpu_warm = None
        warm_time = 0.0
        loads: list[float] = []
        rss_samples: list[int] = []
        trend: list[tuple[float, int]] = []  # (time, RSS) every 5 s after the warm-up
        next_trend = warm_at
        print("| minute | RSS MiB | CPU % (last minute) | scrape p99 ms (last minute) | jobs "
              "live | load average |")
        print("|---|---|---|---|---|---|", flush=True)
        last_cpu, last_t, last_n = exporter.cpu_seconds(), t0, 0
        while (now := time.monotonic()) < end_at:
            for name, when in list(ends.items()):
                if now >= when:
                    jobs.finish(name)
                    events.append((now, f"{name} ended"))
                    del ends[name]
                    waiting.append(now + rng.uniform(5, 20))
            for when in [w for w in waiting if now >= w]:
                waiting.remove(when)
                name = f"job-{jobs.started}"
                jobs.start(name, JOB_RANKS)
                events.append((now, f"{name} started"))
                ends[name] = now + rng.uniform(120, 360)
            live = ";".join(f"{j}:{p.pid}" for j, p in jobs.live.items()).encode()[:4000]
            with targets.get_lock():
                targets[: len(live) + 1] = live + b"\0"
            if rss_warm is None and now >= warm_at:
                rss_warm, cpu_warm, warm_time = exporter.rss_bytes(), exporter.cpu_seconds(), now
                warm.set()
            if now >= next_trend:
                next_trend += 5.0
                trend.append((now, exporter.rss_bytes()))
            if now >= next_report:
                next_report += 60
                cpu = exporter.cpu_seconds()
                recent = scrapes.metrics[last_n:]
                last_n = len(scrapes.metrics)
                loads.append(load_average()[0])
                rss_samples.append(exporter.rss_bytes())
                p99 = f"{1e3 * percentile(recent, 0.99):.1f}" if recent else "(warm-up)"
                print(f"| {(now - t0) / 60:.0f} | {rss_samples[-1] / 2**20:.1f} | "
                      f"{100 * (cpu - last_cpu) / (now - last_t):.1f} | {p99} | {len(jobs.live)} "
                      f"| {loads[-1]:.1f} |", flush=True)  # fmt: skip
                last_cpu, last_t = cpu, now
            time.sleep(0.5)
        rss_end = exporter.rss_bytes()
        cpu_end = exporter.cpu_seconds()
        end_time = time.monotonic()
        stop.set()
        scrape_thread.join(15)
        text = scrape(exporter.port)
        assert rss_warm is not None and cpu_warm is not None
        m = scrapes.metrics
        result = {
            "minutes": minutes, "ranks": ranks, "scrapes": len(m),
            "p50_ms": 1e3 * statistics.median(m) if m else float("nan"),
            "p99_ms": 1e3 * percentile(m, 0.99), "max_ms": 1e3 * max(m, default=float("nan")),
            "over_10ms": sum(x > 0.010 for x in m),
            "slow": [(t - t0, x, [f"{what} {t - at:.0f} s before" for at, what in events
                                  if 0 <= t - at <= 70]) for t, x in scrapes.slow],
            "api_p50_ms": 1e3 * statistics.median(scrapes.api) if scrapes.api else float("nan"),
            "api_max_ms": 1e3 * max(scrapes.api, default=float("nan")),
            "page_p50_ms": 1e3 * statistics.median(scrapes.page) if scrapes.page else float("nan"),
            "page_max_ms": 1e3 * max(scrapes.page, default=float("nan")),
            "failures": scrapes.failures,
            "rss_start_mib": rss_start / 2**20, "rss_warm_mib": rss_warm / 2**20,
            "rss_end_mib": rss_end / 2**20, "growth_mib": (rss_end - rss_warm) / 2**20,
            "rss_max_mib": max(rss_samples, default=rss_end) / 2**20,
            **rss_trend(trend),
            "cpu_pct": 100 * (cpu_end - cpu_warm) / (end_time - warm_time),
            "hostile_sent": int(hostile_counts[0]), "hostile_queue_full": int(hostile_counts[1]),
            "rejected": counter_sum(text, "stepscope_ingest_rejected_total"),
            "by_reason": {
                reason: float(v) for reason, v in re.findall(
                    r'^stepscope_ingest_rejected_total\{reason="([^"]+)"\} (\S+)$', text, re.M)
                if float(v)
            },
            "accepted": counter_sum(text, "stepscope_ingest_datagrams_total"),
            "kernel_dropped": counter_sum(text, "stepscope_ingest_kernel_dropped_total"),
            "http_rejected": counter_sum(text, "stepscope_http_connections_rejected_total"),
            "jobs_started": jobs.started, "job_datagrams": jobs.sent,
            "job_queue_full": jobs.blocked, "idle_reopened": idlers.reopened,
            "idle_failed": idlers.failed,
            "series": sum(1 for ln in text.splitlines() if ln and ln[0] != "#"),
            "load_mean": statistics.mean(loads) if loads else load_average()[0],
            "load_max": max(loads, default=0.0), "cpus": os.cpu_count(),
        }
        return result
    finally:
        stop.set()
        idlers.stop.set()
        if hostile.is_alive():
            hostile.terminate()
        hostile.join(5)
        jobs.stop()
        exporter.stop()
        cfg.unlink(missing_ok=True)


def rss_trend(trend: list[tuple[float, int]]) -> dict[str, float]:
    """RSS growth as a trend, not two instants: the median RSS over the last stretch of
    the run minus that over the first stretch after the warm-up (each 5 minutes, or a
    fifth of the run if shorter). A 6 MB body or a 9 MB status page alive at one sample
    moves an endpoint by that much; the medians see the working set."""
    if len(trend) < 2:
        return {"trend_first_mib": float("nan"), "trend_last_mib": float("nan"),
                "trend_growth_mib": float("nan"), "trend_min_mib": float("nan"),
                "trend_max_mib": float("nan")}  # fmt: skip
    span = min(300.0, (trend[-1][0] - trend[0][0]) / 5)
    first = [r for t, r in trend if t <= trend[0][0] + span]
    last = [r for t, r in trend if t >= trend[-1][0] - span]
    a, b = statistics.median(first) / 2**20, statistics.median(last) / 2**20
    return {"trend_first_mib": a, "trend_last_mib": b, "trend_growth_mib": b - a,
            "trend_min_mib": min(r for _, r in trend) / 2**20,
            "trend_max_mib": max(r for _, r in trend) / 2**20}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--ranks", type=int, default=512, help="live ranks (jobs of 64)")
    parser.add_argument("--hostile-rate", type=float, default=5000.0,
                        help="garbage and forged datagrams a second")  # fmt: skip
    parser.add_argument("--idle", type=int, default=200, help="idle TCP connections held")
    parser.add_argument("--warmup", type=float, default=5.0, help="minutes before measuring")
    args = parser.parse_args()
    warmup = min(args.warmup, args.minutes / 3)
    r = soak(args.minutes, args.ranks, args.hostile_rate, args.idle, warmup)
    print()
    print(f"{r['minutes']:g} min, {r['ranks']} ranks ({r['jobs_started']} jobs started), "
          f"{r['cpus']} CPUs, load average mean {r['load_mean']:.1f} (max {r['load_max']:.1f})")
    print()
    print("| measure | value | goal |")
    print("|---|---|---|")
    rows = [
        ("/metrics scrapes after warm-up (1/s, gzip)", f"{r['scrapes']}", ""),
        ("scrape p50 / p99 / max ms",
         f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} / {r['max_ms']:.1f}", "p99 < 10"),
        ("scrapes over 10 ms", f"{r['over_10ms']}", ""),
        ("failed requests", f"{r['failures']}", "0"),
        ("/api/v1/diagnosis p50 / max ms", f"{r['api_p50_ms']:.0f} / {r['api_max_ms']:.0f}", ""),
        ("/ (status page) p50 / max ms", f"{r['page_p50_ms']:.0f} / {r['page_max_ms']:.0f}", ""),
        ("RSS start / after warm-up / end MiB",
         f"{r['rss_start_mib']:.1f} / {r['rss_warm_mib']:.1f} / {r['rss_end_mib']:.1f}", ""),
        ("RSS end minus after warm-up MiB (max seen)",
         f"{r['growth_mib']:+.1f} ({r['rss_max_mib']:.1f})", ""),
        ("RSS every 5 s after warm-up: median first / last stretch MiB (band)",
         f"{r['trend_first_mib']:.1f} / {r['trend_last_mib']:.1f} "
         f"({r['trend_min_mib']:.1f}-{r['trend_max_mib']:.1f})", ""),
        ("RSS growth MiB (median last stretch minus first)",
         f"{r['trend_growth_mib']:+.1f}", "< 5 MB"),
        ("exporter CPU % of a core after warm-up", f"{r['cpu_pct']:.1f}", ""),
        ("series served at the end", f"{r['series']}", ""),
        ("training datagrams sent (queue full, waited)",
         f"{r['job_datagrams']:,} ({r['job_queue_full']:,})", ""),
        ("hostile datagrams sent (lost to a full queue)",
         f"{r['hostile_sent']:,} ({r['hostile_queue_full']:,})", ""),
        ("rejects counted by the exporter", f"{r['rejected']:,.0f}", "= hostile sent"),
        ("rejects by reason", ", ".join(f"{k} {v:,.0f}" for k, v in r["by_reason"].items()), ""),
        ("datagrams accepted / dropped by the kernel",
         f"{r['accepted']:,.0f} / {r['kernel_dropped']:,.0f}", ""),
        ("idle connections reopened (failed to open)",
         f"{r['idle_reopened']:,} ({r['idle_failed']})", ""),
        ("HTTP connections refused at the cap", f"{r['http_rejected']:,.0f}", ""),
    ]  # fmt: skip
    for name, value, goal in rows:
        print(f"| {name} | {value} | {goal} |")
    # when the slow scrapes came, and the churn before each (a job's ranks expire 60 s
    # after it ends): to tell a cause that recurs from noise
    print()
    print("Scrapes over 10 ms (seconds since start, ms, churn in the 70 s before):")
    for at, took, churn in r["slow"]:
        print(f"  {at:7.0f} s {1e3 * took:7.1f} ms  {'; '.join(churn) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
