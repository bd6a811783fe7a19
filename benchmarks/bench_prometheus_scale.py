"""How the shipped rules and dashboards scale: a real Prometheus scraping many nodes.

    python benchmarks/bench_prometheus_scale.py [--nodes 16 64 128] [--seconds 40]
    python benchmarks/bench_prometheus_scale.py --nodes 1000 --interval 15s --seconds 180

One real `stepscope serve --simulate 8` with 8 training ranks reporting steps gives the
exposition of one 8-GPU node. The benchmark serves N copies of it, each with its own
Hostname and GPU UUIDs, from one stdlib HTTP server on loopback (N exporter processes
would measure the laptop, not Prometheus), and starts the real `prometheus` with the shipped
rules, scraping every copy every 5 s and evaluating every 5 s. After `--seconds` (default
40: a `[2m]` window then holds as many samples as at a 15 s scrape in steady state) it
reads Prometheus' own metrics: series per node, head series, samples ingested per second,
`prometheus_rule_group_last_duration_seconds` per group, resident memory, and the latency
of the fleet straggler query raw vs through its recording rule. Values of the copies are
static (counters do not move), which costs Prometheus the same per sample.
docs/scaling.md turns the table into numbers for 1,000 nodes x 8 GPUs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _local import free_port, get

REPO = Path(__file__).resolve().parent.parent
RULES = sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml"))
H100_BF16 = 989.4e12
QUERIES = {
    "straggler table, raw": "min by (cluster, Hostname) (DCGM_FI_PROF_SM_ACTIVE)",
    "straggler table, recorded": "Hostname:DCGM_FI_PROF_SM_ACTIVE:min",
    "thermal per node, raw": (
        "max by (cluster, Hostname) (rate(DCGM_FI_DEV_THERMAL_VIOLATION[2m]))"),
    "thermal per node, recorded": "Hostname:DCGM_FI_DEV_THERMAL_VIOLATION:max_ratio_rate2m",
    "straggler score, raw": (
        'sum without (phase) (rate(stepscope_step_phase_seconds_total{phase="compute"}[2m]))'
        " / rate(stepscope_step_duration_seconds_count[2m])"),
    "straggler score, recorded": "training_job_rank:stepscope_straggler_score:ratio",
}


def one_node_exposition() -> str:
    """What a real simulated 8-GPU node with 8 reporting ranks serves."""
    ingest = free_port(socket.SOCK_DGRAM)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "serve", "--simulate", "8", "--hostname",
         "node-template", "--listen", f"127.0.0.1:{port}", "--ingest",
         f"udp://127.0.0.1:{ingest}", "--interval", "0.5"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                text = get(f"http://127.0.0.1:{port}/metrics", timeout=30).decode()
                break
            except OSError:
                time.sleep(0.2)
        uuids = re.findall(r'stepscope_gpu_up\{gpu="(\d+)",UUID="([^"]+)"', text)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for step in range(12):
            for gpu, uuid in uuids:
                sock.sendto(json.dumps({
                    "v": 1, "type": "step", "job": "bench", "rank": int(gpu),
                    "local_rank": int(gpu), "world_size": 8, "uuid": uuid, "step": step,
                    "t": time.time(), "dur": 0.5, "data": 0.05, "compute": 0.35, "comm": 0.05,
                    "tokens": 8192, "flops": 0.2 * H100_BF16, "warmup": False,
                }).encode(), ("127.0.0.1", ingest))
            time.sleep(0.1)
        sock.close()
        time.sleep(1.5)
        return get(f"http://127.0.0.1:{port}/metrics", timeout=30).decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


class Fleet(ThreadingHTTPServer):
    """Serves /node-<i>/metrics: the template with node i's Hostname and UUIDs."""

    daemon_threads = True

    def __init__(self, template: str, nodes: int) -> None:
        # gzip once, as the exporter does: at 1,000 nodes the fleet server must not be
        # what limits the scrape rate
        self.bodies = [
            gzip.compress(
                template.replace('"node-template"', f'"node-{i:04d}"')
                .replace('UUID="GPU-', f'UUID="GPU-{i:04d}-').encode(),
                compresslevel=1,
            )
            for i in range(nodes)
        ]
        super().__init__(("127.0.0.1", 0), Handler)


