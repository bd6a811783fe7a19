"""The meta-monitoring alerts (deploy/prometheus/rules/stepscope-meta.yml) from real
failures of real servers, run from the shipped files.

One central tier, as shipped and with only targets, URLs, receivers and the clock
substituted: a central Prometheus (the shipped rules, scraping itself and Alertmanager with
prometheus-ec2.yml's `prometheus` and `alertmanager` jobs), VictoriaMetrics (scraping vmalert,
Alertmanager and itself with deploy/victoriametrics/scrape.yml) with vmalert evaluating the
MetricsQL rules, and Alertmanager (the shipped configuration, every receiver a path of one
webhook). Into it, the failures:

- a Prometheus agent (the shipped agent-ec2.yml, scraping itself as `prometheus-agent`)
  writes to the central Prometheus and VictoriaMetrics, to a port where nothing listens
  (connection refused: retried) and to a store answering 400 (failed, lost);
- one more rule file on each ruler holds a rule that fails at every evaluation: on
  Prometheus a many-to-many match, on vmalert the PromQL function vmalert 1.79 lacks (the
  failure issue 35 found five shipped rules in);
- the hardware queue's receiver answers 500, and a drain XID of a non-production cluster
  (routed there) is posted to Alertmanager as a ruler would.

Each meta alert becomes active (pending: the shipped `for:` is minutes, which the promtool
tests in rules-tests/stepscope-meta_test.yml cover) on the real series, naming the URL, the
rule or the integration that fails and no healthy one; StepscopeWatchdog fires on both
rulers and reaches the heartbeat receiver through Alertmanager, never inhibited.
StepscopeClusterSilent and StepscopeAgentSilent need minutes of silence: promtool only.
Wall time: about 20 s (Alertmanager gives up on a notification after 10 s).
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from tests.support import wait_for
from tests.support.ports import free_port
from tests.support.scaleout import (
    Server,
    Webhook,
    alertmanager,
    central_prometheus,
    get_json,
    prometheus_agent,
    victoria_metrics,
    vmalert,
)

pytestmark = pytest.mark.timeout(180)

CLUSTER = "prod-meta"
ACTIVE = ("pending", "firing")
# a rule Prometheus fails at every evaluation: every `up` matches every other (`on ()`)
PROMETHEUS_BROKEN = """\
groups:
  - name: broken-on-purpose
    rules:
      - record: test:up_matched_with_itself:product
        expr: up * on () up
"""
# a rule vmalert 1.79 fails at every evaluation: "unknown func" (MetricsQL)
VMALERT_BROKEN = """\
groups:
  - name: broken-on-purpose
    rules:
      - alert: PromqlOnlyFunction
        expr: histogram_count(stepscope_step_duration_seconds) > 0
"""


@dataclass
class Tier:
    central: Server
    vm: Server
    vmalert: Server
    am: Server
    agent: Server
    sink: Webhook
    urls: dict[str, str]  # what the agent writes to: name -> URL


@pytest.fixture(scope="module")
def tier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    tmp = tmp_path_factory.mktemp("meta")
    # /am/<receiver>: Alertmanager's receivers (the hardware queue's broken);
    # /reject: a store refusing every remote write with 400
    sink = Webhook({"/am/hardware-queue": 500, "/reject": 400})
    servers: list[Server] = []
    try:
        am = alertmanager(tmp, "am", f"{sink.url}/am", wait="1s")
        servers.append(am)
        (tmp / "broken-prometheus.yml").write_text(PROMETHEUS_BROKEN)
        (tmp / "broken-vmalert.yml").write_text(VMALERT_BROKEN)
        central = central_prometheus(tmp, [am.url], evaluation_interval="1s",
                                     extra_rules=[tmp / "broken-prometheus.yml"])  # fmt: skip
        servers.append(central)
        _post_a_drain_xid(am)  # its 10 s of retries run beside the rest
        vmalert_port = free_port()
        am_address = am.url.removeprefix("http://")
        vm = victoria_metrics(tmp, scrape_interval="1s", scrape={
            "vmalert": [f"127.0.0.1:{vmalert_port}"], "alertmanager": [am_address]})
        servers.append(vm)
        vma = vmalert(tmp, vm.url, [am.url], evaluation_interval="1s",
                      extra_rules=[tmp / "broken-vmalert.yml"], port=vmalert_port)  # fmt: skip
        servers.append(vma)
        urls = {"central": f"{central.url}/api/v1/write", "vm": f"{vm.url}/api/v1/write",
                "dead": f"http://127.0.0.1:{free_port()}/api/v1/write",
                "reject": f"{sink.url}/reject/api/v1/write"}  # fmt: skip
        agent = prometheus_agent(tmp, "agent", {}, list(urls.values()), "a",
                                 scrape_interval="1s", cluster=CLUSTER)  # fmt: skip
        servers.append(agent)
        yield Tier(central, vm, vma, am, agent, sink, urls)
    finally:
        for server in reversed(servers):
            server.stop()
        sink.stop()


def _post_a_drain_xid(am: Server) -> None:
    """A drain XID of a research cluster, posted as a ruler would: routed to the hardware
    queue."""
    now = datetime.now(timezone.utc)
    labels = {"alertname": "StepscopeGpuXidDrain", "severity": "critical",
              "cluster": "research", "Hostname": "node-x", "gpu": "3", "xid": "79"}
    body = json.dumps([{"labels": labels, "startsAt": now.isoformat(),
                        "endsAt": (now + timedelta(minutes=10)).isoformat()}]).encode()
    req = urllib.request.Request(f"{am.url}/api/v2/alerts", data=body,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def _alerts(ruler: Server, name: str) -> list[dict[str, Any]]:
    """The ruler's active alerts (pending or firing) named ``name``."""
    alerts = get_json(f"{ruler.url}/api/v1/alerts")["data"]["alerts"] or []
    return [a for a in alerts if a["labels"]["alertname"] == name and a["state"] in ACTIVE]


