"""What the framework integration tests share: run one workload on 2 gloo ranks under
a given driver (tests/workers/integration_worker.py), and read back per rank what a
real exporter serves for the job, to compare a framework's run with the plain loop's.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stepscope.shared.datagram import PHASES
from tests.support import Exporter, parse_samples, start_exporter, wait_for
from tests.support.collector import Collector
from tests.workers.integration_worker import FLOPS_PER_TOKEN, TOKENS, launch

STEPS, WARMUP = 12, 3
MEASURED = STEPS - WARMUP
COLLATE_SLEEP = 0.03  # a loader slower than the tiny step: data wait dominates
# configured fp32 peak of the simulated GPUs (every run reports fp32), so MFU is served
PEAK = 1e12
MODEL = "NVIDIA H100 80GB HBM3"


def exporter(tmp: Path) -> tuple[Exporter, str, dict[str, str]]:
    """A simulated 2-GPU exporter, its ingest URL and its GPUs' UUIDs by index."""
    ingest = f"unix://{tmp}/ingest.sock"
    peaks = json.dumps({MODEL: {"fp32": PEAK}})
    exp = start_exporter(["--simulate", "2", "--ingest", ingest, "--mfu-window", "120"],
                         env={"STEPSCOPE_PEAK_FLOPS": peaks})
    fams = parse_samples(exp.metrics())
    return exp, ingest, {lbl["gpu"]: lbl["UUID"] for lbl, _ in fams["stepscope_gpu_up"]}


def run_ranks(mode: str, job: str, ingest: str, uuids: dict[str, str], tmp: Path,
              ranks: int = 2, collate_sleep: float = COLLATE_SLEEP) -> list[dict[str, Any]]:
    """Run ``mode`` on ``ranks`` worker processes; their result lines, by rank."""
    result = tmp / f"{job}.jsonl"
    for attempt in (1, 2):
        result.unlink(missing_ok=True)
        procs = launch(mode, job, result, ingest, ranks=ranks, steps=STEPS,
                       collate_sleep=collate_sleep, uuids=uuids)
        outputs = [p.communicate(timeout=240)[0] for p in procs]
        if attempt == 1 and any(p.returncode < 0 for p in procs):
            # a rank killed by a signal: torch's own abort under a loaded CI machine
            # ("terminate called without an active exception" from gloo's threads, once
            # in ~8 suite runs), not a Python error of ours (those exit 1 with their
            # traceback and fail at once). Run the job again once, as a launcher would;
            # its new processes take the ranks over. A second abort fails.
            print(f"{mode}: a rank was killed by a signal, running the job again:",
                  *(f"rank {i} exited {p.returncode}: {out[-2000:]}"
                    for i, (p, out) in enumerate(zip(procs, outputs, strict=True))),
                  sep="\n", file=sys.stderr)  # fmt: skip
            continue
        break
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-6000:]
    lines = [json.loads(x) for x in result.read_text().splitlines()]
    return sorted(lines, key=lambda r: r["rank"])


@dataclass
class Served:
    """What /metrics serves for one rank of one job."""

    steps: float
    warmup: float
    tokens: float
    flops: float
    count: float
    seconds: float
    phases: dict[str, float]
    mfu: float | None
    mfu_status: str | None


def served(exp: Exporter, job: str, ranks: int = 2) -> dict[str, Served]:
    """Per rank, once every rank's steps have all arrived."""

    def one(fams: dict[str, list[tuple[dict[str, str], float]]], name: str, rank: str,
            **match: str) -> float | None:
        for lbl, v in fams.get(name, []):
            # the training job's label: "training_job" (Prometheus owns "job")
            if lbl.get("training_job", lbl.get("job")) == job and lbl.get("rank") == rank and all(
                    lbl.get(k) == w for k, w in match.items()):
                return v
        return None

    def arrived() -> dict[str, list[tuple[dict[str, str], float]]] | None:
        fams = parse_samples(exp.metrics())
        done = all(one(fams, "stepscope_steps_total", str(r)) == STEPS for r in range(ranks))
        return fams if done else None

    fams = wait_for(arrived, timeout=30)
    out = {}
    for r in map(str, range(ranks)):
        phases = {p: one(fams, "stepscope_step_phase_seconds_total", r, phase=p) for p in PHASES}
        assert all(v is not None for v in phases.values()), (job, r, phases)
        out[r] = Served(
            steps=one(fams, "stepscope_steps_total", r) or 0.0,
            warmup=one(fams, "stepscope_warmup_steps_total", r) or 0.0,
            tokens=one(fams, "stepscope_tokens_total", r) or 0.0,
            flops=one(fams, "stepscope_model_flops_total", r) or 0.0,
            count=one(fams, "stepscope_step_duration_seconds_count", r) or 0.0,
            seconds=one(fams, "stepscope_step_duration_seconds_sum", r) or 0.0,
            phases={p: float(v or 0.0) for p, v in phases.items()},
            mfu=one(fams, "stepscope_mfu_ratio", r),
            mfu_status=next((lbl.get("mfu_status") for lbl, _ in
                             fams.get("stepscope_training_rank_info", [])
                             if lbl.get("training_job", lbl.get("job")) == job
                             and lbl.get("rank") == r), None),
        )
    return out


def assert_same_series(plain: dict[str, Served], framework: dict[str, Served],
                       comm: bool = True) -> None:
    """The framework's run serves what the plain loop's serves for the same workload:
    the same steps, warm-up, tokens and FLOPs; every phase, summing to the step time;
    the slow loader as data wait; gradient communication as comm."""
    for rank in ("0", "1"):
        for run in (plain[rank], framework[rank]):
            assert (run.steps, run.warmup, run.count) == (STEPS, WARMUP, MEASURED)
            assert run.tokens == MEASURED * TOKENS
            assert run.flops == pytest.approx(MEASURED * TOKENS * FLOPS_PER_TOKEN)
            assert sum(run.phases.values()) == pytest.approx(run.seconds, rel=1e-6)
            assert run.phases["data_wait"] >= 0.8 * COLLATE_SLEEP * MEASURED
            assert run.phases["data_wait"] > max(run.phases["compute"], run.phases["other"])
            assert run.phases["compute"] > 0
            if comm:
                assert run.phases["comm"] > 0
            assert run.mfu is not None, run.mfu_status
            assert run.mfu == pytest.approx(run.flops / run.seconds / PEAK, rel=0.2)
        # the same workload takes about the same time and data wait either way
        p, f = plain[rank], framework[rank]
        assert f.phases["data_wait"] == pytest.approx(p.phases["data_wait"], rel=0.35)


@contextmanager
def datagrams() -> Iterator[tuple[Collector, str]]:
    """A Unix socket collecting the datagrams of in-process runs, and its ingest URL."""
    tmp = tempfile.mkdtemp(prefix="ss-int-")
    col = Collector(os.path.join(tmp, "ingest.sock"))
    try:
        yield col, f"unix://{tmp}/ingest.sock"
    finally:
        col.close()
        shutil.rmtree(tmp, ignore_errors=True)


def received(col: Collector, n: int) -> list[dict[str, Any]]:
    """The step datagrams, by step, once ``n`` have arrived (not the tail: the spans a
    rank names after its last step, when its reporter closes)."""

    def steps() -> list[dict[str, Any]]:
        return [d for d in col.got if d.get("type") == "step"]

    wait_for(lambda: len(steps()) >= n, timeout=10)
    return sorted(steps(), key=lambda d: d["step"])
