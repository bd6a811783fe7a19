"""The shipped rules and dashboards against a real Prometheus scraping simulated nodes.

Four `stepscope serve` processes on loopback, each with its own `--hostname`; node-slow's
scenario throttles thermally and runs its GPUs at less than half the others' SM activity,
and its training ranks take 50% longer to compute. A real `prometheus` (Debian package),
started on a free loopback port with a generated config (1 s scrape and evaluation), loads
the shipped rules. The only change to the rules: every `for:` is rewritten to 5 s, so alerts
that wait minutes at a 15 s scrape fire within seconds here; expressions, windows and
thresholds are the shipped ones. Within a deadline the straggler and thermal alerts fire for
node-slow and for no other node, and every dashboard panel query, with its template
variables substituted, returns at least one series.

Both host-label sets (rules and dashboards generated from one source, the exporters
serving that label) run this, each with its own four nodes and Prometheus, started
together with the relabel checks' servers: the tests wait on Prometheus' clock (the
thermal alert's 2-minute rate reaching 10% takes ~12 s of scrapes), not on the CPU, so
the waits overlap. Wall time: about 30 s on 2 cores.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO, Exporter, parse_samples, start_exporter, wait_for
from tests.support.exporter import kill_all
from tests.support.ingest import Datagrams, UdpSteps
from tests.support.ports import free_port
from tests.support.prometheus import CLUSTER, Prometheus, panel_queries

# host label -> (rules, dashboards): both sets, generated from one source, are run
SETS = {
    "Hostname": (REPO / "deploy" / "prometheus" / "rules", REPO / "dashboards" / "json"),
    "hostname": (REPO / "deploy" / "prometheus" / "rules-hostname",
                 REPO / "dashboards" / "json-hostname"),
}
JOB = "e2e-llama"
HEALTHY = ("node-a", "node-b", "node-c")
SLOW = "node-slow"
GPUS = 2
H100_BF16 = 989.4e12

# node-slow: hot (software thermal slowdown on every GPU), SM activity ~0.38 instead of
# ~0.9, and one XID 13 on GPU 0 (so the XID panels have a series to show).
SLOW_SCENARIO = """\
version: 1
name: e2e-slow-node
gpus: 2
model: NVIDIA H100 80GB HBM3
workload: {activity: busy, precision: bf16, level: 0.4}
timeline:
  - {at: 0s, thermal: sw}
  - {at: 1s, gpus: [0], xid: 13}
"""

STRAGGLER_ALERTS = ("StepscopeNodeStraggler", "StepscopeRankStraggler",
                    "StepscopeGpuThermalViolation")


def report_steps(nodes: list[tuple[str, str, list[str]]]) -> UdpSteps:
    """Two training ranks per node reporting a step every 0.25 s over UDP, until stopped;
    ``nodes``: (hostname, udp port, GPU UUIDs)."""
    world = len(nodes) * GPUS

    def datagrams(step: int) -> Datagrams:
        for n, (host, port, uuids) in enumerate(nodes):
            compute = 0.45 if host == SLOW else 0.30
            for local in range(GPUS):
                dur = compute + 0.15
                yield {
                    "v": 1, "type": "step", "job": JOB, "rank": n * GPUS + local,
                    "local_rank": local, "world_size": world, "pid": os.getpid(),
                    "uuid": uuids[local], "step": step, "t": time.time(), "dur": dur,
                    "data": 0.05, "compute": compute, "comm": 0.08, "tokens": 8192,
                    "flops": 0.4 * H100_BF16 * dur, "precision": "bf16", "warmup": False,
                }, ("127.0.0.1", int(port))

    return UdpSteps(0.25, datagrams)


@contextlib.contextmanager
def slow_cluster(tmp: Path, host_label: str) -> Iterator[tuple[Prometheus, list[Exporter]]]:
    """The four nodes serving ``host_label``, their ranks, and a Prometheus with that
    label's rules."""
    scenario = tmp / "slow.yaml"
    scenario.write_text(SLOW_SCENARIO)
    exporters: list[Exporter] = []
    prom: Prometheus | None = None
    senders: UdpSteps | None = None
    try:
        nodes = []
        for host in (*HEALTHY, SLOW):
            port = str(free_port(socket.SOCK_DGRAM))
            gpus = ["--scenario", str(scenario)] if host == SLOW else ["--simulate", str(GPUS)]
            exp = start_exporter([*gpus, "--hostname", host, "--interval", "0.5",
                                  "--slow-interval", "1", "--ingest", f"udp://127.0.0.1:{port}",
                                  "--host-label", host_label])
            exporters.append(exp)
            up = parse_samples(exp.metrics())["stepscope_gpu_up"]
            uuids = [lbl["UUID"] for lbl, _ in sorted(up, key=lambda s: int(s[0]["gpu"]))]
            nodes.append((host, port, uuids))
        senders = report_steps(nodes)
        prom = Prometheus(tmp, [e.address for e in exporters], SETS[host_label][0])
        prom.host_label = host_label
        yield prom, exporters
    finally:
        if senders is not None:
            senders.stop()
        if prom is not None:
            prom.stop()
        kill_all(exporters)