class Handler(BaseHTTPRequestHandler):
    server: Fleet

    def do_GET(self) -> None:
        match = re.fullmatch(r"/node-(\d+)/metrics", self.path)
        if not match or int(match.group(1)) >= len(self.server.bodies):
            self.send_error(404)
            return
        body = self.server.bodies[int(match.group(1))]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def run(
    prometheus: str, template: str, nodes: int, seconds: float, interval: str = "5s"
) -> dict[str, Any]:
    fleet = Fleet(template, nodes)
    threading.Thread(target=fleet.serve_forever, daemon=True).start()
    address = f"127.0.0.1:{fleet.server_address[1]}"
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bench-"))
    url = f"http://127.0.0.1:{free_port()}"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": "5s"},
        "rule_files": [str(p) for p in RULES],
        "scrape_configs": [{
            # as shipped: honor_labels false, the cluster a target label (two clusters)
            "job_name": "stepscope", "honor_labels": False,
            "static_configs": [
                {"targets": [address],
                 "labels": {"__metrics_path__": f"/node-{i:04d}/metrics",
                            "instance": f"node-{i:04d}:9400",
                            "cluster": "east" if i % 2 else "west"}}
                for i in range(nodes)],
        }, {
            "job_name": "prometheus", "static_configs": [{"targets": [url[7:]]}],
        }],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address={url[7:]}",
         "--log.level=error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(q: str) -> list[dict[str, Any]]:
        body = json.loads(get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": q}),
                              timeout=120))
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(q: str) -> float:
        result = query(q)
        return float(result[0]["value"][1]) if result else float("nan")

    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                get(url + "/-/ready")
                break
            except OSError:
                time.sleep(0.2)
        time.sleep(seconds)
        groups: dict[str, list[float]] = {}
        for _ in range(6):  # sample the last evaluation of each group over 30 s
            last = 'prometheus_rule_group_last_duration_seconds{rule_group=~".*stepscope.*"}'
            for s in query(last):
                name = s["metric"]["rule_group"].split(";")[-1]
                groups.setdefault(name, []).append(float(s["value"][1]))
            time.sleep(5)
        rules: dict[str, float] = {}
        for group in json.loads(get(url + "/api/v1/rules"))["data"]["groups"]:
            for rule in group["rules"]:
                rules[rule["name"]] = 1000 * float(rule["evaluationTime"])
        latencies = {}
        for name, q in QUERIES.items():
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                query(q)
                times.append(time.perf_counter() - t0)
            latencies[name] = statistics.median(times)
        return {
            "nodes": nodes,
            "series_per_node": scalar('avg(scrape_samples_scraped{job="stepscope"})'),
            "head_series": scalar('prometheus_tsdb_head_series{job="prometheus"}'),
            "samples_per_s": scalar(
                'rate(prometheus_tsdb_head_samples_appended_total{job="prometheus"}[30s])'),
            "rss_mib": scalar('process_resident_memory_bytes{job="prometheus"}') / 2**20,
            "groups_ms": {g: 1000 * statistics.median(v) for g, v in sorted(groups.items())},
            "query_ms": {k: 1000 * v for k, v in latencies.items()},
            "rules_ms": rules,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        fleet.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[16, 64, 128])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--interval", default="5s",
                        help="scrape and evaluation interval (15s: production at 1,000 nodes)")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("needs the prometheus binary (Debian package prometheus)", file=sys.stderr)
        return 2
    template = one_node_exposition()
    print(f"one node: {sum(1 for ln in template.splitlines() if ln and ln[0] != '#')} "
          f"samples ({os.cpu_count()} CPUs here)")
    results = [run(prometheus, template, n, args.seconds, args.interval) for n in args.nodes]
    groups = sorted({g for r in results for g in r["groups_ms"]})
    head = ["nodes", "series/node", "head series", "samples/s", "RSS MiB",
            *[f"{g} ms" for g in groups]]
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        row = [str(r["nodes"]), f"{r['series_per_node']:.0f}", f"{r['head_series']:.0f}",
               f"{r['samples_per_s']:.0f}", f"{r['rss_mib']:.0f}",
               *[f"{r['groups_ms'].get(g, float('nan')):.2f}" for g in groups]]
        print("| " + " | ".join(row) + " |")
    print("\n| costliest rules at the largest size (ms, last evaluation) | |")
    print("|---|---|")
    for name, ms in sorted(results[-1]["rules_ms"].items(), key=lambda kv: -kv[1])[:8]:
        print(f"| {name} | {ms:.1f} |")
    print("\n| query (ms, median of 7) | " + " | ".join(f"{r['nodes']} nodes" for r in results)
          + " |")
    print("|---|" + "---|" * len(results))
    for name in QUERIES:
        print(f"| {name} | " + " | ".join(f"{r['query_ms'][name]:.1f}" for r in results) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
