"""The scale-out configurations: Prometheus agents per cluster (deploy/prometheus/agent-*.yml,
generate/agents.py) that scrape as the single-Prometheus configs do and remote-write only
what is read, and the shipped rule files as a central ruler loads them (Prometheus,
vmalert, Mimir/AMP)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from generate.agents import (
    dashboard_exprs,
    expression_names,
    fleet_cli_names,
    names_read,
    recorded_names,
    rule_exprs,
)
from tests.support import REPO, promtool
from tests.support.tools import require_tool

PROM = REPO / "deploy" / "prometheus"
RULES = PROM / "rules"
DASHBOARDS = REPO / "dashboards" / "json"
AGENTS = {"agent-kubernetes.yml": "prometheus-kubernetes.yml",
          "agent-ec2.yml": "prometheus-ec2.yml"}
METRICS_DOC = (REPO / "docs" / "metrics.md").read_text()


def _load(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((PROM / name).read_text())
    return cfg


def keep_regex(name: str = "agent-ec2.yml") -> re.Pattern[str]:
    """The agent's keep list as Prometheus applies it: anchored at both ends."""
    (remote,) = _load(name)["remote_write"]
    (rule,) = remote["write_relabel_configs"]
    assert rule["action"] == "keep" and rule["source_labels"] == ["__name__"]
    return re.compile(f"^(?:{rule['regex']})$")


