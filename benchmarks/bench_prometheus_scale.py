"""How the shipped rules scale: a real Prometheus scraping a simulated fleet, live.

    python -m benchmarks.bench_prometheus_scale --nodes 1000 --interval 15s --seconds 180
    python -m benchmarks.bench_prometheus_scale --nodes 16 64 --interval 5s --warmup 150

What one node serves comes from the real exporter: `stepscope serve --simulate 8` with 8
training ranks reporting steps through its ingest socket (so GPU series carry the rank's
training job, as attribution serves them). The fleet is that exposition, relabelled per
node (Hostname, GPU UUIDs, training job, global rank, world size), served by one asyncio
process at /node-<i>/metrics with the exporter's content type and gzip. Values move on
every scrape at almost no cost: each sample is a slot in a per-node list of static text
pieces, and one vector of values per second (counters rise, gauges wander, timestamps are
now) is shared by all nodes; a few nodes per job run slow (SM activity 0.4x, compute 1.5x)
so the straggler rules have something to find. Nodes are in training jobs of
--nodes-per-job nodes, each job inside one of two clusters.

The real `prometheus` scrapes every node at --interval with the shipped rules (evaluation
at the same interval), honor_labels false, `cluster` a target label as the shipped scrape
configs set it. The history the rules read beyond the run (the 6 h `max_over_time` of
StepscopeGpuMissing) is backfilled with `promtool tsdb create-blocks-from openmetrics`
before Prometheus starts; everything else is live. After --warmup (default 10 min: the
longest live range the rules read, so every window is full) it polls /api/v1/rules for
--seconds and keeps every evaluation of every group and rule (`evaluationTime`), then reads
Prometheus' own metrics: head series, samples appended/s, RSS and Go heap, scrape
duration, rule failures and missed iterations. It records its own CPU (the fleet server's
must not starve Prometheus on a small machine) and the load average of the machine, since
other work there skews the timings. docs/scaling.md has the results.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks._local import free_port, get, wait_ready
from tests.support import REPO

RULES = REPO / "deploy" / "prometheus" / "rules"
H100_BF16 = 989.4e12
MFU = 0.45  # what the simulated ranks achieve: a good large-model training run
STEP_SECONDS = 0.2  # step time of the template's ranks (paced in real time: MFU is wall-clock)
SLOW_EVERY = 97  # every 97th node of a job is slow (a handful of alerts, as in a real fleet)
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
# Gauges that are constants of the node or the configuration: served unchanged. (The power
# limits too: the clock rules carry the enforced limit as a label, so a wandering limit
# would start new recorded series at every evaluation.)
STATIC_GAUGES = {
    "stepscope_gpu_peak_flops", "stepscope_sampling_interval_seconds",
    "stepscope_training_ranks", "stepscope_http_max_connections", "process_max_fds",
    "process_start_time_seconds", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",
}


# -- one node, from the real exporter ---------------------------------------------------

def one_node_exposition() -> str:
    """What a real simulated 8-GPU node serves with 8 ranks of job `bench` reporting."""
    ingest = free_port(socket.SOCK_DGRAM)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope", "serve", "--simulate", "8", "--hostname",
         "node-template", "--listen", f"127.0.0.1:{port}", "--ingest",
         f"udp://127.0.0.1:{ingest}", "--interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            try:
                text = get(f"http://127.0.0.1:{port}/metrics", timeout=30).decode()
                break
            except OSError:
                time.sleep(0.2)
        uuids = re.findall(r'stepscope_gpu_up\{gpu="(\d+)",UUID="([^"]+)"', text)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for step in range(16):
            for gpu, uuid in uuids:
                sock.sendto(json.dumps({
                    "v": 1, "type": "step", "job": "bench", "rank": int(gpu),
                    "local_rank": int(gpu), "world_size": 8, "uuid": uuid, "step": step,
                    "pid": os.getpid(), "t": time.time(), "dur": STEP_SECONDS,
                    "data": 0.1 * STEP_SECONDS, "compute": 0.75 * STEP_SECONDS,
                    "comm": 0.1 * STEP_SECONDS, "tokens": 8192,
                    "flops": MFU * H100_BF16 * STEP_SECONDS, "warmup": False,
                }).encode(), ("127.0.0.1", ingest))
            time.sleep(STEP_SECONDS)
        sock.close()
        time.sleep(2.5)  # a sampling pass and a diagnosis pass over the steps
        return get(f"http://127.0.0.1:{port}/metrics", timeout=30).decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


# -- the fleet: per-node text pieces around shared value slots ---------------------------

SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})? (\S+)$")
RANK = re.compile(r'(?<![A-Za-z0-9_])rank="(\d+)"')


@dataclass(frozen=True, slots=True)
class Slot:
    """How one sample's value moves: kind is static, counter, gauge or timestamp."""

    kind: str
    v0: float
    slow_factor: float  # applied on the slow nodes (SM activity down, compute time up)


