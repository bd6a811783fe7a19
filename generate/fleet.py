"""The fleet tier as files a platform team applies (docs/deploy/fleet.md): plain Kubernetes
manifests for an HA pair of Prometheus agents, VictoriaMetrics, an HA pair of vmalert and a
two-member Alertmanager cluster (``deploy/kubernetes/fleet.yaml``), and the same tier as an
example for kube-prometheus-stack (``kube-prometheus-stack-values.yaml``) and for the
VictoriaMetrics operator (``victoriametrics-operator.yaml``).

Everything they carry that is shipped elsewhere is embedded from there, so it cannot
drift: the agent configuration (deploy/prometheus/agent-kubernetes.yml, its remote_write
pointed at the in-cluster store), the MetricsQL rules (rules-victoriametrics/), the
Alertmanager configuration and the store's relabelling (deploy/victoriametrics/). The
command-line flags are defined here once, in :data:`VICTORIAMETRICS_FLAGS`,
:data:`VMALERT_FLAGS` and :data:`ALERTMANAGER_FLAGS`; tests/e2e/test_ha.py runs the real
binaries with them (only URLs, paths and the test's clock substituted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from generate.constants import MANIFESTS_DIR, NAMESPACE, PROMETHEUS_DIR, REPO
from generate.files import sync

TIER_NAMESPACE = "stepscope-fleet"
ALERTMANAGER_DIR = Path("deploy/alertmanager")
VICTORIAMETRICS_DIR = Path("deploy/victoriametrics")
VM_RULES_DIR = PROMETHEUS_DIR / "rules-victoriametrics"
AGENT = PROMETHEUS_DIR / "agent-kubernetes.yml"
FLEET = MANIFESTS_DIR / "fleet.yaml"
KUBE_PROMETHEUS_STACK = MANIFESTS_DIR / "kube-prometheus-stack-values.yaml"
VM_OPERATOR = MANIFESTS_DIR / "victoriametrics-operator.yaml"

# The versions the tests run (Debian's packages): newer patch releases take the same flags.
IMAGES = {
    "prometheus": "quay.io/prometheus/prometheus:v2.42.0",
    "victoria-metrics": "victoriametrics/victoria-metrics:v1.79.5",
    "vmalert": "victoriametrics/vmalert:v1.79.5",
    "alertmanager": "quay.io/prometheus/alertmanager:v0.25.0",
}
VM_PORT, VMALERT_PORT, AM_PORT, AM_GOSSIP_PORT, AGENT_PORT = 8428, 8880, 9093, 9094, 9090
STORE = f"http://victoria-metrics.{TIER_NAMESPACE}.svc:{VM_PORT}"
AM_REPLICAS = 2
# one DNS name per Alertmanager pod, from the StatefulSet's headless Service
AM_PODS = [f"alertmanager-{i}.alertmanager.{TIER_NAMESPACE}.svc" for i in range(AM_REPLICAS)]
# where the containers find what the ConfigMaps hold
VM_RELABEL_PATH = "/etc/victoriametrics/relabel.yml"
VM_SCRAPE_PATH = "/etc/victoriametrics/scrape.yml"
VMALERT_RULES_DIR = "/etc/vmalert/rules"
AM_CONFIG_PATH = "/etc/alertmanager/alertmanager.yml"
AGENT_CONFIG_PATH = "/etc/prometheus/agent.yml"


def scrape_interval(repo: Path = REPO) -> str:
    """The agents' scrape interval (agent-*.yml, ``global.scrape_interval``): the store's
    deduplication interval and the ruler's evaluation interval follow it."""
    return str(yaml.safe_load((repo / AGENT).read_text())["global"]["scrape_interval"])


def victoriametrics_flags(interval: str) -> list[tuple[str, str]]:
    """VictoriaMetrics' flags, (name, value) in order, each with why."""
    return [
        ("storageDataPath", "/storage"),
        ("retentionPeriod", "30d"),
        ("httpListenAddr", f":{VM_PORT}"),
        # the agent pair's `replica` label dropped at ingestion: the pair's two copies of
        # a series become one series ...
        ("relabelConfig", VM_RELABEL_PATH),
        # ... of which one sample is kept per scrape interval
        ("dedup.minScrapeInterval", interval),
        # the newest 30 s are hidden from queries by default, delaying every alert by as
        # much; 5 s is one agent batch (batch_send_deadline)
        ("search.latencyOffset", "5s"),
        # the tier's own series (vmalert's evaluation errors and deliveries, every
        # Alertmanager member's failed notifications, the store itself), which the
        # meta-monitoring rules read: deploy/victoriametrics/scrape.yml with this tier's
        # addresses (:func:`tier_scrape_config`)
        ("promscrape.config", VM_SCRAPE_PATH),
    ]