def _documented(name: str) -> bool:
    """A family docs/metrics.md names (a histogram's _bucket/_sum/_count by its base)."""
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    return f"`{name}`" in METRICS_DOC or f"`{base}`" in METRICS_DOC or name in METRICS_DOC


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_agent_config_passes_promtool_in_agent_mode(agent: str, tmp_path: Path) -> None:
    cfg = _load(agent)
    assert "rule_files" not in cfg and "alerting" not in cfg  # an agent evaluates nothing
    for job in cfg["scrape_configs"]:
        if "kubernetes_sd_configs" in job:
            # Debian's promtool is built without Kubernetes discovery (as in
            # test_prometheus_config.py): everything else goes through promtool
            job.pop("kubernetes_sd_configs")
            job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    path = tmp_path / agent
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.run([promtool(), "check", "config", "--agent", str(path)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_agent_scrapes_as_the_single_prometheus_config_does(agent: str) -> None:
    """The exporters' jobs as the single Prometheus scrapes them; of the monitoring's own,
    the agent scrapes itself (its remote write, for the meta-monitoring rules) with its
    cluster's name, not that Prometheus and its Alertmanagers."""
    single = _load(AGENTS[agent])["scrape_configs"]
    exporters = [j for j in single if j["job_name"].startswith("stepscope")]
    assert {j["job_name"] for j in single} - {j["job_name"] for j in exporters} == {
        "prometheus", "alertmanager"}
    *scraped, own = _load(agent)["scrape_configs"]
    assert scraped == exporters
    assert own["job_name"] == "prometheus-agent"
    (target,) = own["static_configs"]
    assert target["targets"] == ["localhost:9090"]
    clusters = {r["replacement"] for j in exporters for r in j.get("relabel_configs", [])
                if r.get("target_label") == "cluster" and "source_labels" not in r}
    assert clusters == {target["labels"]["cluster"]}
    assert _load(agent)["global"]["scrape_interval"] == _load(AGENTS[agent])["global"][
        "scrape_interval"]  # the queue sizing assumes it


def test_both_agents_remote_write_the_same_way() -> None:
    a, b = (_load(name)["remote_write"] for name in sorted(AGENTS))
    assert a == b
    (remote,) = a
    queue = remote["queue_config"]
    # the sizing in the comment: 29,147 samples/s measured for 1,000 nodes at a 15 s
    # scrape, which the minimum shards carry at 200 ms a request (5 a second each)
    assert queue["min_shards"] * queue["max_samples_per_send"] * 5 >= 29_147
    assert queue["capacity"] >= 3 * queue["max_samples_per_send"]


def test_every_name_a_rule_reads_is_remote_written() -> None:
    keep = keep_regex()
    read = names_read(rule_exprs(RULES), recorded_names(RULES))
    assert {"up", "stepscope_gpu_up", "DCGM_FI_PROF_SM_ACTIVE",
            "stepscope_step_duration_seconds_sum"} <= read  # the tokenizer finds names
    dropped = sorted(n for n in read if not n.startswith("re:") and not keep.match(n))
    assert dropped == [], f"the rules read names the agents drop: {dropped}"


def test_every_name_a_dashboard_or_the_fleet_diagnosis_reads_is_remote_written() -> None:
    keep = keep_regex()
    read = names_read(dashboard_exprs(DASHBOARDS), recorded_names(RULES)) | fleet_cli_names()
    assert {"DCGM_FI_DEV_GPU_TEMP", "stepscope_node_info"} <= read
    dropped = sorted(n for n in read if not n.startswith("re:") and not keep.match(n))
    assert dropped == [], f"dashboards or `stepscope diagnose --prometheus` read: {dropped}"


def test_name_patterns_the_rules_select_are_remote_written() -> None:
    """`{__name__=~"stepscope_rdma_.+"}` (StepscopeNcclSocketTransport): every documented
    family it matches is kept."""
    keep = keep_regex()
    patterns = {n[3:] for n in names_read(rule_exprs(RULES), set()) if n.startswith("re:")}
    assert patterns
    for pattern in patterns:
        families = set(re.findall(rf"`({pattern})`", METRICS_DOC))
        assert families, pattern
        assert sorted(f for f in families if not keep.match(f)) == []


def test_names_read_are_families_the_exporter_serves() -> None:
    """The tokenizer's answer is real names: each is documented in docs/metrics.md (or is
    Prometheus' `up`), so a keep list made from it keeps no phantom and misses no typo."""
    recorded = recorded_names(RULES)
    read = (names_read(rule_exprs(RULES), recorded)
            | names_read(dashboard_exprs(DASHBOARDS), recorded) | fleet_cli_names())  # fmt: skip
    unknown = sorted(n for n in read if not n.startswith("re:") and n != "up"
                     and not _documented(n))  # fmt: skip
    assert unknown == []


def test_the_agents_send_their_own_series_the_meta_rules_read_and_no_other() -> None:
    """Their remote write's (StepscopeRemoteWriteFailing, ...Behind, ...ShardsMaxed); the
    ruler's, Alertmanager's and vmalert's are scraped centrally, never by an agent."""
    keep = keep_regex()
    read = names_read(rule_exprs(RULES, meta=True), set())
    own = {n for n in read if n.startswith("prometheus_remote_storage_")}
    assert {"prometheus_remote_storage_samples_failed_total",
            "prometheus_remote_storage_queue_highest_sent_timestamp_seconds"} <= own
    assert sorted(n for n in own if not keep.match(n)) == []
    central = read - own - {"up"}
    assert {"prometheus_rule_evaluation_failures_total",
            "alertmanager_notifications_failed_total"} <= central
    assert sorted(n for n in central if keep.match(n)) == []


def test_keep_list_drops_what_nothing_reads() -> None:
    keep = keep_regex()
    for name in ("process_cpu_seconds_total", "stepscope_ingest_rejected_total",
                 "DCGM_FI_DEV_ENC_UTIL", "stepscope_gpu_pipe_tensor_hmma_active_ratio",
                 "scrape_duration_seconds"):  # fmt: skip
        assert not keep.match(name), name
    assert expression_names('sum by (le) (rate(x_bucket{a="b"}[5m])) > on (c) y') == {
        "x_bucket", "y"}


def test_rule_files_load_in_vmalert() -> None:
    vmalert = require_tool("vmalert", "victoria-metrics", "STEPSCOPE_REQUIRE_PROMTOOL")
    files = sorted(RULES.glob("*.yml"))
    run = subprocess.run([vmalert, "-dryRun", *[f"-rule={f}" for f in files]],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fatal" not in run.stdout + run.stderr


def test_rule_files_are_mimir_and_amp_rule_group_namespaces() -> None:
    """mimirtool (`rules load/sync`) and AMP (`create-rule-groups-namespace --data`) read
    Prometheus rule files: a `groups:` list, optionally a `namespace:` key (mimirtool
    decodes with unknown fields forbidden, so nothing else), the namespace defaulting to
    the file's name. Group names must be unique within a namespace."""
    for path in sorted(RULES.glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        assert set(doc) <= {"namespace", "groups"}, path.name
        names = [g["name"] for g in doc["groups"]]
        assert len(names) == len(set(names)), path.name
        for group in doc["groups"]:
            assert set(group) <= {"name", "interval", "limit", "rules"}, group["name"]
    run = subprocess.run([promtool(), "check", "rules", *map(str, sorted(RULES.glob("*.yml")))],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
