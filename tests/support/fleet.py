"""A simulated fleet on one machine, scraped by a real Prometheus: what the fleet test
(tests/e2e/test_diagnose_fleet.py) and the onset benchmark (benchmarks/bench_fleet_onset.py)
share.

``nodes`` `stepscope serve` processes (one simulated H100 each, distinct ``--hostname``,
each its own ingest socket), one of them (``slow``) thermally throttled (or, with
``cause="starved"``, its GPU idle 70% of each second waiting for data) from
``slow_at`` s after it starts; the ranks of one job spread one per node
(tests/workers/fleet_ranks.py, real ``StepReporter``s), the slow node's rank computing
longer from the same moment; a real ``prometheus`` scraping all of them with the
shipped rules, either as shipped or with every ``for:`` set to ``for_``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import REPO, Exporter, parse_samples, start_exporter, wait_for
from tests.support.exporter import kill_all
from tests.support.ports import free_port
from tests.support.prometheus import CLUSTER, Prometheus
from tests.support.tools import prometheus_binary

RULES = REPO / "deploy" / "prometheus" / "rules"
WORKER = REPO / "tests" / "workers" / "fleet_ranks.py"
JOB = "fleet-llm"
# what happens to the slow node's GPU at the onset (scenario window keys)
CAUSES: dict[str, dict[str, Any]] = {
    "thermal": {"thermal": "sw"},
    "starved": {"activity": "sawtooth", "period": 1.0, "duty": 0.3, "wait": "data"},
    # fail-slow: the clock held down with no clock event (the rank's slowdown says how far)
    "clock": {"sm_clock": 0.92},
}


class FleetPrometheus(Prometheus):
    """The e2e test's Prometheus with a chosen scrape interval and ``for:`` durations."""

    def __init__(self, tmp: Path, targets: list[str], scrape: str = "1s",
                 for_: str | None = "5s", rules_dir: Path = RULES) -> None:  # fmt: skip
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "rules").mkdir()
        rules = []
        for path in sorted(rules_dir.glob("*.yml")):
            text = path.read_text()
            if for_ is not None:  # expressions, windows and thresholds stay as shipped
                text = re.sub(r"(?m)^(\s+)for: \S+$", rf"\g<1>for: {for_}", text)
            (tmp / "rules" / path.name).write_text(text)
            rules.append(tmp / "rules" / path.name)
        config = {
            "global": {"scrape_interval": scrape, "evaluation_interval": scrape},
            "rule_files": [str(p) for p in rules],
            "scrape_configs": [{
                "job_name": "stepscope", "honor_labels": False,
                "static_configs": [{"targets": targets, "labels": {"cluster": CLUSTER}}],
            }],
        }  # fmt: skip
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = (tmp / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        wait_for(lambda: self.ready(), timeout=30, interval=0.2)

    def firing(self, alert: str) -> list[dict[str, str]]:
        """Label sets of ``alert`` firing now."""
        return [a["labels"] for a in self.api("alerts")["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]


@dataclass
class Fleet:
    """The running fleet: exporters by host, the Prometheus, the ranks' process."""

    hosts: list[str]
    exporters: list[Exporter]
    prom: FleetPrometheus
    ranks: subprocess.Popen[str]
    slow: str
    started: float  # wall time the exporters were started (scenario time 0, roughly)
    output: list[str] = field(default_factory=list)

    def onset(self, timeout: float = 60) -> float:
        """Wall time the slow rank started computing slower (read from the ranks)."""
        line: str = wait_for(lambda: next(
            (x for x in self.output if x.startswith("onset ")), None), timeout=timeout)
        return float(line.split()[1])


def _read(proc: subprocess.Popen[str], out: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line.strip())


@contextmanager
def fleet(tmp: Path, *, nodes: int = 8, slow_at: float = 0.0, interval: float = 1.0,
          window: float = 10.0, scrape: str = "1s", for_: str | None = "5s",
          compute: float = 0.30, slow_compute: float = 0.45,
          rules: Path = RULES, cause: str = "thermal",
          change: dict[str, Any] | None = None) -> Iterator[Fleet]:  # fmt: skip
    """Start the fleet; the slow node is the last. Everything is stopped on exit.
    ``rules``: the folder of rule files Prometheus loads (the shipped ones by default);
    ``change``: what happens to the slow node's GPU, instead of ``CAUSES[cause]``."""
    hosts = [f"node-{i}" for i in range(nodes)]
    slow = hosts[-1]
    scenario = tmp / "slow.yaml"
    scenario.write_text(json.dumps({"gpus": 1,
                                    "timeline": [{"at": slow_at, **(change or CAUSES[cause])}]}))
    env = {"STEPSCOPE_DIAGNOSIS": json.dumps({"window": window})}

    def start(host: str) -> Exporter:
        gpus = ["--scenario", str(scenario)] if host == slow else ["--simulate", "1"]
        return start_exporter([*gpus, "--hostname", host, "--interval", str(interval),
                               "--slow-interval", str(interval),
                               "--ingest", f"unix://{tmp / host}.sock"], env)  # fmt: skip

    exporters: list[Exporter] = []
    prom: FleetPrometheus | None = None
    ranks: subprocess.Popen[str] | None = None
    try:
        started = time.time()
        with ThreadPoolExecutor(nodes) as pool:  # start together: same scenario clock
            exporters = list(pool.map(start, hosts))
        specs = []
        for host, exp in zip(hosts, exporters, strict=True):
            (labels, _), = parse_samples(exp.metrics())["stepscope_gpu_up"]
            specs += ["--rank", f"unix://{tmp / host}.sock,{labels['UUID']}"]
        prom = FleetPrometheus(tmp / "prometheus", [e.address for e in exporters], scrape,
                               for_, rules)  # fmt: skip
        # the slow rank slows at the moment its node's GPU starts throttling
        slow_after = max(0.0, started + slow_at - time.time())
        ranks = subprocess.Popen(
            [sys.executable, str(WORKER), "--job", JOB, *specs, "--compute", str(compute),
             "--slow-rank", str(nodes - 1), "--slow-compute", str(slow_compute),
             "--slow-after", str(slow_after)],
            stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "exporter")})  # fmt: skip
        out: list[str] = []
        threading.Thread(target=_read, args=(ranks, out), daemon=True).start()
        yield Fleet(hosts, exporters, prom, ranks, slow, started, out)
    finally:
        if ranks is not None and ranks.poll() is None:
            ranks.kill()
            ranks.wait()
        if prom is not None:
            prom.stop()
        kill_all(exporters)


def fleet_report(prom_url: str) -> dict[str, Any]:
    """`stepscope diagnose --prometheus URL --json` as a subprocess would print it; where
    it prints no report (exit 2), ``exit`` and ``error`` (its stderr) only."""
    result = subprocess.run(
        [sys.executable, "-m", "stepscope", "diagnose", "--prometheus", prom_url, "--json"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")})  # fmt: skip
    if not result.stdout.strip():
        return {"exit": result.returncode, "error": result.stderr.strip()}
    report: dict[str, Any] = json.loads(result.stdout)
    report["exit"] = result.returncode
    return report
