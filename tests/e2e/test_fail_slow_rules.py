"""Fail-slow ranks and GPUs through a real Prometheus with the shipped rules.

One `stepscope serve` with 12 simulated H100s, GPU 11 held at 92% of its clock with no
clock event (the scenario's ``sm_clock``); a pipeline job of 12 ranks reporting a step
every 0.1 s over UDP, each with its group (4 stages x 3 data-parallel replicas, rank =
stage * 3 + replica, on GPU = rank). The first and last stages are busy 30% longer per
step by design; rank 8 (stage2) is 8% slower than its stage from its first step; rank 4
(stage1) turns 25% slower 10 s in (the onset); rank 5 (stage1) jitters +-4% second by
second. A real Prometheus (Debian's 2.42) scrapes every second and loads the shipped
rules with every ``for:`` cut to 5 s (as test_prometheus.py does); windows and
thresholds as shipped.

StepscopeRankStraggler fires for ranks 8 and 4 against their group (its ``group`` label
on the alert), and no other rank is ever even pending: the stages that differ by design
and the jittering rank stay silent. StepscopeGpuClockLagging fires for GPU 11 only, naming
its power limit. Every rule evaluates without an error. (The comparison with a
rank's own past needs 35 minutes of it: rules-tests/stepscope-fail-slow_test.yml.)
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, Exporter, parse_samples, start_exporter, wait_for
from tests.support.exporter import kill_all
from tests.support.ingest import Datagrams, UdpSteps
from tests.support.ports import free_port
from tests.support.prometheus import Prometheus

RULES = REPO / "deploy" / "prometheus" / "rules"
JOB = "pp"
STAGES, REPLICAS = 4, 3
RANKS = STAGES * REPLICAS
PERIOD = 0.1  # seconds between steps
ONSET = 10.0  # seconds after the first step: rank 4 turns 25% slower
SLOW_FROM_START, TURNS_SLOW, JITTERS = 8, 4, 5
LAGGING_GPU = 11


def busy(rank: int, elapsed: float) -> float:
    """Seconds of compute (busy time) in a step of ``rank`` at ``elapsed`` s."""
    stage = rank // REPLICAS
    base = 0.013 if stage in (0, STAGES - 1) else 0.010  # embedding / loss stages
    if rank == SLOW_FROM_START:
        return base * 1.08
    if rank == TURNS_SLOW and elapsed >= ONSET:
        return base * 1.25
    if rank == JITTERS:  # +-4%, alternating every second
        return base * (1.04 if int(elapsed) % 2 else 0.96)
    return base


def report(port: int, uuids: list[str], start: float) -> UdpSteps:
    def datagrams(step: int) -> Datagrams:
        elapsed = time.monotonic() - start
        for rank in range(RANKS):
            compute = busy(rank, elapsed)
            yield {
                "v": 1, "type": "step", "job": JOB, "rank": rank, "local_rank": rank,
                "world_size": RANKS, "pid": os.getpid(), "uuid": uuids[rank], "step": step,
                "t": time.time(), "dur": compute + 0.02, "compute": compute, "comm": 0.02,
                "tokens": 1, "flops": 0, "precision": "bf16", "warmup": False,
                "group": f"stage{rank // REPLICAS}",
            }, ("127.0.0.1", port)  # fmt: skip

    return UdpSteps(PERIOD, datagrams)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Prometheus, float]]:
    port = free_port(socket.SOCK_DGRAM)
    scenario = tmp_path / "lagging.yaml"
    scenario.write_text(json.dumps({
        "gpus": RANKS, "workload": {"activity": "busy"},
        "timeline": [{"gpus": [LAGGING_GPU], "sm_clock": 0.92}],
    }))  # fmt: skip
    exporters: list[Exporter] = []
    prom: Prometheus | None = None
    senders: UdpSteps | None = None
    try:
        exp = start_exporter(
            [
                "--scenario",
                str(scenario),
                "--interval",
                "0.5",
                "--hostname",
                "node-p",
                "--ingest",
                f"udp://127.0.0.1:{port}",
            ]
        )
        exporters.append(exp)
        up = parse_samples(exp.metrics())["stepscope_gpu_up"]
        uuids = [lbl["UUID"] for lbl, _ in sorted(up, key=lambda s: int(s[0]["gpu"]))]
        (tmp_path / "prometheus").mkdir()
        prom = Prometheus(tmp_path / "prometheus", [exp.address], RULES)
        start = time.monotonic()
        senders = report(port, uuids, start)
        yield prom, start
    finally:
        if senders is not None:
            senders.stop()
        if prom is not None:
            prom.stop()
        kill_all(exporters)


def test_fail_slow_ranks_and_gpu_fire_while_pipeline_stages_and_jitter_stay_silent(
    served: tuple[Prometheus, float],
) -> None:
    prom, start = served
    ever: dict[str, set[str]] = {}  # alert -> ranks (or GPUs) ever pending or firing
    firing: dict[str, dict[str, dict[str, str]]] = {}
    fired_at: dict[str, float] = {}

    def poll() -> bool:
        for a in prom.api("alerts")["alerts"]:
            name, labels = a["labels"]["alertname"], a["labels"]
            who = labels.get("rank") if name == "StepscopeRankStraggler" else labels.get("gpu")
            if who is None:
                continue
            ever.setdefault(name, set()).add(who)
            if a["state"] == "firing":
                firing.setdefault(name, {})[who] = {**labels, **a["annotations"]}
                fired_at.setdefault(f"{name}/{who}", time.monotonic() - start)
        ranks = firing.get("StepscopeRankStraggler", {})
        return {str(SLOW_FROM_START), str(TURNS_SLOW)} <= set(ranks) and str(
            LAGGING_GPU) in firing.get("StepscopeGpuClockLagging", {})  # fmt: skip

    wait_for(poll, timeout=90, interval=1)
    # nothing else was ever on its way: not the stages busier by design, not the jitter
    assert ever["StepscopeRankStraggler"] == {str(SLOW_FROM_START), str(TURNS_SLOW)}
    assert ever["StepscopeGpuClockLagging"] == {str(LAGGING_GPU)}
    ranks = firing["StepscopeRankStraggler"]
    for rank, stage in ((SLOW_FROM_START, "stage2"), (TURNS_SLOW, "stage1")):
        alert = ranks[str(rank)]
        assert (alert["compared_with"], alert["group"], alert["gpu"]) == ("group", stage, str(rank))
        assert f"the median time per step of group {stage} of its job" in alert["description"]
    # the onset: 25% slower, the minute's mean crosses 1.06 a quarter of the way in
    after = fired_at[f"StepscopeRankStraggler/{TURNS_SLOW}"] - ONSET
    print(
        f"rank {TURNS_SLOW}: StepscopeRankStraggler firing {after:.0f} s after its onset (for: 5 s)"
    )
    assert after > 0
    gpu = firing["StepscopeGpuClockLagging"][str(LAGGING_GPU)]
    assert gpu["power_limit"] == "700" and gpu["modelName"].startswith("NVIDIA H100")
    # 0.92 x 1980 MHz, in NVML's 15 MHz bins: 1815 MHz, ~91.7% of its peers' (which dip a
    # bin now and then)
    assert re.search(
        r"has run its SMs at 91\.\d+% of the clock of the median loaded", gpu["description"]
    ), gpu["description"]
    # every rule evaluated without an error (the server's own health of each rule)
    rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert rules and [r["name"] for r in rules if r["health"] != "ok" or r.get("lastError")] == []