def vmalert_flags(interval: str) -> list[tuple[str, str]]:
    """vmalert's flags, (name, value) in order (``notifier.url`` once per Alertmanager)."""
    return [
        ("rule", f"{VMALERT_RULES_DIR}/*.yml"),
        ("datasource.url", STORE),
        # recorded series and alert state (ALERTS, ALERTS_FOR_STATE) written to the store;
        # a restarted vmalert reads ALERTS_FOR_STATE back, so a pending alert keeps its
        # `for:` timer instead of starting it over
        ("remoteWrite.url", STORE),
        ("remoteRead.url", STORE),
        # both Alertmanagers get every alert; they notify once between them
        *[("notifier.url", f"http://{pod}:{AM_PORT}") for pod in AM_PODS],
        # the default is 1m: four scrapes late for `for: 15s`
        ("evaluationInterval", interval),
        # how far back a query looks for a sample (default 5m: a dead node's series stay
        # readable for minutes); one evaluation (VictoriaMetrics widens it to the series'
        # scrape interval when that is longer)
        ("datasource.queryStep", interval),
        ("httpListenAddr", f":{VMALERT_PORT}"),
    ]


def alertmanager_flags() -> list[tuple[str, str]]:
    """Alertmanager's flags for a member of the cluster (``cluster.peer`` once per member,
    itself included: every pod has the same arguments)."""
    return [
        ("config.file", AM_CONFIG_PATH),
        ("storage.path", "/alertmanager"),
        ("web.listen-address", f":{AM_PORT}"),
        ("cluster.listen-address", f"0.0.0.0:{AM_GOSSIP_PORT}"),
        ("cluster.advertise-address", f"$(POD_IP):{AM_GOSSIP_PORT}"),
        *[("cluster.peer", f"{pod}:{AM_GOSSIP_PORT}") for pod in AM_PODS],
    ]


def agent_flags() -> list[tuple[str, str]]:
    """The Prometheus agent's flags."""
    return [
        ("enable-feature", "agent,expand-external-labels"),
        ("config.file", AGENT_CONFIG_PATH),
        ("storage.agent.path", "/prometheus"),
        ("web.listen-address", f":{AGENT_PORT}"),
    ]


def args(flags: list[tuple[str, str]], dashes: str = "-") -> list[str]:
    """Command-line arguments: ``-name=value`` (``--`` for Prometheus' tools)."""
    return [f"{dashes}{name}={value}" for name, value in flags]


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the embedded files stay readable)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: list[dict[str, Any]], header: str) -> str:
    """YAML documents under a comment header."""
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100) for d in docs)
    return header + "---\n" + body


def _header(title: str, lines: str) -> str:
    text = f"{title}\n" + lines + (
        "Generated by python -m generate (generate/fleet.py) from the shipped agent, rules,\n"
        "Alertmanager and VictoriaMetrics files; edit those or a copy of this file.\n")
    return "".join(f"# {line}".rstrip() + "\n" for line in text.splitlines())


def agent_config(repo: Path = REPO) -> str:
    """deploy/prometheus/agent-kubernetes.yml with its remote_write sent to the tier's
    VictoriaMetrics instead of the AMP example (comments kept)."""
    text = (repo / AGENT).read_text()
    amp = ("  - url: https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-EXAMPLE/"
           "api/v1/remote_write\n    sigv4:\n      region: us-east-1\n")
    if amp not in text:
        raise ValueError(f"{AGENT}: its remote_write no longer starts with the AMP example")
    return text.replace(amp, f"  - url: {STORE}/api/v1/write\n")


