"""The per-cluster Prometheus Agent configurations, ``deploy/prometheus/agent-*.yml``, made
from what they share with the single-Prometheus ones and what the shipped rules read
(``python -m generate`` runs it after the rules and dashboards).

Each agent's ``scrape_configs`` are the text of its single-Prometheus config's
(``prometheus-kubernetes.yml``, ``prometheus-ec2.yml``: those are edited, the agents
follow). The ``remote_write`` block is one, for both: its keep list is every scraped name
the shipped rules, the dashboards and ``stepscope diagnose --prometheus`` read, found by
:func:`expression_names` (no PromQL parser is at hand in Python: a tokenizer that removes
strings, label matchers, ranges, grouping clauses, functions, keywords and Grafana
variables), plus ``up`` and ``stepscope_build_info``, and of the names the meta-monitoring
rules read, the agent's own (its remote-write queue's: each agent scrapes itself as job
``prometheus-agent``, with its cluster's name, a job the single-Prometheus configs do not
have: theirs scrape that Prometheus and its Alertmanagers, and the agents stop copying
at their "# Meta-monitoring" comment).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import yaml

from generate.constants import DASHBOARDS_DIR, PROMETHEUS_DIR, REPO
from generate.files import sync

RULES_DIR = PROMETHEUS_DIR / "rules"
# the installed package's source (--check and the tests run the generators on a copy that
# holds only the generated trees): the modules whose PromQL `stepscope diagnose
# --prometheus` runs (the fleet view; a job's goodput)
_DIAGNOSE = Path(str(find_spec("stepscope").origin)).parent / "diagnose"  # type: ignore[union-attr]
FLEET_CLI = (_DIAGNOSE / "cli.py", _DIAGNOSE / "goodput_report.py")
# agent file -> the single-Prometheus config whose scrape_configs it carries
AGENTS = {"agent-kubernetes.yml": "prometheus-kubernetes.yml",
          "agent-ec2.yml": "prometheus-ec2.yml"}  # fmt: skip
# series a ruler makes itself: never scraped, never remote-written by an agent
RULER_SERIES = frozenset({"ALERTS", "ALERTS_FOR_STATE"})
# read by nothing shipped, kept for what an operator asks first (which version runs where)
ALSO_KEPT = frozenset({"up", "stepscope_build_info"})
# the meta-monitoring rules (they read the monitoring's own series, not the exporters')
META_RULES = "stepscope-meta.yml"
# ... of which the agents send their own: the ruler's, Alertmanager's and vmalert's are
# scraped by the central tier itself
AGENT_OWN = re.compile(r"prometheus_remote_storage_\w+")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right",
                       "offset", "and", "or", "unless", "bool", "inf", "nan", "atan2"})  # fmt: skip


def expression_names(expr: str) -> set[str]:
    """Metric names ``expr`` selects; a ``{__name__=~"re"}`` selector as ``"re:<re>"``."""
    found = {f"re:{m}" for m in re.findall(r'__name__\s*=~\s*"([^"]+)"', expr)}
    e = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"label_values\(\s*([^,)]*)(,[^)]*)?\)", r" \1 ", e)  # Grafana's
    e = re.sub(r"\$\{?\w+\}?", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", e):
        if m.group(2) is None and m.group(1) not in _KEYWORDS:
            found.add(m.group(1))
    return found


def _rules(rules_dir: Path, meta: bool | None = None) -> Iterator[dict[str, Any]]:
    for path in sorted(rules_dir.glob("*.yml")):
        if meta is not None and (path.name == META_RULES) != meta:
            continue
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def _dashboard_queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if node.get("type") == "datasource":  # a datasource picker's "query" is a type
            return
        for key, value in node.items():
            if key in ("expr", "query", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _dashboard_queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _dashboard_queries(value)


def recorded_names(rules_dir: Path) -> set[str]:
    """The series the recording rules make."""
    return {rule["record"] for rule in _rules(rules_dir) if "record" in rule}


def rule_exprs(rules_dir: Path, meta: bool = False) -> list[str]:
    """Every expression of the rules over the exporters' series, or (``meta``) of the
    meta-monitoring rules."""
    return [rule["expr"] for rule in _rules(rules_dir, meta)]


def dashboard_exprs(dashboards_dir: Path) -> list[str]:
    """Every panel's and template variable's query of the dashboards in the folder."""
    return [q for path in sorted(dashboards_dir.glob("*.json"))
            for q in _dashboard_queries(json.loads(path.read_text()))]  # fmt: skip


def names_read(exprs: Iterable[str], recorded: set[str]) -> set[str]:
    """Scraped names the expressions read: neither recorded nor made by the ruler."""
    names: set[str] = set()
    for expr in exprs:
        names |= expression_names(expr)
    return names - recorded - RULER_SERIES


def fleet_cli_names(paths: Iterable[Path] = FLEET_CLI) -> set[str]:
    """Scraped names `stepscope diagnose --prometheus` queries (its string constants)."""
    return {name for path in paths for name in
            re.findall(r"(?<![\w:])((?:stepscope|DCGM_FI)_\w+)(?![\w:])", path.read_text())}


def kept_names(repo: Path = REPO) -> set[str]:
    """What the agents send: every name read, ``re:`` patterns included."""
    rules_dir = repo / RULES_DIR
    recorded = recorded_names(rules_dir)
    own = {n for n in names_read(rule_exprs(rules_dir, meta=True), recorded)
           if AGENT_OWN.fullmatch(n)}
    return (names_read(rule_exprs(rules_dir), recorded) | own
            | names_read(dashboard_exprs(repo / DASHBOARDS_DIR / "json"), recorded)
            | fleet_cli_names() | ALSO_KEPT)  # fmt: skip


_PREFIXES = ("DCGM_FI_", "stepscope_", "prometheus_remote_storage_")


def keep_regex_lines(names: set[str], indent: str = " " * 12) -> list[str]:
    """The keep list as a YAML double-quoted scalar over several lines (a backslash at a
    line's end joins the next without a space), grouped by prefix, sorted."""
    plain = sorted(n[3:] if n.startswith("re:") else n for n in names)
    groups: dict[str, list[str]] = {}
    for name in plain:
        prefix = next((p for p in _PREFIXES if name.startswith(p)), "")
        groups.setdefault(prefix, []).append(name[len(prefix):])
    parts = list(groups.get("", []))
    out = ['"' + "|".join(parts) + "|" + "\\"] if parts else ['"\\']
    prefixed = [p for p in _PREFIXES if p in groups]
    for i, prefix in enumerate(prefixed):
        line = indent + prefix + "("
        for j, alt in enumerate(groups[prefix]):
            piece = alt + ("|" if j < len(groups[prefix]) - 1 else ")")
            if len(line) + len(piece) > 86:
                out.append(line + "\\")
                line = indent
            line += piece
        out.append(line + ("|\\" if i < len(prefixed) - 1 else '"'))
    return out


def _scrape_configs(text: str) -> str:
    """The ``scrape_configs:`` section of a single-Prometheus config, comments included,
    up to its trailing commented-out blocks."""
    start = text.index("scrape_configs:")
    ends = [i for i in (text.find("\n# remote_write", start),
                        text.find("\n# Past one Prometheus", start),
                        text.find("\n# Meta-monitoring", start)) if i >= 0]  # fmt: skip
    return text[start:min(ends) if ends else len(text)].rstrip() + "\n"


HEADERS = {
    "agent-kubernetes.yml": """\
# Prometheus in agent mode for stepscope on Kubernetes, one per cluster: the discovery and
# relabelling of prometheus-kubernetes.yml, every sample it keeps remote-written to a
# central store that evaluates deploy/prometheus/rules/ (docs/scaling.md, "The scale-out
# path"). The agent's service account needs get/list/watch on pods.
""",
    "agent-ec2.yml": """\
# Prometheus in agent mode for stepscope on EC2 (ParallelCluster/Slurm, plain EC2 GPU
# fleets), one per cluster: the discovery and relabelling of prometheus-ec2.yml, every
# sample it keeps remote-written to a central store that evaluates deploy/prometheus/rules/
# (docs/scaling.md, "The scale-out path"). The agent host's IAM role needs
# ec2:DescribeInstances (and ec2:DescribeAvailabilityZones), plus aps:RemoteWrite for
# Amazon Managed Prometheus.
""",
}
GLOBAL = """\
global:
  scrape_interval: 15s
  scrape_timeout: 10s
  # `cluster` is a target label below, as in the single-Prometheus configs, so the series
  # carry it in the central store and the rules group by it. `replica` tells the two
  # agents of an HA pair apart (docs/scaling.md, "High availability"): run each with
  # `--enable-feature=agent,expand-external-labels` and STEPSCOPE_AGENT_REPLICA set (a
  # pod's name); unset, the label is empty and so absent. The store drops it and keeps
  # one sample per series and scrape interval (VictoriaMetrics: -dedup.minScrapeInterval
  # with deploy/victoriametrics/relabel.yml; Mimir, AMP: their HA tracker reads
  # `cluster` and `replica`).
  external_labels:
    replica: ${STEPSCOPE_AGENT_REPLICA}

"""
# The agent's own series (remote-write failures, lag, shards): scraped here and sent with
# the exporters', so the central ruler sees an agent failing to write
# (rules/stepscope-meta.yml), and an agent that stops sending altogether
# (StepscopeAgentSilent: its own `up` stops arriving).
SELF_SCRAPE = """
  # The agent itself (docs/runbooks.md, "Meta-monitoring"): its remote-write queue's
  # failures, lag and shards reach the central ruler with the exporters' series, and its
  # own `up` stops arriving when it dies (StepscopeAgentSilent). Its cluster: the same
  # name as the exporters' above.
  - job_name: prometheus-agent
    static_configs:
      - targets: [localhost:9090]
        labels:
          cluster: {cluster}
"""
REMOTE_WRITE = """
# Past one Prometheus (docs/scaling.md, "The scale-out path"): this agent keeps no TSDB to
# query and evaluates no rules; a central store does both, with deploy/prometheus/rules/ in
# its ruler. Run it with `prometheus --enable-feature=agent --config.file=THIS`.
remote_write:
  # Amazon Managed Service for Prometheus: SigV4 with the host's IAM role
  # (aps:RemoteWrite). Grafana Mimir: http://mimir-distributor.mimir.svc:8080/api/v1/push
  # with `headers: {X-Scope-OrgID: training}`; Thanos Receive:
  # http://thanos-receive.thanos.svc:19291/api/v1/receive; a Prometheus started with
  # --web.enable-remote-write-receiver: http://prometheus:9090/api/v1/write;
  # VictoriaMetrics: http://victoria-metrics:8428/api/v1/write.
  - url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-EXAMPLE/api/v1/remote_write
    sigv4:
      region: us-east-1
    # An agent that scrapes native histograms (--enable-feature=native-histograms: the
    # ranks' step time as one series) sends them only with this; without it they are
    # dropped silently and the step-time rules read nothing for those nodes. Harmless
    # where the agent scrapes text. VictoriaMetrics 1.79 stores no native histograms:
    # agents writing to it scrape classic (the default).
    send_native_histograms: true
    # Sized for 1,000 nodes x 8 GPUs x 8 ranks at this 15 s scrape: a node serves 655
    # series (docs/metrics.md, "What each family costs per node"), of which the keep list
    # below sends 437, so the cluster sends 437,000 series, ~29,000 samples/s (437,000 /
    # 15 s). One shard sends one batch at a time: 2,000 samples a request at 100-200 ms
    # a request (a remote store; 26 ms on loopback) is 10,000-20,000 samples/s a shard, so
    # 4 shards carry the steady load, and 30 drain a 10-minute outage's backlog (~17M
    # samples) in about a minute and a half. At most shards x capacity = 300,000 samples
    # are buffered. Measured (benchmarks/bench_remote_write.py, 1,000 nodes, a Prometheus
    # 2.42 agent and receiver): 29,147 samples/s sent on 4 shards, no lag, 1.1 MB/s on the
    # wire (37.5 bytes a sample), the agent at 0.20 cores and 2.4 GiB RSS.
    queue_config:
      capacity: 10000            # 5 requests' worth per shard
      max_samples_per_send: 2000
      batch_send_deadline: 5s
      min_shards: 4
      max_shards: 30
      min_backoff: 100ms
      max_backoff: 10s
    # Send what is read, drop the rest (218 of a node's 655 series: decode/encode and
    # copy-engine utilisation, the aggregate ECC counters, the per-pipe tensor breakdown,
    # the ranks' CPU, loader and SDK counters the node's own diagnosis reads, the
    # exporter's own process_*, HTTP and ingest counters). The list is every scraped
    # name the shipped rules (deploy/prometheus/rules/), the dashboards (dashboards/json/)
    # and `stepscope diagnose --prometheus` read, plus `up` (StepscopeExporterDown) and
    # stepscope_build_info, and the agent's own remote-write series that the
    # meta-monitoring rules read (stepscope-meta.yml): `python -m generate` writes it from
    # them. Add your own names in a second entry's keep list, or edit prometheus-*.yml
    # and the rules, not this file.
    write_relabel_configs:
      - source_labels: [__name__]
        action: keep
        regex: """


def render(repo: Path = REPO) -> dict[Path, str]:
    """Each agent file's content (paths relative to ``repo``)."""
    regex = "\n".join(keep_regex_lines(kept_names(repo))) + "\n"
    out = {}
    for agent, single in AGENTS.items():
        scrape = _scrape_configs((repo / PROMETHEUS_DIR / single).read_text())
        clusters = set(re.findall(r"target_label: cluster\n\s+replacement: (\S+)", scrape))
        if len(clusters) != 1:
            raise ValueError(f"{single}: expected one static `cluster` replacement for the "
                             f"agent's own job, found {sorted(clusters) or 'none'}")
        out[PROMETHEUS_DIR / agent] = (
            f"# GENERATED by python -m generate (generate/agents.py) from {single}'s\n"
            "# scrape_configs and the names the rules and dashboards read: edit those.\n"
            + HEADERS[agent] + GLOBAL + scrape
            + SELF_SCRAPE.replace("{cluster}", clusters.pop()) + REMOTE_WRITE + regex)
    return out


def write(repo: Path = REPO) -> list[str]:
    """Rewrite the agent configurations that changed; one line per file written."""
    return sync(repo, render(repo))
