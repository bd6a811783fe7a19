"""Cost of a sampling pass with the diagnosis, 8 to 512 ranks, windows 30 and 60 s.

    python benchmarks/bench_diagnosis.py [--ranks 8 64 256 512] [--windows 30 60]

A real sampler (simulated 8-GPU node, the ingest's aggregator fed StepRecords directly, the
diagnosis as its analysis stage) runs on a fake clock: each simulated second every rank
reports one step and the sampler makes one pass, so the window fills as in production
without waiting. After the window is full, it times the next passes: the whole pass
(reads, label schema, diagnosis, rendering) and the diagnosis alone (its health
duration), plus one rendering of ``/api/v1/diagnosis`` and of the status page (made once
per snapshot, whatever the request rate). "Core share at 1 s" is the pass time over the
default 1 s interval: the share of one core the exporter spends sampling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "exporter"))

from stepscope.core.sampler import Sampler, SamplerSettings
from stepscope.core.source import Registry
from stepscope.datagram import (
    Limits,
    StepRecord,
)
from stepscope.diagnose.analysis import DiagnosisAnalysis
from stepscope.diagnose.api import diagnosis_json
from stepscope.diagnose.page import status_page_html
from stepscope.diagnose.thresholds import Thresholds
from stepscope.gpu.simulated import SimulatedBackend, default_scenario
from stepscope.gpu.source import GpuSource
from stepscope.ingest.aggregate import Aggregator, TrainingSettings
from stepscope.ingest.source import IngestSource


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def measure(ranks: int, window: float, timed_passes: int = 10) -> dict[str, float]:
    clock = Clock()
    backend = SimulatedBackend(default_scenario(8), hostname="bench", clock=clock)
    uuids = [d.uuid for d in backend.devices()]
    jobs = max(1, ranks // 64)  # the default caps: 64 ranks per job
    agg = Aggregator(
        TrainingSettings(limits=Limits(max_jobs=max(8, jobs), max_ranks_per_job=64)),
        clock=clock,
    )
    diagnosis = DiagnosisAnalysis(Thresholds(window=window))
    registry = Registry()
    registry.register(GpuSource(backend))
    registry.register(IngestSource(agg))
    registry.register_analysis(diagnosis)
    sampler = Sampler(registry, SamplerSettings("bench", 1.0, 10.0), clock=clock,
                      wall_clock=lambda: 1.7e9 + clock.t)  # fmt: skip
    step = 0

    def one_second() -> float:
        nonlocal step
        clock.t += 1.0
        for r in range(ranks):
            agg.add(StepRecord(
                f"job-{r // 64}", r, r % 8, step, 1.7e9 + clock.t, 0.8, 0.1, 0.5, 0.15, 0.05,
                step < 2, 4096, 1e14, "bf16", ranks, 10_000 + r, uuids[r % 8], 0,
            ))  # fmt: skip
        step += 1
        t0 = time.perf_counter()
        sampler.sample_once()
        return time.perf_counter() - t0

    for _ in range(int(window) + 2):  # fill the window
        one_second()
    passes = [one_second() for _ in range(timed_passes)]
    latest = sampler.latest
    assert latest is not None
    diag_s = latest.snapshot.health["diagnosis"].duration_seconds
    t0 = time.perf_counter()
    body = diagnosis_json(latest, "ok")
    api_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    page = status_page_html(latest, "ok")
    page_s = time.perf_counter() - t0
    return {
        "ranks": ranks,
        "window": window,
        "pass_ms": statistics.median(passes) * 1e3,
        "pass_max_ms": max(passes) * 1e3,
        "diagnosis_ms": diag_s * 1e3,
        "api_ms": api_s * 1e3,
        "api_kb": len(body) / 1024,
        "page_ms": page_s * 1e3,
        "page_kb": len(page) / 1024,
        "core_share": statistics.median(passes),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 512])
    parser.add_argument("--windows", type=float, nargs="+", default=[30.0, 60.0])
    args = parser.parse_args()
    print("| ranks | window s | pass ms (median) | pass ms (max) | diagnosis ms | core share "
          "at 1 s | /api/v1/diagnosis ms, KB (once per pass) | status page ms, KB |")
    print("|---|---|---|---|---|---|---|---|")
    for window in args.windows:
        for ranks in args.ranks:
            r = measure(ranks, window)
            print(f"| {ranks} | {window:g} | {r['pass_ms']:.1f} | {r['pass_max_ms']:.1f} | "
                  f"{r['diagnosis_ms']:.1f} | {100 * r['core_share']:.1f}% | "
                  f"{r['api_ms']:.1f}, {r['api_kb']:.0f} | {r['page_ms']:.1f}, "
                  f"{r['page_kb']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