def _rulers(tier: Tier) -> dict[str, Server]:
    return {"prometheus": tier.central, "vmalert": tier.vmalert}


def test_the_watchdog_fires_on_both_rulers_and_reaches_the_heartbeat_receiver(
    tier: Tier,
) -> None:
    for ruler in _rulers(tier).values():
        (alert,) = wait_for(lambda r=ruler: _alerts(r, "StepscopeWatchdog"), timeout=20)
        assert alert["state"] == "firing" and alert["labels"]["severity"] == "none"

    def heartbeats() -> list[dict[str, Any]]:
        return [body for path, body in tier.sink.notifications() if path == "/am/heartbeat"]

    (body, *_) = wait_for(heartbeats, timeout=20)
    assert body["receiver"] == "heartbeat"
    assert {a["labels"]["alertname"] for a in body["alerts"]} == {"StepscopeWatchdog"}
    # nowhere else, and never inhibited
    assert not [p for p, b in tier.sink.notifications() if p != "/am/heartbeat"
                and any(a["labels"]["alertname"] == "StepscopeWatchdog" for a in b["alerts"])]
    held = get_json(f"{tier.am.url}/api/v2/alerts?filter=alertname%3D%22StepscopeWatchdog%22")
    assert held and all(a["status"]["state"] == "active" for a in held), held


def test_remote_write_to_a_dead_or_refusing_store_raises_remote_write_failing(
    tier: Tier,
) -> None:
    """The agent's own series reach both stores through its healthy queues; each ruler
    names the two broken URLs and neither healthy one."""
    broken = {tier.urls["dead"], tier.urls["reject"]}
    for name, ruler in _rulers(tier).items():
        def failing(r: Server = ruler) -> list[dict[str, Any]] | None:
            alerts = _alerts(r, "StepscopeRemoteWriteFailing")
            return alerts if {a["labels"]["url"] for a in alerts} >= broken else None

        alerts = wait_for(failing, timeout=40, interval=0.5)
        assert {a["labels"]["url"] for a in alerts} == broken, name
        for alert in alerts:
            labels = alert["labels"]
            assert (labels["cluster"], labels["job"]) == (CLUSTER, "prometheus-agent"), name
            # each agent of a pair apart: the replica, renamed `agent` where the store
            # drops `replica` (deploy/victoriametrics/relabel.yml)
            assert labels.get("replica" if name == "prometheus" else "agent") == "a", labels
            assert float(alert["value"]) > 0.5, alert  # nearly every attempt fails
    # the refusing store's samples are lost (failed), the dead one's retried
    assert tier.agent.metric("prometheus_remote_storage_samples_failed_total") > 0
    assert tier.agent.metric("prometheus_remote_storage_samples_retried_total") > 0


def test_a_rule_failing_at_every_evaluation_raises_rule_evaluation_failing(
    tier: Tier,
) -> None:
    """Prometheus names the group of the broken rule, vmalert the rule itself; the shipped
    rules never appear (they evaluate without an error on both backends)."""
    def prometheus_says() -> list[dict[str, Any]]:
        return _alerts(tier.central, "StepscopeRuleEvaluationFailing")

    (alert,) = wait_for(prometheus_says, timeout=30, interval=0.5)
    assert alert["labels"]["rule_group"].endswith("broken-prometheus.yml;broken-on-purpose")
    assert alert["labels"]["job"] == "prometheus"

    def vmalert_says() -> list[dict[str, Any]]:
        return _alerts(tier.vmalert, "StepscopeRuleEvaluationFailing")

    (alert,) = wait_for(vmalert_says, timeout=30, interval=0.5)
    assert alert["labels"]["rule"] == "PromqlOnlyFunction"
    assert (alert["labels"]["group"], alert["labels"]["job"]) == ("broken-on-purpose",
                                                                   "vmalert")


def test_a_receiver_answering_500_raises_notifications_failing(tier: Tier) -> None:
    """A drain XID of a research cluster (posted at the start) goes to the hardware queue,
    whose receiver answers 500: Alertmanager retries, gives up, counts the failure; both
    rulers name the integration. The heartbeat (the same integration, another receiver)
    still arrives (the Watchdog's test)."""
    for name, ruler in _rulers(tier).items():
        def failing(r: Server = ruler) -> list[dict[str, Any]]:
            return _alerts(r, "StepscopeNotificationsFailing")

        (alert,) = wait_for(failing, timeout=40, interval=0.5)
        assert alert["labels"]["integration"] == "webhook", name
        assert alert["labels"]["job"] == "alertmanager", name
        assert alert["labels"]["instance"] == tier.am.url.removeprefix("http://"), name
    assert any(path == "/am/hardware-queue" for path, _ in tier.sink.received)
    assert tier.am.metric("alertmanager_notifications_failed_total") >= 1