@dataclass(frozen=True, slots=True)
class Layout:
    """The fleet: who is where, and what each node's exposition is made of."""

    nodes: int
    nodes_per_job: int

    def cluster(self, node: int) -> str:
        return "west" if node < (self.nodes + 1) // 2 else "east"

    def job(self, node: int) -> tuple[str, int, int]:
        """(training job, this node's index in it, nodes in it); jobs never span clusters."""
        half = (self.nodes + 1) // 2
        start = 0 if node < half else half
        end = half if node < half else self.nodes
        k = (node - start) // self.nodes_per_job
        first = start + k * self.nodes_per_job
        size = min(self.nodes_per_job, end - first)
        return f"{self.cluster(node)}-job-{k}", node - first, size

    def slow(self, node: int) -> bool:
        return self.job(node)[1] % SLOW_EVERY == 1


def parse_template(text: str) -> tuple[list[str], list[Slot]]:
    """The exposition as text pieces around value slots, and how each value moves."""
    types: dict[str, str] = {}
    pieces: list[str] = []
    slots: list[Slot] = []
    pending = ""
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        match = SAMPLE.match(line) if line and line[0] != "#" else None
        if match is None:
            pending += line + "\n"
            continue
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        kind = types.get(name) or types.get(family, "untyped")
        v0 = float(value)
        if kind in ("counter", "histogram") or name.endswith("_total") or (
                kind == "summary" and name != family):  # a summary's _sum and _count
            slot_kind = "counter"
        elif name.endswith("_timestamp_seconds"):
            slot_kind = "timestamp"
        elif name in STATIC_GAUGES or v0 in (0.0, 1.0) or "_info" in name:
            slot_kind = "static"
        else:
            slot_kind = "gauge"
        slow = 1.0
        if name == "DCGM_FI_PROF_SM_ACTIVE":
            slow = 0.4
        elif name == "stepscope_step_phase_seconds_total" and 'phase="compute"' in labels:
            slow = 1.5
        pieces.append(pending + name + labels + " ")
        pending = "\n"
        slots.append(Slot(slot_kind, v0, slow))
    pieces.append(pending)
    return pieces, slots


def node_text(template: str, layout: Layout, node: int) -> str:
    """The template as node `node` serves it: its Hostname, UUIDs, job and global ranks."""
    job, index, size = layout.job(node)
    text = (template.replace('Hostname="node-template"', f'Hostname="node-{node:04d}"')
            .replace('UUID="GPU-', f'UUID="GPU-{node:04d}')
            .replace('training_job="bench"', f'training_job="{job}"')
            .replace('world_size="8"', f'world_size="{8 * size}"'))
    return RANK.sub(lambda m: f'rank="{8 * index + int(m.group(1))}"', text)