def tier_scrape_config(repo: Path = REPO) -> str:
    """deploy/victoriametrics/scrape.yml with the tier's own addresses: both vmalert pods
    (their headless Service's A records, one target a pod), each Alertmanager member by
    its pod's name, and the store itself. The job names and every other setting are the
    shipped file's."""
    shipped = yaml.safe_load((repo / VICTORIAMETRICS_DIR / "scrape.yml").read_text())
    where: dict[str, dict[str, Any]] = {
        "vmalert": {"dns_sd_configs": [{"names": [f"vmalert.{TIER_NAMESPACE}.svc"],
                                        "type": "A", "port": VMALERT_PORT}]},
        "alertmanager": {"static_configs": [{"targets": [f"{pod}:{AM_PORT}"
                                                         for pod in AM_PODS]}]},
        "victoria-metrics": {"static_configs": [{"targets": [f"localhost:{VM_PORT}"]}]},
    }
    jobs = []
    for job in shipped["scrape_configs"]:
        name = job["job_name"]
        if name not in where:
            raise ValueError(f"deploy/victoriametrics/scrape.yml: job {name!r} has no "
                             "address in the fleet tier (generate/fleet.py)")
        kept = {k: v for k, v in job.items() if not k.endswith("_sd_configs")
                and k != "static_configs"}  # fmt: skip
        jobs.append({**kept, **where[name]})
    return yaml.safe_dump({**shipped, "scrape_configs": jobs}, sort_keys=False)


def _am_text(repo: Path) -> str:
    return (repo / ALERTMANAGER_DIR / "alertmanager.yml").read_text()


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*.yml"))}


def _meta(name: str, namespace: str = TIER_NAMESPACE, component: str = "") -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "stepscope"}
    if component:
        labels["app.kubernetes.io/component"] = component
    return {"name": name, "namespace": namespace, "labels": labels}


_POD_SECURITY = {
    "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534,
    "seccompProfile": {"type": "RuntimeDefault"},
}  # fmt: skip
_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}  # fmt: skip


def _container(name: str, image: str, argv: list[str], port: int, probe: str,
               mounts: list[tuple[str, str]], resources: dict[str, Any],
               env: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    container: dict[str, Any] = {
        "name": name, "image": IMAGES[image], "args": argv,
        "ports": [{"name": "http", "containerPort": port}],
    }  # fmt: skip
    if env:
        container["env"] = env
    container |= {
        "readinessProbe": {"httpGet": {"path": probe, "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": probe, "port": "http"}, "periodSeconds": 15,
                          "failureThreshold": 4},
        "resources": resources,
        "securityContext": _CONTAINER_SECURITY,
        "volumeMounts": [{"name": vol, "mountPath": path} for vol, path in mounts],
    }  # fmt: skip
    return container


def _pod(name: str, containers: list[dict[str, Any]], volumes: list[dict[str, Any]],
         service_account: str | None = None, spread: bool = True) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {}
    if service_account:
        spec["serviceAccountName"] = service_account
    else:
        spec["automountServiceAccountToken"] = False
    if spread:  # the two members of a pair on two nodes, where there are two
        spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {
                "topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": name}}}}]}}
    spec |= {"securityContext": _POD_SECURITY, "containers": containers, "volumes": volumes}
    return {"metadata": {"labels": {"app.kubernetes.io/name": name,
                                    "app.kubernetes.io/part-of": "stepscope"}},
            "spec": spec}  # fmt: skip


def _selector(name: str) -> dict[str, Any]:
    return {"matchLabels": {"app.kubernetes.io/name": name}}


def _service(name: str, ports: list[dict[str, Any]], headless: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"app.kubernetes.io/name": name}, "ports": ports}
    if headless:
        # the members find each other by their pods' names before they are ready
        spec = {"clusterIP": "None", "publishNotReadyAddresses": True, **spec}
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name), "spec": spec}


