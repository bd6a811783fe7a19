"""A fleet of simulated nodes into VictoriaMetrics, vmalert evaluating the shipped rules:
what the central tier costs at 10,000 nodes, and how long a fault takes to reach the notifier.

    python -m benchmarks.bench_victoriametrics_scale --nodes 10000 --out OUT/fleet --bin-dir .devbin
    python -m benchmarks.bench_victoriametrics_scale --nodes 200 --out /tmp/fleet   # a rehearsal

What each node serves is bench_prometheus_scale's: the exposition of a real `stepscope serve
--simulate 8` with 8 ranks of a training job reporting steps, relabelled per node (Hostname,
GPU UUIDs, training job, global rank), values moving every second, a few slow nodes per job
(so straggler alerts fire as in a real fleet). The fleet is served by several processes
(``--shards``), each building its nodes' text pieces once and joining them with the second's
values per scrape, uncompressed: serving 10,000 nodes costs them a fraction of a core.

**How the samples get in.** Single-node VictoriaMetrics 1.79 scrapes every node itself
every 15 s (``-promscrape.config``, the shipped scrape settings: honor_labels false,
`cluster` a target label), so every node has its `up` and `scrape_*` series as through an
agent, and no Python process has to encode 400,000 samples a second into remote-write
protobuf (snappy). VictoriaMetrics' process then does an agent's scraping and parsing as
well as the store's ingestion: its CPU here bounds the store's from above.

**The ruler.** vmalert with the documented flags (tests/support/scaleout.vmalert:
``-evaluationInterval=15s``, ``-datasource.queryStep=15s``, remote write and read to
VictoriaMetrics, ``-search.latencyOffset=5s`` on the store) evaluates the shipped
deploy/prometheus/rules-victoriametrics/ unchanged and notifies a local webhook (standing
for Alertmanager). The fleet-size flags it needs on top (``--vm-flag`` / ``--vmalert-flag``
replace them) are printed with the results.

**Faults.** ``--fault-after`` seconds after the first scrape, GPU 3 of one node starts
throttling for temperature (its violation counter rises 0.5 s a second) and one rank of
another node computes 50% longer per step. Onset to alert is the time from then until
vmalert's first notification of StepscopeGpuThermalViolation / StepscopeRankStraggler
naming that node (and the alert's startsAt, vmalert's firing time).

**Measured** over the stretch from ``--settle`` seconds after the first scrape (every
series created) to the end, from the servers' own /metrics: samples accepted a second
(scraped, and written back by vmalert), VictoriaMetrics' RSS (max) and CPU, its data
directory's growth (bytes a day extrapolated, bytes a sample) beside its own
``vm_data_size_bytes`` / ``vm_rows``, active series, scrapes a second against the
expected, every rule group's evaluation time (vmalert's summary: p50 and max over its
last 5 minutes), rule errors, missed iterations. ``--budget`` bounds the whole run
(default 480 s); it writes fleet.json and fleet.md (and the two servers' log tails) to
``--out`` whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from benchmarks.bench_prometheus_scale import (
    QUERIES,
    Fault,
    Layout,
    fleet_scrape_config,
    one_node_exposition,
    parse_template,
    start_fleet_shards,
    template_slot,
)
from tests.support import parse_samples
from tests.support.scaleout import Webhook, victoria_metrics, vmalert

INTERVAL = "15s"
THERMAL_GPU = "3"
STRAGGLER_LOCAL_RANK = 5
# up, scrape_duration_seconds, scrape_samples_scraped, scrape_samples_post_metric_relabeling,
# scrape_series_added: what the scraper adds to every target
AUTO_SERIES = 5
LOG_TAIL = 2 * 2**20  # bytes of each server's log kept in --out


def vm_flags(nodes: int, scrape_config: Path) -> list[str]:
    """The flags VictoriaMetrics needs here beyond tests/support/scaleout's documented ones:
    the scrape config, and a per-query series limit above the largest selector the rules
    read (the ranks' phase counters, 4 phases x 8 ranks = 32 a node: 320,000 at 10,000
    nodes, over 1.79's default of 300,000)."""
    return [f"-promscrape.config={scrape_config}", "-promscrape.suppressScrapeErrors",
            f"-search.maxUniqueTimeseries={max(300_000, 64 * nodes)}"]  # fmt: skip


def vmalert_flags(nodes: int) -> list[str]:
    """vmalert's remote-write queue sized for the recorded series of ``nodes`` (the default
    100,000 pending samples is less than one evaluation of the per-rank phase rule at
    10,000 nodes)."""
    return [f"-remoteWrite.maxQueueSize={max(100_000, 200 * nodes)}",
            "-remoteWrite.maxBatchSize=10000", "-remoteWrite.concurrency=4"]  # fmt: skip


class OutOfTime(Exception):
    """The --budget alarm: stop measuring, report what there is."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise OutOfTime()


def server_metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A server's own /metrics, parsed."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        return parse_samples(resp.read().decode())


def total(m: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples carrying ``labels`` (0 when absent)."""
    return sum(v for lab, v in m.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (files that vanish mid-walk, merged away, skipped)."""
    size = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                size += os.stat(os.path.join(root, name)).st_size
    return size


def snapshot(vm_url: str, vma_url: str, data: Path, fleet: list[Any]) -> dict[str, Any]:
    """What the stretch's rates are computed from, at one moment."""
    vm = server_metrics(vm_url)
    vma = server_metrics(vma_url)
    return {
        "t": time.time(),
        "rows": {lab.get("type", ""): v for lab, v in vm.get("vm_rows_inserted_total", [])},
        "vm_cpu_s": total(vm, "process_cpu_seconds_total"),
        "vmalert_cpu_s": total(vma, "process_cpu_seconds_total"),
        "fleet_cpu_s": sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in fleet),
        "scrapes": total(vm, "vm_promscrape_scrapes_total"),
        "scrapes_failed": total(vm, "vm_promscrape_scrapes_failed_total"),
        "scrape_s_sum": total(vm, "vm_promscrape_scrape_duration_seconds_sum"),
        "scrape_n": total(vm, "vm_promscrape_scrape_duration_seconds_count"),
        "disk": {sub: dir_bytes(data / sub) for sub in ("data", "indexdb")},
        "vm_size": {lab["type"]: v for lab, v in vm.get("vm_data_size_bytes", [])},
        "vm_rows": {lab["type"]: v for lab, v in vm.get("vm_rows", [])},
        "new_series": total(vm, "vm_new_timeseries_created_total"),
    }


class Onsets:
    """The first vmalert notification of each watched alert, from the webhook's posts."""

    def __init__(self, webhook: Webhook, wanted: dict[str, dict[str, str]]) -> None:
        self.webhook = webhook
        self.wanted = wanted  # name -> labels the notified alert must carry
        self.seen: dict[str, dict[str, Any]] = {}
        self._done = 0
        self._offset = time.time() - time.monotonic()  # the webhook stamps monotonic time

    def poll(self, onset: float) -> None:
        received, arrived = self.webhook.received, self.webhook.arrived
        n = min(len(received), len(arrived))
        for (_, body), when in zip(received[self._done:n], arrived[self._done:n], strict=True):
            for alert in body if isinstance(body, list) else []:
                labels = alert.get("labels", {})
                for name, want in self.wanted.items():
                    if name in self.seen or any(labels.get(k) != v for k, v in want.items()):
                        continue
                    self.seen[name] = {
                        "notified_after_s": when + self._offset - onset,
                        "starts_after_s": _unix(alert.get("startsAt", "")) - onset,
                    }
        self._done = n


def _unix(stamp: str) -> float:
    """An RFC 3339 time (Go's, up to nanoseconds) as Unix seconds; nan when unparseable."""
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)", stamp)
    if not m:
        return math.nan
    from datetime import datetime

    frac = (m.group(2) or ".0")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + zone).timestamp()


