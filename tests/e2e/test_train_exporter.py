"""The whole training path for real: 2 DDP ranks (gloo) → SDK → exporter → /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, parse_samples, start_exporter, wait_for
from tests.support.ports import free_port

pytest.importorskip("torch")

STEPS, TOKENS, FPT = 24, 64, 1.5e6
PEAK = 1e12  # configured peak for the simulated model; CPU-sized so MFU stays below 1
MODEL = "NVIDIA H100 80GB HBM3"


def run_job(ingest: str, uuids: dict[str, str], job: str, delay: float,
            collate_sleep: float = 0.0) -> None:
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "exporter")}
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "workers" / "ddp_worker.py"), ingest,
             uuids[str(rank)], job, str(STEPS), str(TOKENS), str(FPT), str(delay),
             str(collate_sleep)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out


def per_rank(fams: dict[str, list[tuple[dict[str, str], float]]], name: str, job: str,
             **match: str) -> dict[str, float]:
    return {lbl["rank"]: v for lbl, v in fams.get(name, [])
            if lbl.get("training_job") == job and all(lbl.get(k) == w for k, w in match.items())}


def test_two_ddp_ranks_report_steps_phases_tokens_flops_and_mfu(tmp_path: Path) -> None:
    ingest = f"unix://{tmp_path}/ingest.sock"
    exp = start_exporter(
        ["--simulate", "2", "--ingest", ingest, "--mfu-window", "120"],
        env={"STEPSCOPE_PEAK_FLOPS": json.dumps({MODEL: {"bf16": PEAK}})})
    try:
        fams = parse_samples(exp.metrics())
        uuids = {lbl["gpu"]: lbl["UUID"] for lbl, _ in fams["stepscope_gpu_up"]}
        run_job(ingest, uuids, "e2e", delay=0.0)

        def done() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            f = parse_samples(exp.metrics())
            ok = per_rank(f, "stepscope_steps_total", "e2e") == {"0": STEPS, "1": STEPS}
            return f if ok else None

        f = wait_for(done, timeout=30)
        measured = STEPS - 3
        assert per_rank(f, "stepscope_warmup_steps_total", "e2e") == {"0": 3, "1": 3}
        assert per_rank(f, "stepscope_tokens_total", "e2e") == {"0": measured * TOKENS,
                                                               "1": measured * TOKENS}
        flops = per_rank(f, "stepscope_model_flops_total", "e2e")
        assert flops == pytest.approx({"0": measured * TOKENS * FPT, "1": measured * TOKENS * FPT})
        count = per_rank(f, "stepscope_step_duration_seconds_count", "e2e")
        total = per_rank(f, "stepscope_step_duration_seconds_sum", "e2e")
        assert count == {"0": measured, "1": measured}
        for rank in ("0", "1"):
            phases = {p: per_rank(f, "stepscope_step_phase_seconds_total", "e2e", phase=p)[rank]
                      for p in ("data_wait", "compute", "comm", "other")}
            assert sum(phases.values()) == pytest.approx(total[rank], rel=1e-6)
            assert phases["comm"] > 0 and phases["compute"] > 0  # watch_ddp timed the hook
            # MFU: model FLOP/s over the window / the configured peak of the rank's GPU
            mfu = per_rank(f, "stepscope_mfu_ratio", "e2e")[rank]
            assert mfu == pytest.approx(flops[rank] / total[rank] / PEAK, rel=0.15)
        info = {lbl["rank"]: lbl for lbl, _ in f["stepscope_training_rank_info"]
                if lbl["training_job"] == "e2e"}
        assert info["0"]["mfu_status"] == "ok" and info["0"]["gpu"] == "0"
        assert info["1"]["UUID"] == uuids["1"] and info["1"]["modelName"] == MODEL
        assert info["1"]["world_size"] == "2"
    finally:
        assert exp.stop() == 0


def test_a_rank_delayed_before_backward_grows_the_other_ranks_comm(tmp_path: Path) -> None:
    ingest = f"unix://{tmp_path}/ingest.sock"
    exp = start_exporter(["--simulate", "2", "--ingest", ingest])
    try:
        uuids = {lbl["gpu"]: lbl["UUID"]
                 for lbl, _ in parse_samples(exp.metrics())["stepscope_gpu_up"]}
        run_job(ingest, uuids, "slow", delay=0.05)
        f = wait_for(lambda: (g := parse_samples(exp.metrics())) and per_rank(
            g, "stepscope_steps_total", "slow") == {"0": STEPS, "1": STEPS} and g, timeout=30)
        comm = per_rank(f, "stepscope_step_phase_seconds_total", "slow", phase="comm")
        # rank 0 waits ~50 ms per measured step on rank 1's all-reduce; rank 1 does not
        assert comm["0"] > 0.6 * 0.05 * (STEPS - 3)
        assert comm["0"] > 3 * comm["1"]
    finally:
        assert exp.stop() == 0


def test_a_data_starved_loader_shows_data_wait_dominating(tmp_path: Path) -> None:
    ingest = f"unix://{tmp_path}/ingest.sock"
    exp = start_exporter(["--simulate", "2", "--ingest", ingest])
    try:
        uuids = {lbl["gpu"]: lbl["UUID"]
                 for lbl, _ in parse_samples(exp.metrics())["stepscope_gpu_up"]}
        run_job(ingest, uuids, "starved", delay=0.0, collate_sleep=0.04)
        f = wait_for(lambda: (g := parse_samples(exp.metrics())) and per_rank(
            g, "stepscope_steps_total", "starved") == {"0": STEPS, "1": STEPS} and g, timeout=30)
        total = per_rank(f, "stepscope_step_duration_seconds_sum", "starved")
        for rank in ("0", "1"):
            phase = {p: per_rank(f, "stepscope_step_phase_seconds_total", "starved",
                                 phase=p)[rank] for p in ("data_wait", "compute", "comm")}
            assert phase["data_wait"] > 0.5 * total[rank]
            assert phase["data_wait"] > phase["compute"] + phase["comm"]
            assert phase["data_wait"] >= 0.9 * 0.04 * (STEPS - 3)
    finally:
        assert exp.stop() == 0