@contextlib.contextmanager
def relabelled(tmp: Path, served: str, stored: str) -> Iterator[Prometheus]:
    """One node serving ``served``, scraped with the documented relabel rule to
    ``stored`` by a Prometheus loading ``stored``'s rules."""
    snippets = yaml.safe_load(
        (REPO / "deploy" / "prometheus" / "host-label-migration.yml").read_text())
    exp = start_exporter(["--simulate", "2", "--hostname", "node-m", "--host-label", served,
                          "--ingest", f"udp://127.0.0.1:{free_port(socket.SOCK_DGRAM)}"])
    prom = None
    try:
        prom = Prometheus(tmp, [exp.address], SETS[stored][0],
                          metric_relabel_configs=snippets[f"to_{stored}"])
        yield prom
    finally:
        if prom is not None:
            prom.stop()
        exp.stop()


RELABELS = [("hostname", "Hostname"), ("Hostname", "hostname")]  # (served, stored)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Any, Any]]:
    """Every server of the module, started together: each test waits on Prometheus'
    clock (its first scrapes, rate windows, `for:`), not on the CPU, so the waits of the
    two host-label sets and of the relabel checks run side by side instead of one after
    another. Keys: a host label (its cluster), a (served, stored) pair (its Prometheus)."""
    with contextlib.ExitStack() as stack:
        out: dict[Any, Any] = {}
        for label in SETS:
            out[label] = stack.enter_context(
                slow_cluster(tmp_path_factory.mktemp(f"cluster-{label}"), label))
        for served, stored in RELABELS:
            out[served, stored] = stack.enter_context(
                relabelled(tmp_path_factory.mktemp(f"relabel-{stored}"), served, stored))
        yield out


@pytest.fixture(params=list(SETS))
def cluster(
    request: pytest.FixtureRequest, servers: dict[Any, Any]
) -> tuple[Prometheus, list[Exporter]]:
    cluster: tuple[Prometheus, list[Exporter]] = servers[request.param]
    return cluster


def alerts_by_name(prom: Prometheus) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for alert in prom.api("alerts")["alerts"]:
        out.setdefault(alert["labels"]["alertname"], []).append(alert)
    return out


def test_straggler_and_thermal_alerts_fire_for_the_slow_node_only_and_every_panel_has_data(
    cluster: tuple[Prometheus, list[Exporter]],
) -> None:
    prom, _ = cluster
    started = time.monotonic()

    def firing() -> dict[str, list[dict[str, Any]]] | None:
        alerts = alerts_by_name(prom)
        done = all(any(a["state"] == "firing" for a in alerts.get(name, []))
                   for name in STRAGGLER_ALERTS)
        return alerts if done else None

    alerts = wait_for(firing, timeout=60, interval=1)
    for name in STRAGGLER_ALERTS:
        # firing or pending: no other node is even on its way to being blamed
        hosts = {a["labels"][prom.host_label] for a in alerts[name]}
        assert {a["labels"]["cluster"] for a in alerts[name]} == {CLUSTER}
        assert hosts == {SLOW}, (name, hosts)
    ranks = {a["labels"]["rank"] for a in alerts["StepscopeRankStraggler"]}
    assert ranks == {"6", "7"}  # node-slow's two ranks
    thermal_gpus = {a["labels"]["gpu"] for a in alerts["StepscopeGpuThermalViolation"]}
    assert thermal_gpus == {"0", "1"}
    # the descriptions carry measured values
    node = alerts["StepscopeNodeStraggler"][0]["annotations"]["description"]
    # its least active GPU against the median node of its job (0.3 / ~0.8 here)
    assert re.search(r"SM active at [34]\d(\.\d+)?% of the median node", node), node
    assert {a["labels"]["severity"] for name in STRAGGLER_ALERTS for a in alerts[name]} == {
        "warning"}
    # the slow node's XID 13 is a warning, not a drain
    assert {a["labels"][prom.host_label] for a in alerts.get("StepscopeGpuXid", [])} <= {SLOW}
    assert "StepscopeGpuXidDrain" not in alerts
    fired_after = time.monotonic() - started

    # template variables as Grafana fills them for the straggler node, GPU 0, the job
    queries = panel_queries(SETS[prom.host_label][1], {
        "Hostname": SLOW, "hostname": SLOW, "gpu": "0", "training_job": JOB, "cluster": CLUSTER})
    assert len(queries) > 40

    def empty() -> list[tuple[str, str, str]]:
        return [q for q in queries if not prom.api("query", query=q[2])["result"]]

    # rate windows and the diagnosis' window may need a few more scrapes
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not empty(), timeout=20, interval=1)
    missing = empty()
    assert missing == [], "panel queries without data:\n" + "\n".join(map(str, missing))
    print(f"alerts fired after {fired_after:.1f} s; {len(queries)} panel queries checked")


@pytest.mark.parametrize(("served", "stored"), RELABELS)
def test_the_documented_relabel_rule_moves_between_host_labels_at_scrape_time(
    served: str, stored: str, servers: dict[Any, Any]
) -> None:
    """An exporter serving one name is stored under the other: history and queries keep
    the name they had (deploy/prometheus/host-label-migration.yml, docs/metrics.md)."""
    prom: Prometheus = servers[served, stored]
    result = wait_for(lambda: prom.api(
        "query", query=f'DCGM_FI_DEV_GPU_UTIL{{{stored}="node-m"}}')["result"] or None,
        timeout=30, interval=0.5)
    assert len(result) == 2
    assert all(served not in r["metric"] for r in result)
    # the rules of the stored name work on the relabelled series
    recorded = wait_for(lambda: prom.api(
        "query", query=f"{stored}:stepscope_gpu_info:count")["result"] or None,
        timeout=30, interval=0.5)
    assert recorded[0]["metric"][stored] == "node-m" and recorded[0]["value"][1] == "2"