def values_at(slots: list[Slot], t: float, t0: float, slow: bool) -> list[str]:
    """Every slot's value at time t (counters rise from their template value by a tenth of
    it per second; gauges wander a few percent over minutes; timestamps are now)."""
    out = []
    for i, s in enumerate(slots):
        f = s.slow_factor if slow else 1.0
        if s.kind == "counter":
            v = s.v0 * f + s.v0 * f * 0.1 * (t - t0)
        elif s.kind == "timestamp":
            v = t - 0.5
        elif s.kind == "gauge":
            v = s.v0 * f * (1 + 0.03 * math.sin(t / 47.0 + i))
            if s.v0 == int(s.v0) and abs(s.v0) >= 10:
                v = round(v)
        else:
            v = s.v0
        out.append(repr(v) if isinstance(v, float) else str(v))
    return out


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault injected into one node at a known time: from then on the value of sample
    ``slot`` (an index into the template's slots) rises ``per_s`` a second faster (a
    violation counter that starts counting, a rank's compute phase that grows)."""

    node: int
    slot: int
    per_s: float


def template_slot(template: str, name: str, *labels: str) -> int:
    """The index of the template's sample ``name`` carrying every label of ``labels``
    (e.g. 'gpu="3"'); ValueError when none does."""
    pieces, _ = parse_template(template)
    for i, piece in enumerate(pieces[:-1]):
        line = piece.rsplit("\n", 1)[-1]
        if line.startswith(name + "{") and all(label in line for label in labels):
            return i
    raise ValueError(f"no sample {name}{{{','.join(labels)}}} in the template")


def serve_fleet(template: str, layout: Layout, port: int, ready: Any,
                shard: tuple[int, int] = (0, 1), faults: tuple[Fault, ...] = (),
                fault_at: Any = None) -> None:  # fmt: skip
    """The fake-target process: aiohttp on 127.0.0.1:port, /node-<i>/metrics for the nodes
    of ``shard`` (index, count: node i where i % count == index). ``faults`` start at
    ``fault_at.value`` (a shared double, wall-clock seconds; inf until the parent sets it)."""
    from aiohttp import web

    _, slots = parse_template(template)
    index, count = shard
    nodes = {i: parse_template(node_text(template, layout, i))[0]
             for i in range(index, layout.nodes, count)}  # fmt: skip
    slow = [layout.slow(i) for i in range(layout.nodes)]
    faulty: dict[int, list[Fault]] = {}
    for fault in faults:
        faulty.setdefault(fault.node, []).append(fault)
    t0 = time.time()
    cache: dict[tuple[int, bool], list[str]] = {}

    def values(second: int, is_slow: bool) -> list[str]:
        key = (second, is_slow)
        if key not in cache:
            if len(cache) > 4:
                cache.clear()
            cache[key] = values_at(slots, float(second), t0, is_slow)
        return cache[key]

    async def metrics(request: web.Request) -> web.Response:
        node = int(request.match_info["node"])
        pieces = nodes.get(node)  # one more than vals: the text after the last sample
        if pieces is None:
            raise web.HTTPNotFound()
        now = time.time()
        vals = values(int(now), slow[node])
        if node in faulty and now >= fault_at.value:
            vals = list(vals)
            for fault in faulty[node]:
                vals[fault.slot] = repr(float(vals[fault.slot])
                                        + fault.per_s * (now - fault_at.value))
        body = "".join(itertools.chain.from_iterable(zip(pieces[:-1], vals, strict=True)))
        body += pieces[-1]
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        data = body.encode()
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            data = gzip.compress(data, compresslevel=1, mtime=0)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=data, headers=headers)

    app = web.Application()
    app.router.add_get(r"/node-{node:\d+}/metrics", metrics)
    ready.send(sum(len(p) for p in next(iter(nodes.values()), [])))
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None,
                handle_signals=True)


# -- history for the long windows ------------------------------------------------------