def _pdb(name: str) -> dict[str, Any]:
    """One member of a pair may be evicted at a time (a node drain), never both."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(name),
            "spec": {"minAvailable": 1, "selector": _selector(name)}}


def _configmap(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(name), "data": data}


def _pvc(name: str, size: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}


def fleet_objects(repo: Path = REPO) -> list[dict[str, Any]]:
    """Every object of deploy/kubernetes/fleet.yaml, in the order they apply."""
    interval = scrape_interval(repo)
    replica_env = [{"name": "STEPSCOPE_AGENT_REPLICA",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    pod_ip = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    agent = "stepscope-agent"
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": TIER_NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "stepscope",
                       "pod-security.kubernetes.io/enforce": "restricted"}}},
        # --- the agents: a pair, each scraping every exporter ---
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(agent)},
        # the exporters' pods, in their namespace only
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": _meta(agent, NAMESPACE),
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(agent, NAMESPACE),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": agent},
         "subjects": [{"kind": "ServiceAccount", "name": agent, "namespace": TIER_NAMESPACE}]},
        _configmap(agent, {"agent.yml": agent_config(repo)}),
        _service(agent, [{"name": "http", "port": AGENT_PORT, "targetPort": "http"}],
                 headless=True),
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": _meta(agent, component="agent"), "spec": {
             "serviceName": agent, "replicas": 2, "selector": _selector(agent),
             # a pod's name is its `replica` label: the store drops it and keeps one copy
             "template": _pod(agent, [_container(
                 "prometheus", "prometheus", args(agent_flags(), "--"), AGENT_PORT, "/-/ready",
                 [("config", "/etc/prometheus"), ("wal", "/prometheus")],
                 # 0.20 cores and 2.4 GiB measured for 1,000 nodes (docs/scaling.md)
                 {"requests": {"cpu": "250m", "memory": "3Gi"}, "limits": {"memory": "4Gi"}},
                 replica_env)],
                 [{"name": "config", "configMap": {"name": agent}},
                  {"name": "wal", "emptyDir": {}}], service_account=agent)}},
        _pdb(agent),
        # --- the store ---
        _configmap("victoria-metrics", {
            "relabel.yml": (repo / VICTORIAMETRICS_DIR / "relabel.yml").read_text(),
            "scrape.yml": tier_scrape_config(repo)}),
        _service("victoria-metrics", [{"name": "http", "port": VM_PORT, "targetPort": "http"}]),
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": _meta("victoria-metrics", component="store"), "spec": {
             "serviceName": "victoria-metrics", "replicas": 1,
             "selector": _selector("victoria-metrics"),
             "template": _pod("victoria-metrics", [_container(
                 "victoria-metrics", "victoria-metrics", args(victoriametrics_flags(interval)),
                 VM_PORT, "/health",
                 [("config", "/etc/victoriametrics"), ("storage", "/storage")],
                 {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}})],
                 [{"name": "config", "configMap": {"name": "victoria-metrics"}}], spread=False),
             "volumeClaimTemplates": [_pvc("storage", "200Gi")]}},
        # --- the ruler: a pair evaluating the same rules ---
        _configmap("vmalert", _files(repo / VM_RULES_DIR)),
        # headless: its A records name each pod, so the store scrapes both of the pair
        _service("vmalert", [{"name": "http", "port": VMALERT_PORT, "targetPort": "http"}],
                 headless=True),
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": _meta("vmalert", component="ruler"), "spec": {
             "replicas": 2, "selector": _selector("vmalert"),
             "template": _pod("vmalert", [_container(
                 "vmalert", "vmalert", args(vmalert_flags(interval)), VMALERT_PORT, "/health",
                 [("rules", VMALERT_RULES_DIR)],
                 {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}})],
                 [{"name": "rules", "configMap": {"name": "vmalert"}}])}},
        _pdb("vmalert"),
        # --- Alertmanager: a two-member cluster ---
        {"apiVersion": "v1", "kind": "Secret", "metadata": _meta("alertmanager"),
         "type": "Opaque",
         "stringData": {"alertmanager.yml": _am_text(repo)}},
        _service("alertmanager", [
            {"name": "http", "port": AM_PORT, "targetPort": "http"},
            {"name": "gossip-tcp", "port": AM_GOSSIP_PORT, "targetPort": AM_GOSSIP_PORT,
             "protocol": "TCP"},
            {"name": "gossip-udp", "port": AM_GOSSIP_PORT, "targetPort": AM_GOSSIP_PORT,
             "protocol": "UDP"},
        ], headless=True),
        {"apiVersion": "apps/v1", "kind": "StatefulSet",
         "metadata": _meta("alertmanager", component="alertmanager"), "spec": {
             "serviceName": "alertmanager", "replicas": AM_REPLICAS,
             "selector": _selector("alertmanager"),
             # both start at once: a member waits for its peers only while settling
             "podManagementPolicy": "Parallel",
             "template": _pod("alertmanager", [_container(
                 "alertmanager", "alertmanager", args(alertmanager_flags(), "--"), AM_PORT,
                 "/-/ready", [("config", "/etc/alertmanager"), ("data", "/alertmanager")],
                 {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
                 pod_ip)],
                 [{"name": "config", "secret": {"secretName": "alertmanager"}}]),
             "volumeClaimTemplates": [_pvc("data", "1Gi")]}},
        _pdb("alertmanager"),
    ]
    for obj in objs:  # gossip between members needs its ports declared on the container
        if obj["kind"] == "StatefulSet" and obj["metadata"]["name"] == "alertmanager":
            container = obj["spec"]["template"]["spec"]["containers"][0]
            container["ports"] += [
                {"name": "gossip-tcp", "containerPort": AM_GOSSIP_PORT, "protocol": "TCP"},
                {"name": "gossip-udp", "containerPort": AM_GOSSIP_PORT, "protocol": "UDP"}]
    return objs


FLEET_HEADER = """\
the fleet tier, HA (docs/deploy/fleet.md): kubectl apply -f fleet.yaml
In namespace stepscope-fleet: a pair of Prometheus agents scraping the exporters of
namespace stepscope (deploy/kubernetes/stepscope.yaml), VictoriaMetrics deduplicating the
pair, a pair of vmalert evaluating rules-victoriametrics/ with their state kept in the
store, and a two-member Alertmanager cluster. Before applying, edit in a copy: the
cluster's name (`replacement: my-eks-cluster` in the agent ConfigMap), the receivers (the
alertmanager Secret), the store's volume size and retention (docs/scaling.md).
"""


def _am_config(repo: Path) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(_am_text(repo))
    return config


def _rule_groups(repo: Path, directory: Path) -> list[dict[str, Any]]:
    return [g for text in _files(repo / directory).values() for g in yaml.safe_load(text)["groups"]]


KUBE_PROMETHEUS_STACK_HEADER = """\
values for kube-prometheus-stack (prometheus-community/kube-prometheus-stack), the tier
with the Prometheus Operator (docs/deploy/fleet.md):
  helm install kps prometheus-community/kube-prometheus-stack -n monitoring \\
    -f deploy/kubernetes/kube-prometheus-stack-values.yaml
  helm install stepscope helm/stepscope -n stepscope --create-namespace --set cluster=NAME
