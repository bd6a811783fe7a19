"""The scale-out path with real servers: two Prometheus agents (2.42, `--enable-feature=agent`,
the shipped agent config's keep list and queue settings) each scrape half of a simulated
fleet and remote-write to a central Prometheus (`--web.enable-remote-write-receiver`) that
evaluates the shipped rules, and to VictoriaMetrics with vmalert evaluating the same rule
files. One Prometheus scraping the whole fleet with the same rules is the reference. The
central Prometheus sends its alerts to Alertmanager with the shipped example
configuration; a webhook receiver counts the notifications.

The fleet: six `stepscope serve` exporters of 2 simulated H100s each, one cluster.
node-3 runs slow (SM activity 0.4 against the others' 0.95: a straggler), node-4's GPU 1
is held down for temperature from the start, and node-5 dies 20 s in: its GPU 1 reports
XID 79 and falls off the bus, its GPU 0 (the rank waiting on the lost peer) drops to 0.3.
Every `for:` is 5 s in the test copies of the rules, Alertmanager's group_wait and
group_interval 5 s. Wall time: about 70 s on a 2-core machine (60-90 s), most of it the
scenario's 20 s, vmalert's rule chain over new series, and two 12 s watches for a
second notification group.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import Exporter, start_exporter, wait_for
from tests.support.exporter import kill_all
from tests.support.prometheus import Prometheus
from tests.support.scaleout import (
    RULES,
    Server,
    Webhook,
    alertmanager,
    central_prometheus,
    get_json,
    prometheus_agent,
    victoria_metrics,
    vmalert,
)

pytestmark = pytest.mark.timeout(300)

HOSTS = [f"node-{i}" for i in range(6)]
SLOW, THERMAL, DYING = "node-3", "node-4", "node-5"
DIES_AT = 20  # scenario seconds
SCENARIOS: dict[str, dict[str, Any]] = {
    SLOW: {"gpus": 2, "workload": {"level": 0.4}},
    THERMAL: {"gpus": 2, "timeline": [{"at": 0, "gpus": [1], "thermal": "sw"}]},
    DYING: {"gpus": 2, "timeline": [
        {"at": DIES_AT, "gpus": [1], "xid": 79},
        {"at": DIES_AT, "gpus": [1], "fall_off_bus": True},
        {"at": DIES_AT, "gpus": [0], "level": 0.3},
    ]},
}  # fmt: skip
# what must fire everywhere: (alert, Hostname, gpu)
EXPECTED = {
    ("StepscopeNodeStraggler", SLOW, ""),
    ("StepscopeGpuThermalViolation", THERMAL, "1"),
    ("StepscopeGpuDown", DYING, "1"),
}
# an alert's identity across backends: vmalert adds `alertgroup`, and the label values
# it computes ($value-free) are the same
Key = tuple[str, str, str]


@dataclass
class ScaleOut:
    exporters: dict[str, Exporter]
    reference: Prometheus
    central: Server
    vm: Server
    vmalert: Server
    alertmanager: Server
    webhook: Webhook


def _scenario_args(tmp: Path, host: str) -> list[str]:
    scenario = SCENARIOS.get(host, {"gpus": 2})
    path = tmp / f"{host}.yaml"
    path.write_text(json.dumps(scenario))
    return ["--scenario", str(path), "--hostname", host, "--interval", "1",
            "--slow-interval", "1", "--ingest", f"unix://{tmp / host}.sock"]  # fmt: skip


@pytest.fixture(scope="module")
def scale_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleOut]:
    tmp = tmp_path_factory.mktemp("scale-out")
    exporters: list[Exporter] = []
    servers: list[Server] = []
    reference: Prometheus | None = None
    webhook = Webhook()
    sink = Webhook()  # vmalert must notify something; its alerts are read from its API
    try:
        # the sinks first, so nothing is lost or retried for long at the start
        am = alertmanager(tmp, webhook.url)
        servers.append(am)
        central = central_prometheus(tmp, am.url)
        servers.append(central)
        vm = victoria_metrics(tmp)
        servers.append(vm)
        vma = vmalert(tmp, vm.url, sink.url)
        servers.append(vma)
        with ThreadPoolExecutor(len(HOSTS)) as pool:  # together: one scenario clock
            exporters = list(pool.map(
                lambda h: start_exporter(_scenario_args(tmp, h)), HOSTS))  # fmt: skip
        by_host = dict(zip(HOSTS, exporters, strict=True))
        writes = [f"{central.url}/api/v1/write", f"{vm.url}/api/v1/write"]
        for name, half in (("agent-a", HOSTS[0::2]), ("agent-b", HOSTS[1::2])):
            servers.append(prometheus_agent(tmp, name, [by_host[h].address for h in half],
                                            writes))  # fmt: skip
        (tmp / "reference").mkdir()
        reference = Prometheus(tmp / "reference", [e.address for e in exporters], RULES)
        yield ScaleOut(by_host, reference, central, vm, vma, am, webhook)
    finally:
        if reference is not None:
            reference.stop()
        for server in reversed(servers):
            server.stop()
        kill_all(exporters)
        webhook.stop()
        sink.stop()


def _keys(alerts: list[dict[str, Any]] | None) -> set[Key]:
    return {(a["labels"]["alertname"], a["labels"].get("Hostname", ""),
             a["labels"].get("gpu", "")) for a in alerts or []
            if a["state"] == "firing"}  # fmt: skip  (vmalert says null for none)


def prometheus_firing(url: str) -> set[Key]:
    return _keys(get_json(f"{url}/api/v1/alerts")["data"]["alerts"])


def vmalert_firing(url: str) -> set[Key]:
    return _keys(get_json(f"{url}/api/v1/alerts")["data"]["alerts"])


def test_central_prometheus_and_vmalert_fire_what_one_prometheus_fires(
    scale_out: ScaleOut,
) -> None:
    """The straggler node, the thermal GPU and the GPU off the bus, in all three; then
    every firing alert's (name, node, GPU) is the same in all three."""
    backends: dict[str, Callable[[], set[Key]]] = {
        "one Prometheus": lambda: prometheus_firing(scale_out.reference.url),
        "central Prometheus": lambda: prometheus_firing(scale_out.central.url),
        "vmalert on VictoriaMetrics": lambda: vmalert_firing(scale_out.vmalert.url),
    }
    last: dict[str, set[Key]] = {}

    def all_fire_the_expected() -> bool:
        last.update({name: read() for name, read in backends.items()})
        return all(got >= EXPECTED for got in last.values())

    try:
        wait_for(all_fire_the_expected, timeout=150, interval=1)
    except AssertionError:
        raise AssertionError(f"missing: { {n: EXPECTED - g for n, g in last.items()} }; "
                             f"firing: {last}") from None  # fmt: skip

    def same_everywhere() -> bool:
        last.update({name: read() for name, read in backends.items()})
        return len({frozenset(got) for got in last.values()}) == 1

    try:  # alerts whose `for:` ends a second apart in each backend: allow them to settle
        wait_for(same_everywhere, timeout=30, interval=1)
    except AssertionError:
        ref = last["one Prometheus"]
        raise AssertionError(str({n: {"extra": g - ref, "missing": ref - g}
                                  for n, g in last.items()})) from None  # fmt: skip