def backfill(tmp: Path, layout: Layout, hours: float, step_s: float, end: float) -> None:
    """`hours` of Hostname:stepscope_gpu_info:count before `end` (StepscopeGpuMissing's 6 h
    max_over_time), as blocks in tmp/data, written by promtool."""
    src = tmp / "history.om"
    start = end - hours * 3600
    with src.open("w") as f:
        f.write("# TYPE Hostname:stepscope_gpu_info:count gauge\n")
        for node in range(layout.nodes):
            labels = f'cluster="{layout.cluster(node)}",Hostname="node-{node:04d}"'
            t = start
            while t < end:
                f.write(f"Hostname:stepscope_gpu_info:count{{{labels}}} 8 {t:.3f}\n")
                t += step_s
        f.write("# EOF\n")
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(src),
                    str(tmp / "data")], check=True, stdout=subprocess.DEVNULL)
    src.unlink()


# -- one run ---------------------------------------------------------------------------

def seconds_of(interval: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", interval)
    if not match:
        raise SystemExit(f"--interval {interval!r}: expected e.g. 15s")
    return int(match.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match.group(2)]


def fleet_scrape_config(port: int | list[int], layout: Layout) -> dict[str, Any]:
    """The scrape job for every node of the fake fleet on ``port`` (node i on
    ``port[i % len(port)]`` where the fleet is served in shards), as shipped:
    honor_labels false, the cluster a target label."""
    ports = port if isinstance(port, list) else [port]
    return {
        "job_name": "stepscope", "honor_labels": False,
        "static_configs": [
            {"targets": [f"127.0.0.1:{ports[i % len(ports)]}"],
             "labels": {"__metrics_path__": f"/node-{i:04d}/metrics",
                        "instance": f"node-{i:04d}:9400",
                        "cluster": layout.cluster(i)}}
            for i in range(layout.nodes)],
    }  # fmt: skip


def start_fleet_shards(template: str, layout: Layout, shards: int,
                       faults: tuple[Fault, ...] = (), fault_at: Any = None
                       ) -> tuple[list[Any], list[int], int]:  # fmt: skip
    """The fleet served by ``shards`` processes (one port each, node i by the
    (i % shards)-th, so serving a large fleet is never the bottleneck), started and ready:
    (the processes, their ports, the bytes of one node's body)."""
    ctx = multiprocessing.get_context("fork")
    procs, ports, pipes = [], [], []
    for index in range(shards):
        port = free_port()
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=serve_fleet, daemon=True, args=(
            template, layout, port, send, (index, shards), faults, fault_at))
        proc.start()
        procs.append(proc)
        ports.append(port)
        pipes.append(receive)
    sizes = []
    for receive in pipes:
        if not receive.poll(300):
            raise RuntimeError("the fleet server did not start")
        sizes.append(int(receive.recv()))
    return procs, ports, max(sizes)


def start_fleet(template: str, layout: Layout) -> tuple[Any, int, Any]:
    """The fake-target process started and ready: (the process, its port, what it sent
    when ready: the bytes of one node's body)."""
    procs, ports, size = start_fleet_shards(template, layout, 1)
    return procs[0], ports[0], size