def groups_of(vma: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, dict[str, float]]:
    """Every rule group's evaluations: count, p50 and max seconds (vmalert's summary over
    its last 5 minutes), missed iterations."""
    out: dict[str, dict[str, float]] = {}
    for lab, v in vma.get("vmalert_iteration_duration_seconds", []):
        q = lab.get("quantile")
        if q in ("0.5", "1"):
            out.setdefault(lab["group"], {})["p50" if q == "0.5" else "max"] = v
    for lab, v in vma.get("vmalert_iteration_total", []):
        out.setdefault(lab["group"], {})["evaluations"] = v
    for lab, v in vma.get("vmalert_iteration_missed_total", []):
        out.setdefault(lab["group"], {})["missed"] = v
    return out


def run(args: argparse.Namespace, out: Path, deadline: float, result: dict[str, Any]) -> None:
    """The benchmark; its figures go into ``result`` as they come (kept if time runs out)."""
    layout = Layout(args.nodes, args.nodes_per_job)
    result.update({
        "nodes": args.nodes, "nodes_per_job": args.nodes_per_job, "interval": INTERVAL,
        "cpus": os.cpu_count(), "memory_gib": psutil.virtual_memory().total / 2**30,
    })  # fmt: skip
    t = time.monotonic()
    template = one_node_exposition()
    _, slots = parse_template(template)
    result["series_per_node"] = len(slots)
    print(f"one node: {len(slots)} samples, {len(template):,} bytes "
          f"({time.monotonic() - t:.0f} s)", flush=True)  # fmt: skip

    # the faulty nodes: healthy ones, one in each half of the fleet
    healthy = [i for i in range(layout.nodes) if not layout.slow(i)]
    thermal_node = healthy[min(2, len(healthy) - 1)]
    straggler_node = next((i for i in healthy if i >= layout.nodes // 2 + 2), healthy[-1])
    job, index, _ = layout.job(straggler_node)
    rank = 8 * index + STRAGGLER_LOCAL_RANK
    compute = template_slot(template, "stepscope_step_phase_seconds_total",
                            'phase="compute"', f'local_rank="{STRAGGLER_LOCAL_RANK}"')
    faults = (
        Fault(thermal_node, template_slot(template, "DCGM_FI_DEV_THERMAL_VIOLATION",
                                          f'gpu="{THERMAL_GPU}"'), 0.5e9),
        # the compute phase counter rises 10% of its template value a second: half as fast again
        Fault(straggler_node, compute, 0.05 * slots[compute].v0),
    )  # fmt: skip
    wanted = {
        "StepscopeGpuThermalViolation": {"alertname": "StepscopeGpuThermalViolation",
                                         "Hostname": f"node-{thermal_node:04d}",
                                         "gpu": THERMAL_GPU},
        "StepscopeRankStraggler": {"alertname": "StepscopeRankStraggler",
                                   "Hostname": f"node-{straggler_node:04d}",
                                   "rank": str(rank)},
    }  # fmt: skip
    result["faults"] = {"thermal": f"node-{thermal_node:04d} GPU {THERMAL_GPU}",
                        "straggler": f"node-{straggler_node:04d} rank {rank} ({job})"}

    fault_at = multiprocessing.get_context("fork").Value("d", math.inf)
    t = time.monotonic()
    shards = args.shards or max(1, min(8, (os.cpu_count() or 2) // 2, math.ceil(args.nodes / 1000)))
    fleet, ports, body = start_fleet_shards(template, layout, shards, faults, fault_at)
    print(f"fleet: {args.nodes:,} nodes in {shards} processes ({time.monotonic() - t:.0f} s), "
          f"{body:,} bytes a node", flush=True)  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="stepscope-bench-vm-", dir=args.tmp))
    servers: list[Any] = []
    webhook = Webhook()
    try:
        scrape = fleet_scrape_config(ports, layout)
        scrape["disable_compression"] = True  # the fleet serves plain text (its CPU, not VM's)
        config = tmp / "scrape.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": INTERVAL, "scrape_timeout": "10s"},
            "scrape_configs": [scrape]}))  # fmt: skip
        vm_extra = vm_flags(args.nodes, config)
        if args.vm_flag is not None:
            vm_extra = [f"-promscrape.config={config}", *args.vm_flag]
        vma_extra = vmalert_flags(args.nodes) if args.vmalert_flag is None else args.vmalert_flag
        vm = victoria_metrics(tmp, INTERVAL, vm_extra)
        servers.append(vm)
        t_scrape = time.time()
        vma = vmalert(tmp, vm.url, [webhook.url], INTERVAL, vma_extra)
        servers.append(vma)
        result["flags"] = {"victoria-metrics": vm.argv[1:], "vmalert": vma.argv[1:]}
        print("victoria-metrics", " ".join(a for a in vm.argv[1:] if "Path" not in a), flush=True)
        print("vmalert", " ".join(a for a in vma.argv[1:] if "-rule=" not in a), flush=True)
        onsets = Onsets(webhook, wanted)
        data = tmp / "vm" / "data"
        first: dict[str, Any] | None = None
        rss_max = {"victoria-metrics": 0.0, "vmalert": 0.0}
        last_print = 0.0
        expected = args.nodes * (len(slots) + AUTO_SERIES) / 15
        while True:
            now = time.time()
            since = now - t_scrape
            if math.isinf(fault_at.value) and since >= args.fault_after:
                fault_at.value = now
                result["fault_at_s"] = since
                print(f"{since:5.0f} s  faults injected: {result['faults']}", flush=True)
            if first is None and since >= args.settle:
                first = snapshot(vm.url, vma.url, data, fleet)
            vmm, vmam = server_metrics(vm.url), server_metrics(vma.url)
            for name, m in (("victoria-metrics", vmm), ("vmalert", vmam)):
                rss_max[name] = max(rss_max[name], total(m, "process_resident_memory_bytes"))
            if not math.isinf(fault_at.value):
                onsets.poll(fault_at.value)
            if now - last_print >= 15:
                last_print = now
                seen = ", ".join(f"{k} {v['notified_after_s']:.0f} s"
                                 for k, v in onsets.seen.items())  # fmt: skip
                active = total(vmm, "vm_cache_entries", type="storage/hour_metric_ids")
                print(f"{since:5.0f} s  rows {total(vmm, 'vm_rows_inserted_total'):,.0f}, "
                      f"active series {active:,.0f}, "
                      f"VM RSS {total(vmm, 'process_resident_memory_bytes') / 2**30:.1f} GiB, "
                      f"rule errors {rule_errors(vmam):.0f}, load {os.getloadavg()[0]:.1f}"
                      + (f"; notified: {seen}" if seen else ""), flush=True)  # fmt: skip
            done = (first is not None and len(onsets.seen) == len(wanted)
                    and now - first["t"] >= args.min_measure)  # fmt: skip
            if done or time.monotonic() > deadline - args.reserve:
                break
            time.sleep(5)
        if first is None:
            raise OutOfTime()
        last = snapshot(vm.url, vma.url, data, fleet)
        vmm, vmam = server_metrics(vm.url), server_metrics(vma.url)
        result.update(measured(first, last, vmm, vmam, expected))
        result["rss_max_mib"] = {k: v / 2**20 for k, v in rss_max.items()}
        result["onset_s"] = onsets.seen
        result["onset_wanted"] = sorted(wanted)
        result["alerts_firing"] = {lab["alertname"]: v for lab, v in
                                   vmam.get("vmalert_alerts_firing", []) if v}  # fmt: skip
        result["load"] = os.getloadavg()[0]
        result["query_ms"] = {}  # filled as each query is timed
        query_times(vm.url, deadline - args.reserve / 2, result["query_ms"])
    finally:
        signal.alarm(0)  # the shutdown below is bounded (SIGKILL after 10 s); let it finish
        webhook.stop()
        for server in reversed(servers):
            server.stop()
            log = server.log_path.read_bytes()
            (out / f"{server.name}.log").write_bytes(log[-LOG_TAIL:])
        for proc in fleet:
            proc.terminate()
            proc.join(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def query_times(url: str, until: float, out: dict[str, float]) -> None:
    """A dashboard's instant queries (bench_prometheus_scale's, raw and recorded), the
    median of 3 in ms each into ``out``, as long as time is left before ``until``."""
    for name, q in QUERIES.items():
        times = []
        for _ in range(3):
            if time.monotonic() > until:
                return
            t = time.perf_counter()
            with urllib.request.urlopen(
                    f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": q}),
                    timeout=30) as resp:  # fmt: skip
                resp.read()
            times.append(time.perf_counter() - t)
        out[name] = 1000 * statistics.median(times)


# vmalert 1.79 counts failed evaluations in vmalert_execution_errors_total and flags each
# failing rule with a 0/1 gauge; later releases add per-rule *_errors_total counters
ERROR_COUNTERS = ("vmalert_execution_errors_total", "vmalert_alerting_rules_errors_total",
                  "vmalert_recording_rules_errors_total")
ERROR_GAUGES = ("vmalert_alerting_rules_error", "vmalert_recording_rules_error")


def rule_errors(vma: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    """Evaluation errors so far, alerting and recording rules together: the failed
    evaluations vmalert counts, or where it only flags them, the rules failing now."""
    counted = max(total(vma, "vmalert_execution_errors_total"),
                  total(vma, "vmalert_alerting_rules_errors_total")
                  + total(vma, "vmalert_recording_rules_errors_total"))
    return max(counted, sum(total(vma, name) for name in ERROR_GAUGES))


def failing_rules(vma: dict[str, list[tuple[dict[str, str], float]]]) -> dict[str, float]:
    """The rules with errors, by name, from whichever of vmalert's series name them."""
    return {lab.get("alertname") or lab.get("recording") or lab.get("rule", "?"): v
            for name in ERROR_GAUGES + ERROR_COUNTERS[1:]
            for lab, v in vma.get(name, []) if v}


def measured(a: dict[str, Any], b: dict[str, Any], vm: dict[str, Any], vma: dict[str, Any],
             expected: float) -> dict[str, Any]:  # fmt: skip
    """The stretch's figures from its two snapshots and the servers' last metrics."""
    dt = b["t"] - a["t"]
    rows = {k: (b["rows"].get(k, 0.0) - a["rows"].get(k, 0.0)) / dt for k in b["rows"]}
    disk_rate = {k: (b["disk"][k] - a["disk"][k]) / dt for k in b["disk"]}
    stored = sum(v for k, v in b["vm_size"].items() if k.startswith("storage/"))
    stored_rows = sum(v for k, v in b["vm_rows"].items() if k.startswith("storage/"))
    samples = sum(rows.values())
    scrape_n = b["scrape_n"] - a["scrape_n"]
    return {
        "seconds": dt,
        "samples_per_s": samples,
        "samples_per_s_by_type": rows,
        "samples_per_s_expected_scraped": expected,
        "scrapes_per_s": (b["scrapes"] - a["scrapes"]) / dt,
        "scrapes_failed": b["scrapes_failed"] - a["scrapes_failed"],
        "scrape_ms_avg": 1000 * (b["scrape_s_sum"] - a["scrape_s_sum"]) / scrape_n
        if scrape_n else math.nan,
        "cores": {"victoria-metrics": (b["vm_cpu_s"] - a["vm_cpu_s"]) / dt,
                  "vmalert": (b["vmalert_cpu_s"] - a["vmalert_cpu_s"]) / dt,
                  "fleet": (b["fleet_cpu_s"] - a["fleet_cpu_s"]) / dt},
        "disk_bytes": b["disk"],
        "disk_bytes_per_s": disk_rate,
        "disk_gib_per_day": {k: v * 86400 / 2**30 for k, v in disk_rate.items()},
        "disk_bytes_per_sample": disk_rate["data"] / samples if samples else math.nan,
        "vm_bytes_per_stored_row": stored / stored_rows if stored_rows else math.nan,
        "vm_data_size_bytes": b["vm_size"],
        "active_series": total(vm, "vm_cache_entries", type="storage/hour_metric_ids"),
        "series_created": b["new_series"],
        "rule_errors": rule_errors(vma),
        "rule_errors_by_rule": failing_rules(vma),
        "groups": groups_of(vma),
        "remote_write": {name: total(vma, name) for name in vma
                         if name.startswith("vmalert_remotewrite_")
                         and not name.endswith(("_bucket", "_sum", "_count"))},
        "notifier": {name: total(vma, name) for name in vma
                     if name.startswith("vmalert_alerts_send")},
    }


def report(r: dict[str, Any]) -> str:
    """The results as Markdown."""
    if "seconds" not in r:
        return f"# {r['nodes']:,} nodes: no measurement ({r.get('error', 'out of time')})\n"
    rows = r["samples_per_s_by_type"]
    lines = [
        f"# {r['nodes']:,} nodes into VictoriaMetrics, vmalert on the shipped rules",
        "",
        f"{r['cpus']} CPUs, {r['memory_gib']:.0f} GiB; {r['series_per_node']} series a node, "
        f"scraped every {r['interval']}; measured {r['seconds']:.0f} s (load average at the "
        f"end {r['load']:.1f}).",
        "",
        "| | measured |",
        "|---|---:|",
        f"| samples accepted / s (all) | {r['samples_per_s']:,.0f} |",
        *[f"| samples accepted / s ({k}) | {v:,.0f} |" for k, v in sorted(rows.items()) if v],
        f"| scraped samples / s expected ({r['series_per_node']} + {AUTO_SERIES} a node / 15 s) "
        f"| {r['samples_per_s_expected_scraped']:,.0f} |",
        f"| scrapes / s (expected {r['nodes'] / 15:,.1f}); failed in the stretch "
        f"| {r['scrapes_per_s']:,.1f}; {r['scrapes_failed']:,.0f} |",
        f"| scrape duration, average | {r['scrape_ms_avg']:.1f} ms |",
        f"| active series (VictoriaMetrics' hour_metric_ids) | {r['active_series']:,.0f} |",
        f"| VictoriaMetrics RSS, max | {r['rss_max_mib']['victoria-metrics'] / 1024:.2f} GiB |",
        f"| VictoriaMetrics CPU | {r['cores']['victoria-metrics']:.2f} cores |",
        f"| vmalert RSS, max / CPU | {r['rss_max_mib']['vmalert'] / 1024:.2f} GiB / "
        f"{r['cores']['vmalert']:.2f} cores |",
        f"| the fleet's servers' CPU | {r['cores']['fleet']:.2f} cores |",
        f"| data directory growth (samples) | {r['disk_gib_per_day']['data']:,.1f} GiB a day, "
        f"{r['disk_bytes_per_sample']:.2f} bytes a sample |",
        f"| index growth after the series were created | {r['disk_gib_per_day']['indexdb']:,.1f} "
        "GiB a day |",
        f"| VictoriaMetrics' own bytes a stored row (vm_data_size_bytes / vm_rows) "
        f"| {r['vm_bytes_per_stored_row']:.2f} |",
        f"| data directory at the end (data / indexdb) | {r['disk_bytes']['data'] / 2**20:,.0f} "
        f"/ {r['disk_bytes']['indexdb'] / 2**20:,.0f} MiB |",
        f"| rule evaluation errors | **{r['rule_errors']:,.0f}** |",
    ]
    for name in r["onset_wanted"]:
        seen = r["onset_s"].get(name)
        lines.append(f"| onset to notification, {name} ({r['faults'][_fault_of(name)]}) | "
                     + (f"**{seen['notified_after_s']:.0f} s** (firing from "
                        f"{seen['starts_after_s']:.0f} s)" if seen else "not seen") + " |")
    lines += ["", "| rule group | evaluations | p50 ms | max ms | missed |",
              "|---|---:|---:|---:|---:|"]
    for group, g in sorted(r["groups"].items()):
        lines.append(f"| {group} | {g.get('evaluations', 0):.0f} "
                     f"| {1000 * g.get('p50', math.nan):,.0f} "
                     f"| {1000 * g.get('max', math.nan):,.0f} | {g.get('missed', 0):.0f} |")
    p50s = [g["p50"] for g in r["groups"].values() if "p50" in g]
    if p50s:
        lines.append(f"\nGroups' p50 median {1000 * statistics.median(p50s):,.0f} ms; "
                     "p50 and max are vmalert's summary over its last 5 minutes.")
    if r["rule_errors_by_rule"]:
        lines.append("\nRule errors: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                  sorted(r["rule_errors_by_rule"].items())))
    if r.get("query_ms"):
        lines += ["", "| dashboard query (instant, median of 3) | ms |", "|---|---:|"]
        lines += [f"| {k} | {v:,.0f} |" for k, v in r["query_ms"].items()]
    lines.append("\nFiring at the end: " + (", ".join(
        f"{k} {v:.0f}" for k, v in sorted(r["alerts_firing"].items())) or "none"))
    lines.append("vmalert remote write: " + ", ".join(
        f"{k} {v:,.0f}" for k, v in sorted(r["remote_write"].items())))
    lines.append("\nvictoria-metrics " + " ".join(
        a for a in r["flags"]["victoria-metrics"] if "Path" not in a and "config=" not in a))
    lines.append("vmalert " + " ".join(a for a in r["flags"]["vmalert"] if "-rule=" not in a
                                       and "url=" not in a))
    return "\n".join(lines) + "\n"


def _fault_of(alert: str) -> str:
    return "thermal" if "Thermal" in alert else "straggler"


def main() -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--nodes-per-job", type=int, default=250,
                        help="nodes of one training job (8 ranks each); default 250")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for fleet.json, fleet.md and the servers' log tails")
    parser.add_argument("--bin-dir", type=Path, default=None,
                        help="folder holding victoria-metrics and vmalert (default: PATH)")
    parser.add_argument("--budget", type=float, default=480.0,
                        help="seconds the whole run may take (default 480)")
    parser.add_argument("--fault-after", type=float, default=150.0,
                        help="seconds after the first scrape the faults start (default 150)")
    parser.add_argument("--settle", type=float, default=90.0,
                        help="seconds after the first scrape the measured stretch starts")
    parser.add_argument("--min-measure", type=float, default=180.0,
                        help="seconds measured at least once both alerts are notified")
    parser.add_argument("--reserve", type=float, default=45.0,
                        help="seconds of the budget kept for the last reads and shutdown")
    parser.add_argument("--shards", type=int, default=0,
                        help="processes serving the fleet (default: up to 8, one per 1,000 nodes)")
    parser.add_argument("--vm-flag", action="append", default=None,
                        help="a VictoriaMetrics flag instead of the fleet-size ones (repeat)")
    parser.add_argument("--vmalert-flag", action="append", default=None,
                        help="a vmalert flag instead of the fleet-size ones (repeat)")
    parser.add_argument("--tmp", default=None,
                        help="folder for the servers' data (default: TMPDIR)")
    args = parser.parse_args()
    if args.nodes < 4:
        parser.error("--nodes: at least 4 (two faulty nodes among healthy peers)")
    start = time.monotonic()
    deadline = start + args.budget
    if args.bin_dir is not None:
        os.environ["PATH"] = f"{args.bin_dir.resolve()}{os.pathsep}{os.environ.get('PATH', '')}"
    missing = [b for b in ("victoria-metrics", "vmalert") if shutil.which(b) is None]
    if missing:
        print(f"{', '.join(missing)} not found (--bin-dir, or Debian package victoria-metrics)",
              file=sys.stderr)  # fmt: skip
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(args.budget - args.reserve / 3))  # if a read hangs past the loop's deadline
    result: dict[str, Any] = {"nodes": args.nodes}
    try:
        run(args, args.out, deadline, result)
    except OutOfTime:
        result["error"] = "out of time (--budget)"
    except Exception as exc:  # a benchmark reports what broke, with what it has
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        signal.alarm(0)
        result["wall_s"] = time.monotonic() - start
        (args.out / "fleet.json").write_text(json.dumps(result, indent=1, default=str))
        try:
            text = report(result)
        except KeyError as exc:  # stopped between two of the last reads
            text = f"# {args.nodes:,} nodes: incomplete ({exc} missing), see fleet.json\n"
        (args.out / "fleet.md").write_text(text)
        print(text, flush=True)
    ok = "seconds" in result and result["rule_errors"] == 0 and len(result["onset_s"]) == 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
