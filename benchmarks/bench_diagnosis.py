"""Cost of a sampling pass with the diagnosis, 8 to 512 ranks, windows 30 and 60 s.

    python -m benchmarks.bench_diagnosis [--ranks 8 64 256 512] [--windows 30 60]

A real sampler (simulated 8-GPU node, the ingest's aggregator fed StepRecords directly, the
diagnosis as its analysis stage) runs on a fake clock: each simulated second every rank
reports one step and the sampler makes one pass, so the window fills as in production
without waiting. After the window is full, it times the next passes (median of
``--passes``): the whole pass as nobody reads it (reads, label schema, the window; above
64 ranks the verdicts only every 5 s), the diagnosis alone when it makes verdicts
(``DiagnosisAnalysis.run``), the rendering of each pass's ``/metrics`` (what a scrape of it
costs, made once per read), in text and in protobuf (what a Prometheus with native
histograms reads; its families built anew, as for a scraper that reads only protobuf), and
of the diagnosis's families within it, plus one rendering
of ``/api/v1/diagnosis`` and of the status page (made once per snapshot, whatever the
request rate), and the full collection the sampler runs once a minute (the collector
runs as under ``stepscope serve``: start-up objects frozen, the oldest generation never
collected on CPython's schedule). "Core share at 1 s" is the pass time over the default
1 s interval. Times are the sampling thread's CPU time (``time.thread_time``), not wall
time: on a shared machine the wall time also counts the moments other processes held
the CPU.

``--exporter SECONDS`` measures the whole exporter instead: a real ``stepscope serve
--simulate 8`` (diagnosis window per ``--windows``) with the largest ``--ranks`` SDK-like
ranks (jobs of 64, each job a process sending one step per rank per second over the Unix
ingest socket with the SDK's encoder), scraped every 15 s as Prometheus would (from the
start); after the window has filled, its CPU time from /proc over SECONDS, as a share of
one core.

``--host`` adds a scripted host source that reads a process for every rank (a distinct
pid each, with an affinity of 8 CPUs): the worst case for the host side of the verdicts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterable

from benchmarks._local import ServedExporter, TrainingJobs, gpu_uuids, load_average, scrape
from stepscope.core.exposition import Family
from stepscope.core.registry import Registry
from stepscope.core.sampler import (
    FULL_COLLECT_SECONDS,
    Sampler,
    SamplerSettings,
    full_collection,
    manage_collector,
    release_collector,
)
from stepscope.core.snapshot import Snapshot
from stepscope.core.source import ReadContext, Source
from stepscope.diagnose.analysis import DiagnosisAnalysis
from stepscope.diagnose.api import diagnosis_json
from stepscope.diagnose.model import Diagnosis
from stepscope.diagnose.page import status_page_html
from stepscope.diagnose.thresholds import Thresholds
from stepscope.gpu.simulated import SimulatedBackend, default_scenario
from stepscope.gpu.source import GpuSource
from stepscope.host.model import HOST_PART, HostReading, Pressure, ProcessReading
from stepscope.ingest.aggregate import Aggregator, TrainingSettings
from stepscope.ingest.source import IngestSource
from stepscope.shared.datagram import (
    Limits,
    StepRecord,
)


class TimedDiagnosis(DiagnosisAnalysis):
    """The diagnosis, timed in CPU time (the sampler's clock is the fake one)."""

    def __init__(self, thresholds: Thresholds) -> None:
        super().__init__(thresholds)
        self.run_s: list[float] = []
        self.families_s: list[float] = []

    def run(self, snapshot: Snapshot) -> Diagnosis:
        t0 = time.thread_time()
        result = super().run(snapshot)
        self.run_s.append(time.thread_time() - t0)
        return result

    def families(self, result: Diagnosis, snapshot: Snapshot) -> Iterable[Family]:
        t0 = time.thread_time()
        families = list(super().families(result, snapshot))
        self.families_s.append(time.thread_time() - t0)
        return families


class ScriptedHost(Source[HostReading]):
    """A host whose every rank's process is readable: 8 busy-ish CPUs per process."""

    key = HOST_PART

    def read(self, ctx: ReadContext) -> HostReading:
        cpus = 64
        procs = {
            r.pid: ProcessReading(r.pid, 1.0 + (r.rank % 7) / 10, 2, 0.4,
                                  tuple(range(8 * (r.rank % 8), 8 * (r.rank % 8) + 8)))
            for r in ctx.ranks if r.pid is not None
        }  # fmt: skip
        return HostReading(cpus, (0.3,) * cpus, 0.01, Pressure(0.05), Pressure(0.02), procs)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def measure(ranks: int, window: float, timed_passes: int = 20, host: bool = False
            ) -> dict[str, float]:  # fmt: skip
    clock = Clock()
    backend = SimulatedBackend(default_scenario(8), hostname="bench", clock=clock)
    uuids = [d.uuid for d in backend.devices()]
    jobs = max(1, ranks // 64)  # the default caps: 64 ranks per job
    agg = Aggregator(
        TrainingSettings(limits=Limits(max_jobs=max(8, jobs), max_ranks_per_job=64)),
        clock=clock,
    )
    diagnosis = TimedDiagnosis(Thresholds(window=window))
    registry = Registry()
    registry.register(GpuSource(backend))
    registry.register(IngestSource(agg))
    if host:
        registry.register(ScriptedHost())
    registry.register_analysis(diagnosis)
    sampler = Sampler(registry, SamplerSettings("bench", 1.0, 10.0), clock=clock,
                      wall_clock=lambda: 1.7e9 + clock.t)  # fmt: skip
    step = 0
    renders: list[float] = []
    proto_renders: list[float] = []

    def one_second() -> float:
        nonlocal step
        clock.t += 1.0
        for r in range(ranks):
            agg.add(StepRecord(
                f"job-{r // 64}", r, r % 8, step, 1.7e9 + clock.t, 0.8, 0.1, 0.5, 0.15, 0.05,
                step < 2, 4096, 1e14, "bf16", ranks, 10_000 + r, uuids[r % 8], 0,
            ))  # fmt: skip
        step += 1
        t0 = time.thread_time()
        published = sampler.sample_once()
        t1 = time.thread_time()
        published.render()  # what a scrape of this pass costs (not asking: no forecast)
        t2 = time.thread_time()
        renders.append(t2 - t1)
        published.render_protobuf()  # the same for a protobuf scraper
        proto_renders.append(time.thread_time() - t2)
        return t1 - t0

    # the collector as `stepscope serve` runs it: start-up objects frozen, the oldest
    # generation collected once a minute after a pass (timed on its own), never by
    # CPython's schedule
    saved = manage_collector()
    collections: list[float] = []
    try:
        for _ in range(int(window) + 2):  # fill the window
            one_second()
        del diagnosis.run_s[:], diagnosis.families_s[:], renders[:], proto_renders[:]
        passes = []
        for n in range(1, timed_passes + 1):
            passes.append(one_second())
            if n % int(FULL_COLLECT_SECONDS) == 0 or n == timed_passes:
                t0 = time.thread_time()
                full_collection()
                collections.append(time.thread_time() - t0)
    finally:
        release_collector(saved)
    latest = sampler.latest
    assert latest is not None
    t0 = time.thread_time()
    body = diagnosis_json(latest, "ok")
    api_s = time.thread_time() - t0
    t0 = time.thread_time()
    page = status_page_html(latest, "ok")
    page_s = time.thread_time() - t0
    return {
        "ranks": ranks,
        "window": window,
        "pass_ms": statistics.median(passes) * 1e3,
        "pass_max_ms": max(passes) * 1e3,
        "diagnosis_ms": statistics.median(diagnosis.run_s) * 1e3,
        "families_ms": statistics.median(diagnosis.families_s) * 1e3,
        "render_ms": statistics.median(renders) * 1e3,
        "render_kb": len(latest.render()) / 1024,
        "proto_ms": statistics.median(proto_renders) * 1e3,
        "proto_kb": len(latest.render_protobuf()) / 1024,
        "api_ms": api_s * 1e3,
        "api_kb": len(body) / 1024,
        "page_ms": page_s * 1e3,
        "page_kb": len(page) / 1024,
        "core_share": statistics.median(passes),
        "collect_ms": statistics.median(collections) * 1e3,
    }


def measure_exporter(ranks: int, window: float, seconds: float) -> dict[str, float]:
    """The real exporter's CPU share and RSS with ``ranks`` ranks reporting."""
    exporter = ServedExporter(8, env={"STEPSCOPE_DIAGNOSIS": json.dumps({"window": window})})
    jobs = TrainingJobs(exporter.socket, gpu_uuids(exporter.port))
    try:
        for j in range(max(1, ranks // 64)):
            jobs.start(f"job-{j}", min(64, ranks))
        # the window fills, every rank is in it; scraped as Prometheus would be from the
        # start (the exporter learns the scrape period and renders ahead of it)
        warm_until = time.monotonic() + window + 15
        while time.monotonic() < warm_until:
            scrape(exporter.port)
            time.sleep(min(15.0, max(0.0, warm_until - time.monotonic())))
        load0 = load_average()[0]
        sent0 = jobs.sent
        c0, t0 = exporter.cpu_seconds(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            scrape(exporter.port)
            time.sleep(min(15.0, max(0.0, seconds - (time.monotonic() - t0))))
        cpu = (exporter.cpu_seconds() - c0) / (time.monotonic() - t0)
        body = scrape(exporter.port)
        present = sum(1 for ln in body.splitlines() if ln.startswith("stepscope_bottleneck{")
                      and 'kind="compute"' in ln and 'rank="' in ln)  # fmt: skip
        return {
            "ranks": ranks, "window": window, "seconds": time.monotonic() - t0,
            "cpu_pct": 100 * cpu, "rss_mb": exporter.rss_bytes() / 2**20,
            "verdicts": present, "rate": (jobs.sent - sent0) / (time.monotonic() - t0),
            "blocked": jobs.blocked, "load": (load0 + load_average()[0]) / 2,
        }  # fmt: skip
    finally:
        jobs.stop()
        exporter.stop()


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 512])
    parser.add_argument("--windows", type=float, nargs="+", default=[30.0, 60.0])
    parser.add_argument("--passes", type=int, default=20, help="timed passes (median)")
    parser.add_argument("--host", action="store_true",
                        help="a host source reading one process per rank")  # fmt: skip
    parser.add_argument("--exporter", type=float, metavar="SECONDS",
                        help="measure a real exporter's CPU over SECONDS instead")
    args = parser.parse_args()
    if args.exporter:
        print("| ranks | window s | exporter CPU % of a core | RSS MiB | rank verdicts | "
              "datagrams/s | queue-full sends | load average | seconds |")
        print("|---|---|---|---|---|---|---|---|---|")
        for window in args.windows:
            e = measure_exporter(max(args.ranks), window, args.exporter)
            print(f"| {e['ranks']} | {window:g} | {e['cpu_pct']:.1f} | {e['rss_mb']:.0f} | "
                  f"{e['verdicts']:.0f} | {e['rate']:.0f} | {e['blocked']:.0f} | "
                  f"{e['load']:.1f} | {e['seconds']:.0f} |", flush=True)
        return 0
    print("| ranks | window s | pass ms (median) | pass ms (max) | diagnosis ms (when made) "
          "| its families ms | core share at 1 s | full collection ms (once a minute) | "
          "/metrics render ms, KB (once per read) | protobuf render ms, KB (once per read) | "
          "/api/v1/diagnosis ms, KB (once per pass) | status page ms, KB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for window in args.windows:
        for ranks in args.ranks:
            r = measure(ranks, window, args.passes, args.host)
            print(f"| {ranks} | {window:g} | {r['pass_ms']:.1f} | {r['pass_max_ms']:.1f} | "
                  f"{r['diagnosis_ms']:.1f} | {r['families_ms']:.1f} | "
                  f"{100 * r['core_share']:.1f}% | {r['collect_ms']:.1f} | "
                  f"{r['render_ms']:.1f}, {r['render_kb']:.0f} | "
                  f"{r['proto_ms']:.1f}, {r['proto_kb']:.0f} | "
                  f"{r['api_ms']:.1f}, {r['api_kb']:.0f} | {r['page_ms']:.1f}, "
                  f"{r['page_kb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