def run(prometheus: str, template: str, layout: Layout, warmup: float, seconds: float,
        interval: str, history_hours: float, rules: Path = RULES,
        compare: list[Path] | None = None) -> dict[str, Any]:
    interval_s = seconds_of(interval)
    compare = [rules, *compare] if compare else []
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bench-"))
    fleet, fleet_port, body_bytes = start_fleet(template, layout)
    proc: subprocess.Popen[bytes] | None = None
    try:
        if history_hours > 0:
            t = time.perf_counter()
            backfill(tmp, layout, history_hours, interval_s, time.time() - 60)
            print(f"  backfilled {history_hours:g} h in {time.perf_counter() - t:.0f} s",
                  flush=True)
        url = f"http://127.0.0.1:{free_port()}"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval,
                       "scrape_timeout": f"{min(interval_s, 10):g}s"},
            "rule_files": [str(p) for p in sorted(rules.glob("*.yml"))],
            "scrape_configs": [fleet_scrape_config(fleet_port, layout), {
                "job_name": "prometheus", "static_configs": [{"targets": [url[7:]]}],
            }],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        with (tmp / "log").open("w") as log:
            proc = subprocess.Popen(
                [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address={url[7:]}",
                 "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=log)
        wait_ready(url, proc, tmp / "log")
        assert fleet.pid is not None
        return measure(url, proc.pid, fleet.pid, layout, warmup, seconds, interval_s,
                       body_bytes, compare)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
        fleet.terminate()
        fleet.join(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def one_by_one(url: str, rules: Path, rounds: int,
               interval_s: float) -> dict[str, dict[str, float]]:
    """Each rule of `rules` evaluated alone through the query API, `rounds` times in turn:
    group -> {"ms": sum of the rules' median times, "samples": samples they read, "per_min":
    ms per minute at the group's interval}. Rule sets compared this way see the same data
    on the same machine at the same time."""
    groups = [g for path in sorted(rules.glob("*.yml"))
              for g in yaml.safe_load(path.read_text())["groups"]]
    exprs = [(g["name"], rule["expr"]) for g in groups for rule in g["rules"]]
    per_min = {g["name"]: 60 / seconds_of(g.get("interval", f"{interval_s:g}s")) for g in groups}
    times: list[list[float]] = [[] for _ in exprs]
    samples = [0] * len(exprs)
    for _ in range(rounds):
        for i, (_, expr) in enumerate(exprs):
            # count() keeps the answer small: the engine's own time, not JSON of 32,000 series
            q = urllib.parse.urlencode({"query": f"count(({expr}))", "stats": "all"})
            stats = json.loads(get(f"{url}/api/v1/query?{q}", timeout=120))["data"]["stats"]
            times[i].append(float(stats["timings"]["evalTotalTime"]))
            samples[i] = int(stats["samples"]["totalQueryableSamples"])
    out: dict[str, dict[str, float]] = {}
    for (group, _), t, n in zip(exprs, times, samples, strict=True):
        entry = out.setdefault(group, {"ms": 0.0, "samples": 0, "per_min": 0.0})
        entry["ms"] += 1000 * statistics.median(t)
        entry["samples"] += n
        entry["per_min"] += 1000 * statistics.median(t) * per_min[group]
    return out


def measure(url: str, prom_pid: int, fleet_pid: int, layout: Layout, warmup: float,
            seconds: float, interval_s: float, body_bytes: int,
            compare: list[Path]) -> dict[str, Any]:
    def query(q: str) -> list[dict[str, Any]]:
        body = json.loads(get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": q}),
                              timeout=120))
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(q: str) -> float:
        result = query(q)
        return float(result[0]["value"][1]) if result else float("nan")

    def load() -> float:
        return os.getloadavg()[0]

    loads: list[float] = []
    end_warmup = time.monotonic() + warmup
    while time.monotonic() < end_warmup:
        loads.append(load())
        time.sleep(min(10.0, max(0.0, end_warmup - time.monotonic())))
    warm_loads = loads
    loads = []
    prom, fleet_proc = psutil.Process(prom_pid), psutil.Process(fleet_pid)
    cpu0 = {"prometheus": sum(prom.cpu_times()[:2]), "fleet": sum(fleet_proc.cpu_times()[:2]),
            "self": sum(psutil.Process().cpu_times()[:2])}
    t_start = time.monotonic()
    groups: dict[str, dict[str, float]] = {}  # group -> lastEvaluation -> seconds
    rules: dict[str, list[float]] = {}
    seen: set[tuple[str, str]] = set()
    poll = min(5.0, interval_s / 2)
    while time.monotonic() - t_start < seconds:
        loads.append(load())
        for group in json.loads(get(url + "/api/v1/rules", timeout=60))["data"]["groups"]:
            key = (group["name"], group["lastEvaluation"])
            if key in seen or group["lastEvaluation"].startswith("0001"):
                continue
            seen.add(key)
            groups.setdefault(group["name"], {})[group["lastEvaluation"]] = float(
                group["evaluationTime"])
            for rule in group["rules"]:
                rules.setdefault(rule["name"], []).append(float(rule["evaluationTime"]))
        time.sleep(poll)
    elapsed = time.monotonic() - t_start
    cpu = {"prometheus": sum(prom.cpu_times()[:2]) - cpu0["prometheus"],
           "fleet": sum(fleet_proc.cpu_times()[:2]) - cpu0["fleet"],
           "self": sum(psutil.Process().cpu_times()[:2]) - cpu0["self"]}
    window = f"{int(elapsed)}s"
    latencies = {}
    for name, q in QUERIES.items():
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            query(q)
            times.append(time.perf_counter() - t0)
        latencies[name] = statistics.median(times)
    alerts = {s["metric"]["alertname"] + "/" + s["metric"]["alertstate"]: int(float(s["value"][1]))
              for s in query("count by (alertname, alertstate) (ALERTS)")}
    p = '{job="prometheus"}'
    return {
        "nodes": layout.nodes,
        "jobs": len({layout.job(i)[0] for i in range(layout.nodes)}),
        "ranks": 8 * layout.nodes,
        "body_kib": body_bytes / 1024,
        "targets_up": scalar('sum(up{job="stepscope"})'),
        "series_per_node": scalar('avg(scrape_samples_scraped{job="stepscope"})'),
        "head_series": scalar(f"prometheus_tsdb_head_series{p}"),
        "samples_per_s": scalar(f"rate(prometheus_tsdb_head_samples_appended_total{p}[{window}])"),
        "rss_mib": scalar(f"max_over_time(process_resident_memory_bytes{p}[{window}])") / 2**20,
        "heap_inuse_mib": scalar(
            f"max_over_time(go_memstats_heap_inuse_bytes{p}[{window}])") / 2**20,
        "heap_alloc_mib": scalar(f"go_memstats_alloc_bytes{p}") / 2**20,
        "scrape_ms_avg": 1000 * scalar(
            f'avg(avg_over_time(scrape_duration_seconds{{job="stepscope"}}[{window}]))'),
        "scrape_ms_max": 1000 * scalar(
            f'max(max_over_time(scrape_duration_seconds{{job="stepscope"}}[{window}]))'),
        "interval_p99_s": scalar(
            'max(prometheus_target_interval_length_seconds{quantile="0.99"})'),
        "eval_failures": scalar(f"sum(prometheus_rule_evaluation_failures_total{p})"),
        "missed_iterations": {
            s["metric"]["rule_group"].split(";")[-1]: round(float(s["value"][1])) for s in query(
                f"increase(prometheus_rule_group_iterations_missed_total{p}[{window}])")},
        "compare": {str(d): one_by_one(url, d, 5, interval_s) for d in compare},
        "cpu_cores": {k: v / elapsed for k, v in cpu.items()},
        "load_warmup": [min(warm_loads, default=0), max(warm_loads, default=0)],
        "load_measure": [min(loads), max(loads)],
        "seconds": elapsed,
        "groups_s": {g: list(v.values()) for g, v in sorted(groups.items())},
        "rules_s": rules,
        "query_ms": {k: 1000 * v for k, v in latencies.items()},
        "alerts": alerts,
    }


# -- report -----------------------------------------------------------------------------

def report(results: list[dict[str, Any]], interval: str) -> None:
    head = ["nodes", "ranks", "series/node", "head series", f"samples/s ({interval})",
            "RSS MiB (max)", "heap in use MiB", "scrape ms avg/max", "Prometheus cores",
            "fleet server cores", "load avg 1m (min-max)"]
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in results:
        c = r["cpu_cores"]
        print("| " + " | ".join([
            f"{r['nodes']:,}", f"{r['ranks']:,}", f"{r['series_per_node']:.0f}",
            f"{r['head_series']:,.0f}", f"{r['samples_per_s']:,.0f}", f"{r['rss_mib']:,.0f}",
            f"{r['heap_inuse_mib']:,.0f}", f"{r['scrape_ms_avg']:.1f} / {r['scrape_ms_max']:.0f}",
            f"{c['prometheus']:.2f}", f"{c['fleet']:.2f}",
            f"{r['load_measure'][0]:.1f}-{r['load_measure'][1]:.1f}"]) + " |")
    for r in results:
        print(f"\n{r['nodes']:,} nodes: rule groups over {r['seconds']:.0f} s "
              f"(targets up {r['targets_up']:.0f}, evaluation failures "
              f"{r['eval_failures']:.0f}, "
              f"load during warm-up {r['load_warmup'][0]:.1f}-{r['load_warmup'][1]:.1f})")
        print("\n| group | evaluations | p50 ms | max ms | iterations missed |")
        print("|---|---|---|---|---|")
        for g, v in r["groups_s"].items():
            print(f"| {g} | {len(v)} | {1000 * statistics.median(v):.0f} "
                  f"| {1000 * max(v):.0f} | {r['missed_iterations'].get(g, 0)} |")
        print("\n| costliest rules (ms) | p50 | max |")
        print("|---|---|---|")
        ranked = sorted(r["rules_s"].items(), key=lambda kv: -statistics.median(kv[1]))
        for name, v in ranked[:10]:
            print(f"| {name} | {1000 * statistics.median(v):.0f} | {1000 * max(v):.0f} |")
        print("\nalerts at the end:", ", ".join(f"{k} {v}" for k, v in sorted(r["alerts"].items()))
              or "none")
    for r in results:
        if not r["compare"]:
            continue
        sets = list(r["compare"])
        print(f"\n{r['nodes']:,} nodes, each rule alone (sum of medians of 5, ms; samples "
              "read): " + " vs ".join(sets))
        print("\n| group | " + " | ".join(sets) + " |")
        print("|---|" + "---|" * len(sets))
        for g in sorted({g for c in r["compare"].values() for g in c}):
            cells = [f"{c[g]['ms']:.0f} ({c[g]['samples']:,.0f})" if g in c else ""
                     for c in r["compare"].values()]
            print(f"| {g} | " + " | ".join(cells) + " |")
        print("| all, ms per minute at the groups' intervals | " + " | ".join(
            f"{sum(e['per_min'] for e in c.values()):,.0f}" for c in r["compare"].values())
            + " |")
    print("\n| query (ms, median of 7) | " + " | ".join(f"{r['nodes']:,} nodes" for r in results)
          + " |")
    print("|---|" + "---|" * len(results))
    for name in QUERIES:
        print(f"| {name} | " + " | ".join(f"{r['query_ms'][name]:.1f}" for r in results) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000])
    parser.add_argument("--nodes-per-job", type=int, default=250,
                        help="nodes of one training job (8 ranks each); default 250")
    parser.add_argument("--interval", default="15s", help="scrape and evaluation interval")
    parser.add_argument("--warmup", type=float, default=600.0,
                        help="seconds before measuring (default 600: the 10 m windows full)")
    parser.add_argument("--seconds", type=float, default=180.0,
                        help="seconds of measurement (every evaluation of every group kept)")
    parser.add_argument("--history-hours", type=float, default=6.0,
                        help="hours backfilled for the rules' longest window (0: none)")
    parser.add_argument("--rules", type=Path, default=RULES,
                        help="directory of rule files to load (default: the shipped rules)")
    parser.add_argument("--compare", type=Path, nargs="*", default=[],
                        help="other rule directories: after the run, evaluate every rule of "
                             "--rules and of these alone through the query API, in turn")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None or shutil.which("promtool") is None:
        print("needs prometheus and promtool (Debian package prometheus)", file=sys.stderr)
        return 2
    template = one_node_exposition()
    print(f"one node: {sum(1 for ln in template.splitlines() if ln and ln[0] != '#')} "
          f"samples; {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB "
          f"here; load average now {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for n in args.nodes:
        print(f"{n} nodes: warm-up {args.warmup:.0f} s, then {args.seconds:.0f} s measured",
              flush=True)
        layout = Layout(n, args.nodes_per_job)
        results.append(run(prometheus, template, layout, args.warmup, args.seconds,
                           args.interval, args.history_hours, args.rules, args.compare))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    report(results, args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
