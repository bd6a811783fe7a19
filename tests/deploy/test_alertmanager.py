"""The shipped Alertmanager example (deploy/alertmanager/alertmanager.yml): valid for
amtool, routing each severity and cluster where it says, naming only alerts the shipped
rules raise, and a real Alertmanager inhibiting a node's symptoms while their cause
fires (alerts posted to its API with the labels the rules give them)."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import yaml

from tests.support import wait_for
from tests.support.scaleout import (
    ALERTMANAGER_CONFIG,
    REQUIRED_BY,
    RULES,
    Server,
    Webhook,
    alertmanager,
    get_json,
)
from tests.support.tools import require_tool


def amtool() -> str:
    return require_tool("amtool", "prometheus-alertmanager", REQUIRED_BY)


def shipped_alerts() -> dict[str, dict[str, str]]:
    """Alert name -> its static labels, from the shipped rule files."""
    out = {}
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule.get("labels", {})
    return out


def test_the_example_passes_amtool_check_config() -> None:
    run = subprocess.run([amtool(), "check-config", str(ALERTMANAGER_CONFIG)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    assert "6 inhibit rules" in run.stdout


def _meta_alerts() -> list[str]:
    (group,) = yaml.safe_load((RULES / "stepscope-meta.yml").read_text())["groups"]
    return [r["alert"] for r in group["rules"] if r["alert"] != "StepscopeWatchdog"]


@pytest.mark.parametrize("alert", _meta_alerts())
def test_every_meta_alert_reaches_the_team_that_runs_the_monitoring(alert: str) -> None:
    """Each alert of stepscope-meta.yml but the heartbeat goes to `monitoring-team`
    outside production clusters, whatever its severity: not to the chat or pager of the
    fleet it watches (a new meta alert left out of the route fails here)."""
    labels = shipped_alerts()[alert]
    run = subprocess.run(
        [amtool(), "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
         f"alertname={alert}", "cluster=research", *[f"{k}={v}" for k, v in labels.items()]],
        capture_output=True, text=True)  # fmt: skip
    assert run.stdout.strip() == "monitoring-team", run.stdout + run.stderr


@pytest.mark.parametrize(("labels", "receiver"), [
    ({"alertname": "StepscopeGpuDown", "severity": "critical", "cluster": "prod-east"},
     "oncall-pager"),
    ({"alertname": "StepscopeGpuDown", "severity": "critical", "cluster": "research"},
     "hardware-queue"),
    ({"alertname": "StepscopeNodeStraggler", "severity": "warning", "cluster": "prod-east"},
     "fleet-chat"),
    ({"alertname": "StepscopeLowMfu", "severity": "info", "cluster": "prod-east"},
     "fleet-digest"),
    # a production node's exporter gone: the node most likely died, page
    ({"alertname": "StepscopeExporterDown", "severity": "warning", "cluster": "prod-east"},
     "oncall-pager"),
    ({"alertname": "StepscopeExporterDown", "severity": "warning", "cluster": "research"},
     "fleet-chat"),
    ({"alertname": "StepscopeExporterStale", "severity": "warning", "cluster": "prod-east"},
     "fleet-chat"),
    # the dead man's switch: the heartbeat alone, whatever labels a ruler adds
    ({"alertname": "StepscopeWatchdog", "severity": "none"}, "heartbeat"),
    ({"alertname": "StepscopeWatchdog", "severity": "none", "cluster": "prod-east"},
     "heartbeat"),
    # the monitoring's own health: its team; a production cluster gone blind pages
    ({"alertname": "StepscopeClusterSilent", "severity": "critical", "cluster": "prod-east"},
     "oncall-pager"),
    ({"alertname": "StepscopeClusterSilent", "severity": "critical", "cluster": "research"},
     "monitoring-team"),
    # critical, but not to the pager it may be about
    ({"alertname": "StepscopeNotificationsFailing", "severity": "critical",
      "integration": "pagerduty"}, "monitoring-team"),
    ({"alertname": "StepscopeRemoteWriteFailing", "severity": "warning", "cluster": "prod-east"},
     "monitoring-team"),
    ({"alertname": "StepscopeRuleEvaluationFailing", "severity": "warning"}, "monitoring-team"),
    ({"alertname": "StepscopeAlertmanagerDown", "severity": "warning", "cluster": "prod-east"},
     "monitoring-team"),
])  # fmt: skip
def test_alerts_route_by_severity_and_cluster(labels: dict[str, str], receiver: str) -> None:
    run = subprocess.run(
        [amtool(), "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
         *[f"{k}={v}" for k, v in labels.items()]],
        capture_output=True, text=True)  # fmt: skip
    assert run.stdout.strip() == receiver, run.stdout + run.stderr


def test_every_severity_the_rules_use_has_a_route() -> None:
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    routed = {m for r in config["route"]["routes"] for m in r.get("matchers", [])}
    severities = {labels["severity"] for name, labels in shipped_alerts().items()
                  if name != "StepscopeWatchdog"}  # routed by its name, `severity: none`
    assert severities == {"critical", "warning", "info"}
    assert all(f'severity="{s}"' in routed for s in severities)


def test_inhibition_names_only_alerts_the_rules_raise() -> None:
    """A renamed alert would silently stop being inhibited: every name in the example is
    one of the shipped rules'."""
    text = ALERTMANAGER_CONFIG.read_text()
    config = yaml.safe_load(text)
    named: set[str] = set()
    for rule in config["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            if matcher.startswith("alertname"):
                named |= set(matcher.split("=", 1)[1].strip('~"').split("|"))
    for route in config["route"]["routes"]:
        for matcher in route.get("matchers", []):
            if matcher.startswith("alertname"):
                named |= set(matcher.split("=", 1)[1].strip('~"').split("|"))
    assert named and named <= set(shipped_alerts()), named - set(shipped_alerts())


# ---- a real Alertmanager with the example's inhibition


def _node(host: str) -> dict[str, str]:
    return {"cluster": "prod-east", "Hostname": host}


def _target(host: str) -> dict[str, str]:
    return {"cluster": "prod-east", "instance": f"{host}.ec2.internal", "job": "stepscope"}


# Label sets as the shipped rules make them: raw-series alerts keep the target's labels
# (instance, job, cluster) and the series' own (Hostname, gpu, UUID, training_job, rank);
# recorded-series alerts keep what the recording rule aggregates by.
ALERTS: dict[str, dict[str, str]] = {
    "gpu_down": {"alertname": "StepscopeGpuDown", **_target("a"), **_node("a"), "gpu": "3",
                 "UUID": "GPU-a3", "training_job": "llm"},
    "node_straggler_a": {"alertname": "StepscopeNodeStraggler", **_node("a"),
                         "peer_group": "llm"},
    "node_straggler_b": {"alertname": "StepscopeNodeStraggler", **_node("b"),
                         "peer_group": "llm"},
    "stalled_a": {"alertname": "StepscopeTrainingStalled", **_target("a"), **_node("a"),
                  "training_job": "llm", "rank": "3", "gpu": "3"},
    "collector_errors_a": {"alertname": "StepscopeCollectorErrors", **_target("a"),
                           **_node("a"), "collector": "gpu"},
    "low_mfu": {"alertname": "StepscopeLowMfu", "cluster": "prod-east", "training_job": "llm"},
    # down: it carries its node's Hostname, joined from the node's GPU info as last seen
    "exporter_down_c": {"alertname": "StepscopeExporterDown", **_target("c"), **_node("c")},
    "node_straggler_c": {"alertname": "StepscopeNodeStraggler", **_node("c"),
                         "peer_group": "llm"},
    "bottleneck_c": {"alertname": "StepscopeBottleneck", **_target("c"), **_node("c"),
                     "training_job": "llm", "rank": "17", "gpu": "1", "kind": "input"},
    "xid_drain_d": {"alertname": "StepscopeGpuXidDrain", **_target("d"), **_node("d"),
                    "gpu": "5", "UUID": "GPU-d5", "xid": "79"},
    "thermal_d5": {"alertname": "StepscopeGpuThermalViolation", **_node("d"), "gpu": "5",
                   "UUID": "GPU-d5"},
    "thermal_d6": {"alertname": "StepscopeGpuThermalViolation", **_node("d"), "gpu": "6",
                   "UUID": "GPU-d6"},
    # cluster prod-west blind, every target down: one alert, not one a node or agent
    "cluster_silent_w": {"alertname": "StepscopeClusterSilent", "cluster": "prod-west",
                         "reason": "all_down"},
    "exporter_down_w": {"alertname": "StepscopeExporterDown", "cluster": "prod-west",
                        "instance": "w.ec2.internal", "job": "stepscope", "Hostname": "w"},
    "agent_silent_w": {"alertname": "StepscopeAgentSilent", "cluster": "prod-west",
                       "job": "prometheus-agent", "instance": "localhost:9090",
                       "replica": "b"},
    # never inhibited, though every other alert of prod-east's nodes fires beside it
    "watchdog": {"alertname": "StepscopeWatchdog"},
}
for _labels in ALERTS.values():
    _labels["severity"] = shipped_alerts()[_labels["alertname"]]["severity"]


@pytest.fixture(scope="module")
def am(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    hook = Webhook()
    server = alertmanager(tmp_path_factory.mktemp("am"), "am", hook.url, wait="5s")
    try:
        yield server
    finally:
        server.stop()
        hook.stop()


def _post(am: Server, alerts: list[dict[str, str]]) -> None:
    now = datetime.now(timezone.utc)
    body = [{"labels": labels, "startsAt": now.isoformat(),
             "endsAt": (now + timedelta(minutes=10)).isoformat()} for labels in alerts]
    req = urllib.request.Request(f"{am.url}/api/v2/alerts", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200


def _states(am: Server) -> dict[str, str]:
    """Our alert key -> Alertmanager's state for it (active / suppressed)."""
    got: list[dict[str, Any]] = get_json(f"{am.url}/api/v2/alerts")
    out = {}
    for key, labels in ALERTS.items():
        for alert in got:
            if alert["labels"] == labels:
                out[key] = alert["status"]["state"]
    return out


def test_a_cause_silences_its_symptoms_on_the_same_node_or_gpu_only(am: Server) -> None:
    expected = {
        # GPU down on node a: its node's symptoms, its gpu source's errors, its job's MFU
        "node_straggler_a", "stalled_a", "collector_errors_a", "low_mfu",
        # node c's exporter down: its target's verdict alerts and its node's straggler
        "bottleneck_c", "node_straggler_c",
        "thermal_d5",  # critical XID on d/5: that GPU's warnings, not d/6's
        # prod-west blind: its node's and its agent's alerts (the cluster's is the one)
        "exporter_down_w", "agent_silent_w",
    }
    _post(am, list(ALERTS.values()))

    def suppressed() -> set[str] | None:
        # Alertmanager marks an alert inhibited when its group is flushed (group_wait)
        states = _states(am)
        got = {k for k, v in states.items() if v == "suppressed"}
        return got if len(states) == len(ALERTS) and got == expected else None

    try:
        wait_for(suppressed, timeout=30, interval=0.3)
    except AssertionError:
        raise AssertionError(f"states: {_states(am)}") from None