Two Prometheus replicas scrape the chart's ServiceMonitor and evaluate its PrometheusRule
(deploy/prometheus/rules/, PromQL) each; the operator labels them apart with `replica`
and drops it from the alerts, which both send to both Alertmanagers: one notification.
Agent mode instead: the operator's PrometheusAgent (monitoring.coreos.com/v1alpha1) with
the same serviceMonitorSelector and a remoteWrite to VictoriaMetrics, the rules in vmalert
as fleet.yaml or victoriametrics-operator.yaml run them.
"""


def kube_prometheus_stack_values(repo: Path = REPO) -> dict[str, Any]:
    """The example values for kube-prometheus-stack."""
    interval = scrape_interval(repo)
    return {
        "prometheus": {"prometheusSpec": {
            "replicas": 2,
            "replicaExternalLabelName": "replica",
            "scrapeInterval": interval,
            "evaluationInterval": interval,
            # the stepscope chart's ServiceMonitor and PrometheusRule, whatever their labels
            "serviceMonitorSelectorNilUsesHelmValues": False,
            "ruleSelectorNilUsesHelmValues": False,
            "retention": "15d",
            # optional: the long-term store (one remote write per replica; the store
            # deduplicates them as it does the agent pair's)
            # remoteWrite: [{url: http://victoria-metrics.stepscope-fleet.svc:8428/api/v1/write}]
        }},
        "alertmanager": {
            "alertmanagerSpec": {"replicas": AM_REPLICAS},
            "config": _am_config(repo),
        },
    }


VM_OPERATOR_HEADER = """\
the tier for the VictoriaMetrics operator (operator.victoriametrics.com/v1beta1), in
namespace stepscope-fleet (docs/deploy/fleet.md): kubectl apply -f victoriametrics-operator.yaml
Install the stepscope chart with --set prometheusRule.enabled=false: the operator converts
PrometheusRules into VMRules by default, and the PromQL rules' native-histogram branches
fail on VictoriaMetrics; the VMRule below holds rules-victoriametrics/ (MetricsQL). The
chart's ServiceMonitor is converted into a VMServiceScrape, which the VMAgent selects.
A VMCluster instead of the VMSingle: the same relabelConfig on vminsert
(spec.vminsert.extraArgs) and dedup.minScrapeInterval on vmselect and vmstorage
(spec.vmselect.extraArgs, spec.vmstorage.extraArgs); point the VMAgent's remoteWrite at
vminsert (/insert/0/prometheus/api/v1/write) and the VMAlert at vmselect
(/select/0/prometheus) and vminsert.
"""


def vm_operator_objects(repo: Path = REPO) -> list[dict[str, Any]]:
    """The example custom resources for the VictoriaMetrics operator."""
    interval = scrape_interval(repo)
    api = "operator.victoriametrics.com/v1beta1"
    single = f"http://vmsingle-stepscope.{TIER_NAMESPACE}.svc:8429"
    flags = dict(victoriametrics_flags(interval))
    relabel = "/etc/vm/configs/stepscope-vm-relabel/relabel.yml"
    # the agents' keep list, as the shipped agent configuration has it
    (remote,) = yaml.safe_load((repo / AGENT).read_text())["remote_write"]
    keep = remote["write_relabel_configs"]
    selector = {"matchLabels": {"app.kubernetes.io/part-of": "stepscope"}}
    vmalert = dict(vmalert_flags(interval))

    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": TIER_NAMESPACE,
                "labels": {"app.kubernetes.io/part-of": "stepscope"}}

    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("stepscope-vm-relabel"),
         "data": {"relabel.yml": (repo / VICTORIAMETRICS_DIR / "relabel.yml").read_text()}},
        {"apiVersion": api, "kind": "VMSingle", "metadata": meta("stepscope"), "spec": {
            "retentionPeriod": flags["retentionPeriod"],
            "configMaps": ["stepscope-vm-relabel"],
            "extraArgs": {"relabelConfig": relabel,
                          "dedup.minScrapeInterval": flags["dedup.minScrapeInterval"],
                          "search.latencyOffset": flags["search.latencyOffset"]},
            "storage": {"resources": {"requests": {"storage": "200Gi"}}}}},
        # a pair scraping the same targets: the store keeps one copy
        {"apiVersion": api, "kind": "VMAgent", "metadata": meta("stepscope"), "spec": {
            "replicaCount": 2,
            "scrapeInterval": interval,
            "serviceScrapeNamespaceSelector": {},
            "serviceScrapeSelector": {"matchLabels": {"app.kubernetes.io/name": "stepscope"}},
            "remoteWrite": [{"url": f"{single}/api/v1/write",
                             "inlineUrlRelabelConfig": keep}]}},
        {"apiVersion": api, "kind": "VMRule", "metadata": meta("stepscope"),
         "spec": {"groups": _rule_groups(repo, VM_RULES_DIR)}},
        {"apiVersion": api, "kind": "VMAlert", "metadata": meta("stepscope"), "spec": {
            "replicaCount": 2,
            "evaluationInterval": vmalert["evaluationInterval"],
            "ruleSelector": selector,
            "datasource": {"url": single},
            "remoteWrite": {"url": single},
            "remoteRead": {"url": single},
            "notifiers": [{"selector": {"labelSelector": selector}}],
            "extraArgs": {"datasource.queryStep": vmalert["datasource.queryStep"]}}},
        {"apiVersion": api, "kind": "VMAlertmanager", "metadata": meta("stepscope"), "spec": {
            "replicaCount": AM_REPLICAS,
            "configRawYaml": _am_text(repo)}},
    ]


def render(repo: Path = REPO) -> dict[Path, str]:
    """Generated path -> text."""
    return {
        FLEET: dump(fleet_objects(repo), _header(*_split(FLEET_HEADER))),
        KUBE_PROMETHEUS_STACK: _header(*_split(KUBE_PROMETHEUS_STACK_HEADER)) + yaml.dump(
            kube_prometheus_stack_values(repo), Dumper=_Dumper, sort_keys=False, width=100),
        VM_OPERATOR: dump(vm_operator_objects(repo), _header(*_split(VM_OPERATOR_HEADER))),
    }


def _split(text: str) -> tuple[str, str]:
    first, rest = text.split("\n", 1)
    return first, rest


def write(repo: Path = REPO) -> list[str]:
    """Rewrite the tier's files that changed; one line per file written."""
    return sync(repo, render(repo))

