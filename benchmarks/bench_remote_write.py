"""What the shipped agent config costs and sends at fleet size: a real Prometheus agent
(2.42, `--enable-feature=agent`) scraping a simulated fleet and remote-writing to a real
Prometheus receiver (`--web.enable-remote-write-receiver`).

    python -m benchmarks.bench_remote_write --nodes 1000 --interval 15s

The fleet is bench_prometheus_scale's: one asyncio process serving, at /node-<i>/metrics,
what a real `stepscope serve --simulate 8` serves with 8 ranks reporting steps, relabelled
per node, values moving every second. The agent has the shipped
deploy/prometheus/agent-ec2.yml's `queue_config` and `write_relabel_configs` (the keep
list), static targets instead of EC2 discovery. After --warmup it reads the agent's own
metrics twice, --seconds apart: samples sent per second, bytes on the wire, shards,
pending samples, the send lag (newest sample in the WAL minus newest sent), the mean
request time, the agent's RSS and CPU, and the receiver's head series. docs/scaling.md
has the results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks._local import free_port, get, wait_ready
from benchmarks.bench_prometheus_scale import (
    Layout,
    fleet_scrape_config,
    one_node_exposition,
    seconds_of,
    start_fleet,
)
from tests.support import REPO, parse_samples

AGENT_CONFIG = REPO / "deploy" / "prometheus" / "agent-ec2.yml"


def _metrics(url: str) -> dict[str, float]:
    """A Prometheus server's own metrics, summed over label sets (one remote queue here)."""
    samples = parse_samples(get(url + "/metrics", timeout=30).decode())
    return {name: sum(v for _, v in series) for name, series in samples.items()}


def run(prometheus: str, layout: Layout, interval: str, warmup: float,
        seconds: float) -> dict[str, Any]:  # fmt: skip
    template = one_node_exposition()
    served = sum(1 for line in template.splitlines() if line and not line.startswith("#"))
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bench-rw-"))
    fleet, fleet_port, _ = start_fleet(template, layout)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        central = f"http://127.0.0.1:{free_port()}"
        (tmp / "central.yml").write_text("{}")
        with (tmp / "central.log").open("w") as log:
            procs.append(subprocess.Popen(
                [prometheus, f"--config.file={tmp / 'central.yml'}",
                 f"--storage.tsdb.path={tmp / 'central'}", "--web.enable-remote-write-receiver",
                 f"--web.listen-address={central[7:]}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=log))  # fmt: skip
        wait_ready(central, procs[-1], tmp / "central.log")
        (shipped,) = yaml.safe_load(AGENT_CONFIG.read_text())["remote_write"]
        agent = f"http://127.0.0.1:{free_port()}"
        config = {
            "global": {"scrape_interval": interval,
                       "scrape_timeout": f"{min(seconds_of(interval), 10):g}s"},
            "scrape_configs": [fleet_scrape_config(fleet_port, layout)],
            "remote_write": [{"url": f"{central}/api/v1/write",
                              "queue_config": shipped["queue_config"],
                              "write_relabel_configs": shipped["write_relabel_configs"]}],
        }  # fmt: skip
        (tmp / "agent.yml").write_text(json.dumps(config))
        with (tmp / "agent.log").open("w") as log:
            procs.append(subprocess.Popen(
                [prometheus, "--enable-feature=agent", f"--config.file={tmp / 'agent.yml'}",
                 f"--storage.agent.path={tmp / 'agent'}", f"--web.listen-address={agent[7:]}",
                 "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=log))  # fmt: skip
        wait_ready(agent, procs[-1], tmp / "agent.log")
        time.sleep(warmup)  # a benchmark's fixed window, not synchronisation
        a0, t0 = _metrics(agent), time.monotonic()
        time.sleep(seconds)
        a1, t1, c1 = _metrics(agent), time.monotonic(), _metrics(central)
        dt = t1 - t0

        def rate(name: str) -> float:
            return (a1.get(name, 0.0) - a0.get(name, 0.0)) / dt

        sent_sum = (a1["prometheus_remote_storage_sent_batch_duration_seconds_sum"]
                    - a0["prometheus_remote_storage_sent_batch_duration_seconds_sum"])
        sent_n = (a1["prometheus_remote_storage_sent_batch_duration_seconds_count"]
                  - a0["prometheus_remote_storage_sent_batch_duration_seconds_count"])
        return {
            "nodes": layout.nodes, "interval": interval, "served_per_node": served,
            "sent_series": c1.get("prometheus_tsdb_head_series", float("nan")),
            "samples_per_s": rate("prometheus_remote_storage_samples_total"),
            "bytes_per_s": rate("prometheus_remote_storage_bytes_total"),
            "failed_per_s": rate("prometheus_remote_storage_samples_failed_total"),
            "dropped_per_s": rate("prometheus_remote_storage_samples_dropped_total"),
            "shards": a1["prometheus_remote_storage_shards"],
            "pending": a1["prometheus_remote_storage_samples_pending"],
            "lag_s": (a1["prometheus_remote_storage_highest_timestamp_in_seconds"]
                      - a1["prometheus_remote_storage_queue_highest_sent_timestamp_seconds"]),
            "request_ms": 1000 * sent_sum / sent_n if sent_n else float("nan"),
            "agent_rss_mib": a1["process_resident_memory_bytes"] / 2**20,
            "agent_cores": rate("process_cpu_seconds_total"),
            "agent_series": a1.get("prometheus_agent_active_series", float("nan")),
            "central_rss_mib": c1["process_resident_memory_bytes"] / 2**20,
            "load": os.getloadavg()[0],
        }  # fmt: skip
    finally:
        for proc in reversed(procs):  # the agent first: it flushes to the receiver
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        fleet.terminate()
        fleet.join(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--nodes-per-job", type=int, default=250)
    parser.add_argument("--interval", default="15s", help="the agent's scrape interval")
    parser.add_argument("--warmup", type=float, default=120.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus is not installed (Debian package prometheus)")
    r = run(prometheus, Layout(args.nodes, args.nodes_per_job), args.interval, args.warmup,
            args.seconds)  # fmt: skip
    print(f"{r['nodes']} nodes, scrape {r['interval']}, {r['served_per_node']} series served "
          f"a node; load average {r['load']:.1f}")
    print("| | measured |\n|---|---:|")
    rows = [
        ("series received by the central Prometheus", f"{r['sent_series']:,.0f}"),
        ("agent's active series (all it scrapes)", f"{r['agent_series']:,.0f}"),
        ("samples sent / s", f"{r['samples_per_s']:,.0f}"),
        ("bytes sent / s (snappy protobuf)", f"{r['bytes_per_s']:,.0f}"),
        ("bytes a sample", f"{r['bytes_per_s'] / max(r['samples_per_s'], 1):.2f}"),
        ("failed / dropped samples / s", f"{r['failed_per_s']:.0f} / {r['dropped_per_s']:.0f}"),
        ("shards (min 4, max 30)", f"{r['shards']:.0f}"),
        ("samples pending at the end", f"{r['pending']:,.0f}"),
        ("send lag, newest in WAL - newest sent", f"{r['lag_s']:.1f} s"),
        ("mean request time", f"{r['request_ms']:.0f} ms"),
        ("agent RSS", f"{r['agent_rss_mib']:,.0f} MiB"),
        ("agent CPU", f"{r['agent_cores']:.2f} cores"),
        ("central Prometheus RSS", f"{r['central_rss_mib']:,.0f} MiB"),
    ]
    for name, value in rows:
        print(f"| {name} | {value} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