def test_agents_send_only_what_is_read(scale_out: ScaleOut) -> None:
    """The central store holds the kept names (rules' inputs, `up`) and none of what the
    shipped keep list drops, though the exporters serve it."""
    def names(url: str) -> set[str]:
        data: list[str] = get_json(f"{url}/api/v1/label/__name__/values")["data"]
        return set(data)

    served = names(scale_out.reference.url)
    central = wait_for(lambda: (n := names(scale_out.central.url)) and "up" in n and n,
                       timeout=30)  # fmt: skip
    assert {"up", "DCGM_FI_PROF_SM_ACTIVE", "stepscope_gpu_up", "stepscope_gpu_info"} <= central
    assert {"process_cpu_seconds_total", "DCGM_FI_DEV_ENC_UTIL"} <= served
    assert not {n for n in central if n.startswith("process_")}
    assert "DCGM_FI_DEV_ENC_UTIL" not in central
    vm = names(scale_out.vm.url)
    assert "DCGM_FI_DEV_ENC_UTIL" not in vm and "DCGM_FI_PROF_SM_ACTIVE" in vm


def _node_groups(webhook: Webhook, host: str) -> dict[str, list[dict[str, Any]]]:
    """Notifications naming ``host``, by group key."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for _, body in webhook.notifications():
        if any(a["labels"].get("Hostname") == host for a in body["alerts"]):
            groups.setdefault(body["groupKey"], []).append(body)
    return groups


def test_a_dying_node_pages_once_with_its_cause_not_once_per_symptom(
    scale_out: ScaleOut,
) -> None:
    """node-5's GPU falls off the bus: GPU down and the drain XID (critical), and the
    node's straggler alert (warning) fire in the central Prometheus. Alertmanager sends
    one notification group for node-5 (by cluster and Hostname), holding the cause; the
    straggler alert is inhibited, so no second group reaches the chat receiver."""
    central = scale_out.central.url

    def cause_and_symptom_fire() -> bool:
        firing = prometheus_firing(central)
        return {("StepscopeGpuDown", DYING, "1"), ("StepscopeGpuXidDrain", DYING, "1"),
                ("StepscopeNodeStraggler", DYING, "")} <= firing  # fmt: skip

    wait_for(cause_and_symptom_fire, timeout=150, interval=1)

    def inhibited_in_alertmanager() -> list[dict[str, Any]] | None:
        query = urllib.parse.urlencode({"filter": f'Hostname="{DYING}"'})
        url = f"{scale_out.alertmanager.url}/api/v2/alerts?{query}"
        alerts: list[dict[str, Any]] = get_json(url)
        straggler = [a for a in alerts if a["labels"]["alertname"] == "StepscopeNodeStraggler"]
        return straggler if straggler and straggler[0]["status"]["inhibitedBy"] else None

    (straggler,) = wait_for(inhibited_in_alertmanager, timeout=30, interval=0.5)
    assert straggler["status"]["state"] == "suppressed"

    def notified() -> dict[str, list[dict[str, Any]]] | None:
        groups = _node_groups(scale_out.webhook, DYING)
        names = {a["labels"]["alertname"] for bodies in groups.values() for b in bodies
                 for a in b["alerts"] if a["status"] == "firing"}  # fmt: skip
        return groups if {"StepscopeGpuDown", "StepscopeGpuXidDrain"} <= names else None

    wait_for(notified, timeout=30, interval=0.5)
    # Watch two more group intervals (5 s each in the test copy): a symptom's own group
    # would be flushed within them. Absence is watched to a deadline, not slept on.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline:
        groups = _node_groups(scale_out.webhook, DYING)
        assert len(groups) == 1, {k: [(b["receiver"], [a["labels"]["alertname"]
                                   for a in b["alerts"]]) for b in v] for k, v in groups.items()}
        time.sleep(0.5)
    ((_, bodies),) = _node_groups(scale_out.webhook, DYING).items()
    assert all(b["groupLabels"] == {"cluster": "e2e", "Hostname": DYING} for b in bodies)
    assert {b["receiver"] for b in bodies} == {"hardware-queue"}  # critical, cluster not prod-*
    sent = {a["labels"]["alertname"] for b in bodies for a in b["alerts"]}
    assert sent == {"StepscopeGpuDown", "StepscopeGpuXidDrain"}, sent


def test_a_node_whose_exporter_dies_pages_once_for_its_target(scale_out: ScaleOut) -> None:
    """node-3 (a straggler, already notified to the chat) loses its exporter: its series go
    stale and StepscopeExporterDown (naming node-3, from its GPU info as last seen)
    inhibits its straggler alerts, so nothing of node-3 pages again but that one new
    notification group, for that target. (Last in the module: the fleet is one node
    short afterwards.)"""
    wait_for(lambda: _node_groups(scale_out.webhook, SLOW), timeout=60, interval=0.5)
    before = {b["groupKey"] for _, b in scale_out.webhook.notifications()}
    address = scale_out.exporters[SLOW].address
    kill_all([scale_out.exporters[SLOW]])

    def new_groups() -> dict[str, list[dict[str, Any]]]:
        """New groups about this node or target (another node's late news is not ours)."""
        groups: dict[str, list[dict[str, Any]]] = {}
        for _, body in scale_out.webhook.notifications():
            ours = any(a["labels"].get("Hostname") == SLOW
                       or a["labels"].get("instance") == address for a in body["alerts"])
            if body["groupKey"] not in before and ours:
                groups.setdefault(body["groupKey"], []).append(body)
        return groups

    def straggler_resolved_and_exporter_down() -> bool:
        resolved = any(a["status"] == "resolved" for bodies in _node_groups(
            scale_out.webhook, SLOW).values() for b in bodies for a in b["alerts"])  # fmt: skip
        return resolved and bool(new_groups())

    # a rule that reads a range (the straggler's 1-2 m rates) may keep the dead node's
    # last samples in its window: resolved within about that window plus a group interval
    # (60 s was not enough once, on a loaded CI machine)
    wait_for(straggler_resolved_and_exporter_down, timeout=180, interval=0.5)
    ((_, bodies),) = new_groups().items()
    assert all(b["groupLabels"] == {"cluster": "e2e", "instance": address} for b in bodies)
    assert {a["labels"]["alertname"] for b in bodies for a in b["alerts"]} == {
        "StepscopeExporterDown"}
    # it names the node, and the node's other groups only say its straggler is over
    assert {a["labels"].get("Hostname") for b in bodies for a in b["alerts"]} == {SLOW}
    late = [a for bodies in _node_groups(scale_out.webhook, SLOW).values() for b in bodies
            for a in b["alerts"] if a["status"] == "firing" and a["labels"]["alertname"]
            not in ("StepscopeNodeStraggler", "StepscopeExporterDown")]  # fmt: skip
    assert late == []
