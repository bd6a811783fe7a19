"""The fleet view for real: `stepscope diagnose --prometheus` against a real Prometheus
scraping 8 exporters (simulated GPUs, one machine), with the ranks of one job reporting
through the SDK, one per node, and one node slow (tests/support/fleet.py).

The slow node's GPU throttles for temperature and its rank computes 50% longer; every
other rank waits for it in the all-reduce. The fleet view must name, on one screen, the
slow node and rank, the job, and the likely cause from that node's own verdict, and
the shipped straggler alert must fire for that rank only (`for:` shortened to 5 s).
The fleet view and the firing alerts judge by one set of thresholds
(stepscope.diagnose.fleet_rules) on the same recorded series: they name the same nodes,
GPUs and ranks. When the job ends, each node's own diagnosis reads its rank `finished`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import REPO, wait_for
from tests.support.fleet import JOB, FleetPrometheus, fleet, fleet_report

# what a fleet-view finding and an alert each name: a node, a GPU or a rank
Named = set[tuple[str, ...]]


def named_by_the_fleet_view(report: dict[str, Any]) -> Named:
    out: Named = set()
    for f in report.get("findings", []):
        if f["kind"] == "slow_rank":
            out.add(("rank", f["job"], f["rank"], f["Hostname"], f["gpu"]))
        elif f["kind"] == "straggler":
            out.add(("node", f["Hostname"]))
        elif f["kind"] == "thermal_throttle":
            out.add(("gpu", f["Hostname"], f["gpu"]))
    return out


def named_by_the_alerts(prom: FleetPrometheus) -> Named:
    out: Named = set()
    for a in prom.firing("StepscopeRankStraggler"):
        out.add(("rank", a["training_job"], a["rank"], a["Hostname"], a["gpu"]))
    for a in prom.firing("StepscopeNodeStraggler"):
        out.add(("node", a["Hostname"]))
    for a in prom.firing("StepscopeGpuThermalViolation"):
        out.add(("gpu", a["Hostname"], a["gpu"]))
    return out


def test_the_fleet_view_names_the_slow_node_rank_job_and_cause_on_one_screen(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, nodes=8) as f:
        def named() -> dict[str, Any] | None:
            report = fleet_report(f.prom.url)
            slow = [s for job in report.get("jobs", []) for s in job["slow_ranks"]]
            complete = all(j["ranks"] == 8 for j in report.get("jobs", []))  # all scraped
            if complete and [(s["Hostname"], s["rank"]) for s in slow] == [(f.slow, "7")] and (
                "thermal_throttle" in slow[0]["cause"]
            ):
                return report
            return None

        report = wait_for(named, timeout=60, interval=1)
        (job,) = report["jobs"]
        assert job["job"] == JOB and job["ranks"] == 8 and job["nodes"] == 8
        assert report["exit"] == 1 and report["status"] == "bottleneck"
        (slow,) = job["slow_ranks"]
        assert slow["ratio"] > 1.3 and "temperature" in slow["advice"]
        # the other ranks wait for it: their communication verdicts are not root causes
        kinds = {x["kind"] for x in report["findings"]}
        assert "communication" not in kinds and "tcp_suspected" not in kinds
        straggler = wait_for(lambda: f.prom.firing("StepscopeRankStraggler"), timeout=45)
        assert {(a["training_job"], a["rank"], a["Hostname"]) for a in straggler} == {
            (JOB, "7", f.slow)}  # fmt: skip
        screen = subprocess.run(
            [sys.executable, "-m", "stepscope", "diagnose", "--prometheus", f.prom.url],
            capture_output=True, text=True, timeout=60,
            env={"PYTHONPATH": str(REPO / "exporter"), "PATH": "/usr/bin:/bin"},
        ).stdout  # fmt: skip
        lines = screen.splitlines()
        assert len(lines) <= 24, screen  # one screen
        assert f"JOB {JOB}" in screen and f"SLOW: rank 7 on {f.slow}" in screen, screen
        assert f"{f.slow}'s own verdict: compute+thermal_throttle" in screen, screen
        assert "wait for it in all-reduce" in screen, screen
        print(screen)

        # one fleet through both: the fleet view and Alertmanager name the same things
        # (alerts lag by their for:, so both are read until they agree, then compared)
        def agree() -> Named | None:
            alerts = named_by_the_alerts(f.prom)
            view = named_by_the_fleet_view(fleet_report(f.prom.url))
            return view if view == alerts and len(view) >= 2 else None

        view = wait_for(agree, timeout=60, interval=1)
        assert view == {("rank", JOB, "7", f.slow, "0"), ("gpu", f.slow, "0")}, view

        # the job ends: each node's own diagnosis reads its rank finished, not unknown
        f.ranks.kill()
        f.ranks.wait()

        def finished() -> bool:
            doc = json.loads(f.exporters[0].get("/api/v1/diagnosis")[2])
            return any(v["kind"] == "finished" for v in doc["verdicts"])

        wait_for(finished, timeout=20, interval=0.5)
