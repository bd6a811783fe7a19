"""The Helm chart, rendered by the real Helm engine in-process (helm-python-sdk), every
object validated against the Kubernetes schemas (kubernetes-validate --strict), the
Prometheus Operator objects checked for the fields the operator requires, and the rules
in the PrometheusRule checked by promtool."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from generate import manifests
from generate.constants import CHART, KUBE_VERSION, MANIFESTS_DIR
from tests.support import REPO, promtool
from tests.support.chart import (
    CI_VALUES,
    DASHBOARDS,
    RULES,
    by_kind,
    ci_values,
    one,
    pod_spec,
    rendered_objects,
)

VALUE_SETS = [pytest.param(None, id="default")] + [
    pytest.param(p, id=p.name.removesuffix("-values.yaml")) for p in CI_VALUES
]


@pytest.fixture(scope="module")
def default_objects() -> list[dict[str, Any]]:
    return rendered_objects()


def _main(objs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(objs)["containers"]
    assert [c["name"] for c in containers] == ["stepscope"]
    main: dict[str, Any] = containers[0]
    return main


# ---- lint, schema, validation for every values set


def test_ci_values_exist() -> None:
    assert {p.name for p in CI_VALUES} >= {
        "bottlerocket-values.yaml",
        "full-values.yaml",
        "minimal-values.yaml",
        "restricted-values.yaml",
        "simulate-values.yaml",
    }


@pytest.mark.parametrize("values_file", VALUE_SETS)
def test_helm_lint_strict_is_clean(values_file: Path | None) -> None:
    import helm_python

    values = ci_values(values_file) if values_file else None
    report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert not problems, problems


@pytest.mark.parametrize("values_file", VALUE_SETS)
def test_every_object_passes_kubernetes_validate_strict(values_file: Path | None) -> None:
    objs = rendered_objects(ci_values(values_file) if values_file else None)
    assert objs
    for obj in objs:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # no schema in kubernetes-validate; checked field by field below
        try:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']}: {exc}") from None


def test_kubernetes_validate_cli_accepts_the_plain_manifests(tmp_path: Path) -> None:
    cli = shutil.which("kubernetes-validate")
    assert cli, "kubernetes-validate is installed with the test extra"
    files = [str(REPO / MANIFESTS_DIR / "stepscope.yaml")]
    run = subprocess.run(
        [cli, "--strict", "--quiet", "-k", KUBE_VERSION, *files], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_values_schema_rejects_bad_values() -> None:
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema(chart.values)
        for bad in (
            {"port": "9400"},
            {"port": 70000},
            {"portt": 9400},
            {"image": {"digest": "latest"}},
            {"ingest": {"hostPath": "run/stepscope"}},
            {"serviceMonitor": {"interval": "fast"}},
            {"logLevel": "loud"},
            {"gpu": {"deviceListStrategy": "cdi"}},
            {"gpu": {"waitForDriver": -1}},
            {"networkPolicy": {"from": {}}},
            {"ingest": {"mode": "0777"}},  # execute bits
            {"ingest": {"mode": 660}},  # YAML reads it as decimal: a string, as octal
            {"ingest": {"group": "not a group"}},
            {"ingest": {"group": -1}},
            {"podResources": {"hostPath": "var/lib/kubelet/pod-resources"}},
            {"podResources": {"enable": True}},
        ):
            with pytest.raises(helm_python.HelmValuesError):
                chart.validate_schema(bad)


def test_a_misspelt_config_key_fails_at_install_naming_it() -> None:
    """Issue 27: `config: {intervall: 5}` rendered, and the pod crash-looped on the
    config file's unknown key; the schema's config keys are generated from SETTINGS."""
    import helm_python

    from stepscope.app.config import SETTINGS

    with helm_python.Chart.load(CHART) as chart:
        chart.validate_schema({"config": {key: None for key in SETTINGS}})
        chart.validate_schema({"config": {"interval": 5, "slow-interval": 10}})
        with pytest.raises(helm_python.HelmValuesError, match="intervall"):
            chart.validate_schema({"config": {"intervall": 5}})


# ---- the DaemonSet


def test_daemonset_runs_non_root_without_privilege_or_capabilities() -> None:
    # pod attribution off: nothing needs root (with it on, see the pod-resources tests)
    objs = rendered_objects({"podResources": {"enabled": False}})
    pod = pod_spec(objs)
    main = _main(objs)
    assert "runAsUser" not in main["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = main["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "hostPID" not in pod and pod["hostNetwork"] is False
    assert pod["automountServiceAccountToken"] is False
    # the GPU is visible through the NVIDIA runtime, never by taking a GPU from training
    for res in main["resources"].values():
        assert not any(k.startswith("nvidia.com/") for k in res)
    env = {e["name"]: e for e in main["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"


# ---- what a stock EKS GPU node, Bottlerocket and admission do with the pod

# What the API server of a new EKS cluster holds that a pod may name. The EKS AL2023
# NVIDIA AMI makes "nvidia" containerd's default runtime handler but no AMI can create
# API objects: there is no RuntimeClass unless someone (the GPU Operator) adds one.
STOCK_EKS = {
    "RuntimeClass": set(),
    "PriorityClass": {"system-node-critical", "system-cluster-critical"},
}


def _admission_rejections(objs: list[dict[str, Any]], cluster: dict[str, set[str]]) -> list[str]:
    """What the API server's admission (RuntimeClass, Priority) would refuse in the
    rendered pod, for a cluster holding ``cluster`` plus the rendered objects."""
    provided = {k: set(v) for k, v in cluster.items()}
    for o in objs:
        provided.setdefault(o["kind"], set()).add(o["metadata"]["name"])
    pod = pod_spec(objs)
    problems = []
    rc = pod.get("runtimeClassName")
    if rc and rc not in provided.get("RuntimeClass", set()):
        problems.append(f'RuntimeClass "{rc}" not found')
    pc = pod.get("priorityClassName")
    if pc and pc not in provided.get("PriorityClass", set()):
        problems.append(f'no PriorityClass with name {pc} was found')
    return problems


def test_default_pods_are_admitted_on_a_stock_eks_gpu_cluster(
    default_objects: list[dict[str, Any]],
) -> None:
    assert _admission_rejections(default_objects, STOCK_EKS) == []
    assert "runtimeClassName" not in pod_spec(default_objects), "the node's default runtime"


def test_naming_a_runtime_class_the_cluster_lacks_is_what_admission_rejects() -> None:
    # the old default: rejected on EKS AL2023 NVIDIA nodes without the GPU Operator
    objs = rendered_objects({"gpu": {"runtimeClassName": "nvidia"}})
    assert _admission_rejections(objs, STOCK_EKS) == ['RuntimeClass "nvidia" not found']
    gpu_operator = {**STOCK_EKS, "RuntimeClass": {"nvidia"}}
    assert _admission_rejections(objs, gpu_operator) == []


def _requested_devices(container: dict[str, Any], volumes: dict[str, Any]) -> list[str]:
    """The device list the NVIDIA container toolkit reads from a container's mounts
    when accept-nvidia-visible-devices-as-volume-mounts is true (Bottlerocket's default):
    a mount whose host source is /dev/null and whose path is below
    /var/run/nvidia-container-devices names one device (toolkit requestsFromMounts)."""
    root = "/var/run/nvidia-container-devices"
    devices = []
    for m in container.get("volumeMounts", []):
        source = volumes[m["name"]].get("hostPath", {}).get("path")
        dest = os.path.normpath(m["mountPath"])
        if source and os.path.normpath(source) == "/dev/null" and dest.startswith(root):
            name = dest.removeprefix(root).strip("/")
            if name:
                devices.append(name)
    return devices


def test_bottlerocket_volume_mounts_request_every_gpu_as_the_toolkit_reads_it() -> None:
    objs = rendered_objects(ci_values(CHART / "ci" / "bottlerocket-values.yaml"))
    pod, main = pod_spec(objs), _main(objs)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert _requested_devices(main, volumes) == ["all"]
    (request,) = [v for v in pod["volumes"] if v["name"] == "nvidia-device-request"]
    assert request["hostPath"] == {"path": "/dev/null", "type": "CharDevice"}
    # still unprivileged, still no nvidia.com/gpu, the variable kept for other runtimes
    assert main["securityContext"]["privileged"] is False
    assert {e["name"]: e.get("value") for e in main["env"]}["NVIDIA_VISIBLE_DEVICES"] == "all"
    # the default asks through the variable only, which Bottlerocket ignores
    default_pod = pod_spec(rendered_objects())
    default_volumes = {v["name"]: v for v in default_pod["volumes"]}
    assert _requested_devices(default_pod["containers"][0], default_volumes) == []


def test_wait_for_driver_reaches_the_exporter_only_when_set() -> None:
    env = {e["name"]: e.get("value") for e in _main(rendered_objects())["env"]}
    assert "STEPSCOPE_WAIT_FOR_DRIVER" not in env
    objs = rendered_objects({"gpu": {"waitForDriver": 30}})
    env = {e["name"]: e.get("value") for e in _main(objs)["env"]}
    assert env["STEPSCOPE_WAIT_FOR_DRIVER"] == "30"


def test_only_the_socket_directory_init_step_has_a_capability_and_it_is_chown(
    default_objects: list[dict[str, Any]],
) -> None:
    # the directory goes to the exporter's user: root with pod attribution (the default)
    (init,) = pod_spec(default_objects)["initContainers"]
    assert init["command"] == ["chown", "0:10001", "/run/stepscope"]
    (init,) = pod_spec(rendered_objects({"podResources": {"enabled": False}}))["initContainers"]
    assert init["command"] == ["chown", "10001:10001", "/run/stepscope"]
    sc = init["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True


def test_daemonset_lands_on_gpu_nodes_tolerating_their_taint(
    default_objects: list[dict[str, Any]],
) -> None:
    pod = pod_spec(default_objects)
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert {"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"} <= keys
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    ds = one(default_objects, "DaemonSet")
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def test_daemonset_names_the_node_probes_health_and_shares_the_ingest_socket(
    default_objects: list[dict[str, Any]],
) -> None:
    pod = pod_spec(default_objects)
    main = _main(default_objects)
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["STEPSCOPE_INGEST"]["value"] == "unix:///run/stepscope/ingest.sock"
    assert main["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["ingest"]["hostPath"] == {"path": "/run/stepscope", "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert mounts["ingest"] == "/run/stepscope"
    assert mounts["tmp"] == "/tmp"


def test_resources_are_sized_from_the_benchmarks(default_objects: list[dict[str, Any]]) -> None:
    res = _main(default_objects)["resources"]
    # 43 MB RSS and <1% of a core measured: requests just above, limits with headroom
    assert res["requests"] == {"cpu": "20m", "memory": "96Mi"}
    assert res["limits"]["memory"] == "256Mi"


# ---- Service, monitors, rules, dashboards


def test_prometheus_operator_objects_only_when_the_api_is_there() -> None:
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        plain = manifests.objects(chart.render(name="stepscope", namespace="stepscope"))
    kinds = {o["kind"] for o in plain}
    assert kinds.isdisjoint({"ServiceMonitor", "PodMonitor", "PrometheusRule"})
    assert {"DaemonSet", "Service"} <= kinds


def test_service_monitor_has_what_the_operator_requires(
    default_objects: list[dict[str, Any]],
) -> None:
    svc = one(default_objects, "Service")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"][0]["name"] == "metrics"
    sm = one(default_objects, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= svc["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["honorLabels"] is False, "Prometheus' job/instance win; ours is training_job"
    assert endpoint["interval"] == "15s"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["stepscope"]
    assert not by_kind(default_objects, "PodMonitor")


def test_full_values_pod_monitor_tls_basic_auth_and_dcgm_coexistence() -> None:
    objs = rendered_objects(ci_values(CHART / "ci" / "full-values.yaml"))
    pm = one(objs, "PodMonitor")
    ds_labels = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds_labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
    sm_endpoint = one(objs, "ServiceMonitor")["spec"]["endpoints"][0]
    assert sm_endpoint["basicAuth"]["password"] == {"name": "stepscope-scrape", "key": "password"}
    for ep in (endpoint, sm_endpoint):
        assert {"sourceLabels": ["__name__"], "regex": "DCGM_FI_.*", "action": "drop"} in ep[
            "metricRelabelings"
        ]
    secret = one(objs, "Secret")
    web = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web["tls_server_config"] == {"cert_file": "tls.crt", "key_file": "tls.key"}
    main = _main(objs)
    # kubelet's HTTP probe cannot authenticate: TCP probes with basic auth
    assert main["livenessProbe"]["tcpSocket"] == {"port": "metrics"}
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["STEPSCOPE_WEB_CONFIG"] == "/etc/stepscope/web/web-config.yml"
    assert env["STEPSCOPE_CONFIG"] == "/etc/stepscope/config/config.yaml"
    cm = next(o for o in by_kind(objs, "ConfigMap") if "config.yaml" in o["data"])
    assert yaml.safe_load(cm["data"]["config.yaml"])["max_jobs"] == 4
    annotations = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in annotations and "checksum/web-config" in annotations
    assert one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "ghcr.io/stepscope/stepscope@sha256:"
    )


def test_tls_without_basic_auth_keeps_http_probes_over_https() -> None:
    objs = rendered_objects(
        {"webConfig": {"enabled": True, "tlsSecret": "t", "config": {"tls_server_config": {}}}}
    )
    probe = _main(objs)["readinessProbe"]["httpGet"]
    assert probe["scheme"] == "HTTPS" and probe["path"] == "/readyz"


def test_minimal_values_render_just_the_daemonset() -> None:
    objs = rendered_objects(ci_values(CHART / "ci" / "minimal-values.yaml"))
    assert {o["kind"] for o in objs} == {"DaemonSet"}
    pod = pod_spec(objs)
    assert "initContainers" not in pod and "runtimeClassName" not in pod
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert {v["name"]: v for v in pod["volumes"]}["ingest"] == {"name": "ingest", "emptyDir": {}}


def _source_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in sorted(RULES.glob("*.yml")):
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


def test_prometheus_rule_is_built_from_deploy_prometheus_rules(
    default_objects: list[dict[str, Any]],
) -> None:
    assert list(RULES.glob("*.yml")), f"{RULES} holds no rule files"
    rule = one(default_objects, "PrometheusRule")
    assert rule["spec"]["groups"] == _source_groups(), "stale copies: python -m generate"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert ("record" in r) != ("alert" in r) and r["expr"]


def test_prometheus_rule_passes_promtool(
    default_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    tool = promtool()
    rules = by_kind(default_objects, "PrometheusRule")
    assert rules, "the chart renders no PrometheusRule by default"
    path = tmp_path / "rendered-rules.yml"
    path.write_text(yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}))
    run = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.fixture
def chart_with_files(tmp_path: Path) -> Iterator[Path]:
    """A copy of the chart whose rules/ and dashboards/ hold files made here: the
    templates, tested whatever the repository's rules and dashboards hold today."""
    chart = tmp_path / "stepscope"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("rules", "dashboards"))
    (chart / "rules").mkdir()
    (chart / "rules" / "a.yml").write_text(
        "groups:\n- name: a\n  rules:\n  - record: x:up:sum\n    expr: sum(up)\n"
    )
    (chart / "rules" / "b.yml").write_text(
        "groups:\n- name: b\n  rules:\n  - alert: Down\n    expr: up == 0\n"
        "    annotations: {summary: '{{ $labels.instance }} is down'}\n"
    )
    (chart / "dashboards").mkdir()
    (chart / "dashboards" / "stepscope-fleet.json").write_text(
        json.dumps({"title": "Fleet", "uid": "f"})
    )
    (chart / "dashboards" / "README.md").write_text("not a dashboard")
    yield chart


def test_every_rule_file_and_dashboard_in_the_chart_is_rendered(chart_with_files: Path) -> None:
    objs = rendered_objects(chart=chart_with_files)
    groups = one(objs, "PrometheusRule")["spec"]["groups"]
    assert [g["name"] for g in groups] == ["a", "b"]
    # Prometheus templates in annotations pass through Helm untouched
    assert groups[1]["rules"][0]["annotations"]["summary"] == "{{ $labels.instance }} is down"
    (cm,) = [o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("fleet")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "stepscope"}
    assert json.loads(cm["data"]["stepscope-fleet.json"]) == {"title": "Fleet", "uid": "f"}


def test_dashboards_of_the_repository_become_configmaps(
    default_objects: list[dict[str, Any]],
) -> None:
    sources = sorted(DASHBOARDS.glob("*.json"))
    assert sources, f"{DASHBOARDS} holds no dashboards"
    maps = {
        key: value
        for o in by_kind(default_objects, "ConfigMap")
        if o["metadata"]["labels"].get("grafana_dashboard") == "1"
        for key, value in o["data"].items()
    }
    assert maps == {p.name: p.read_text().rstrip("\n") for p in sources}


# ---- the plain manifests


def test_plain_manifests_are_up_to_date() -> None:
    for name, text in manifests.manifests().items():
        path = REPO / MANIFESTS_DIR / name
        assert path.exists() and path.read_text() == text, (
            f"{path.name} is stale: run python -m generate"
        )


def test_host_label_picks_the_exporter_label_rules_and_dashboards_from_one_value() -> None:
    objs = rendered_objects({"hostLabel": "hostname", "cluster": "train-east"})
    env = {e["name"]: e.get("value") for e in _main(objs)["env"]}
    assert env["STEPSCOPE_HOST_LABEL"] == "hostname"
    rule = one(objs, "PrometheusRule")
    text = yaml.safe_dump(rule["spec"]["groups"])
    assert "hostname" in text and not re.search(r"(?<![A-Za-z0-9_])Hostname(?![A-Za-z0-9])", text)
    for cm in by_kind(objs, "ConfigMap"):
        if "dashboard" in cm["metadata"]["name"]:
            assert "Hostname" not in json.dumps(cm["data"]), cm["metadata"]["name"]
    (endpoint,) = one(objs, "ServiceMonitor")["spec"]["endpoints"]
    assert {"targetLabel": "cluster", "replacement": "train-east"} in endpoint["relabelings"]
    # the default: dcgm-exporter's older label everywhere, no cluster relabeling
    default = rendered_objects()
    env = {e["name"]: e.get("value") for e in _main(default)["env"]}
    assert env["STEPSCOPE_HOST_LABEL"] == "Hostname"
    assert "by (cluster, Hostname)" in yaml.safe_dump(one(default, "PrometheusRule")["spec"])
    (endpoint,) = one(default, "ServiceMonitor")["spec"]["endpoints"]
    assert all(r.get("targetLabel") != "cluster" for r in endpoint["relabelings"])


# ---- pod attribution and who may report


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_pod_attribution_mounts_the_kubelet_socket_read_only_and_adds_uid_0_only(
    default_objects: list[dict[str, Any]],
) -> None:
    """On by default: the kubelet's pod-resources directory read-only, the socket named to
    the exporter, and root (the kubelet's socket is root's 0755) as the one privilege
    added: no capability, no escalation, read-only root file system."""
    pod, main = pod_spec(default_objects), _main(default_objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["pod-resources"]["hostPath"] == {
        "path": "/var/lib/kubelet/pod-resources", "type": "DirectoryOrCreate"}
    (mount,) = [m for m in main["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                     "readOnly": True}
    assert _env(main)["STEPSCOPE_KUBERNETES_POD_RESOURCES"] == (
        "/var/lib/kubelet/pod-resources/kubelet.sock")
    sc = main["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsGroup"] == 10001, "the socket's group stays"
    ds = one(default_objects, "DaemonSet")
    assert ds["metadata"]["annotations"]["stepscope.io/pod-security-level"] == "privileged"

    off = rendered_objects({"podResources": {"enabled": False}})
    assert "pod-resources" not in {v["name"] for v in pod_spec(off)["volumes"]}
    assert "STEPSCOPE_KUBERNETES_POD_RESOURCES" not in _env(_main(off))
    # a namespace at "restricted" still gets a pod without ingest and attribution
    restricted = rendered_objects(ci_values(CHART / "ci" / "restricted-values.yaml"))
    level = one(restricted, "DaemonSet")["metadata"]["annotations"]
    assert level["stepscope.io/pod-security-level"] == "restricted"


def test_the_scrape_drops_the_exporter_pods_own_pod_labels_only_with_attribution() -> None:
    objs = rendered_objects({"podMonitor": {"enabled": True}})
    drop = {"action": "labeldrop", "regex": "pod|namespace|container"}
    for kind in ("ServiceMonitor", "PodMonitor"):
        (endpoint,) = one(objs, kind)["spec"].get("endpoints") or one(objs, kind)["spec"][
            "podMetricsEndpoints"]
        assert drop in endpoint["relabelings"], kind
        assert endpoint["honorLabels"] is False
    off = rendered_objects({"podResources": {"enabled": False}})
    (endpoint,) = one(off, "ServiceMonitor")["spec"]["endpoints"]
    assert drop not in endpoint["relabelings"]


def test_the_ingest_socket_is_for_the_exporters_group_not_every_user(
    default_objects: list[dict[str, Any]],
) -> None:
    env = _env(_main(default_objects))
    assert (env["STEPSCOPE_INGEST_GROUP"], env["STEPSCOPE_INGEST_MODE"]) == ("10001", "0660")
    env = _env(_main(rendered_objects({"ingest": {"group": 2000, "mode": "0666"}})))
    assert (env["STEPSCOPE_INGEST_GROUP"], env["STEPSCOPE_INGEST_MODE"]) == ("2000", "0666")
    env = _env(_main(rendered_objects({"ingest": {"enabled": False}})))
    assert "STEPSCOPE_INGEST_GROUP" not in env


# What the docs' shell variables stand for, to render their commands as written.
EXAMPLE_SHELL = {
    "REGISTRY": "123456789012.dkr.ecr.us-east-1.amazonaws.com",
    "DIGEST": "sha256:" + "0" * 64,
    "VERSION": "0.1.0",
}


def documented_helm_commands() -> list[list[str]]:
    """Every `helm install|upgrade` of our chart in docs/deploy/eks.md, as argv."""
    text = (REPO / "docs" / "deploy" / "eks.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith(("helm install ", "helm upgrade ")) and "./helm/stepscope" in line:
                line = re.sub(r"\$(\w+)", lambda m: EXAMPLE_SHELL[m.group(1)], line)
                commands.append(shlex.split(line))
    return commands


def _helm_args(argv: list[str]) -> tuple[str, Path, str, dict[str, Any]]:
    """Release name, chart, namespace and --set values of a helm install/upgrade."""
    positional, namespace, values = [], "default", {}
    args = iter(argv[2:])
    for arg in args:
        if arg in ("-n", "--namespace"):
            namespace = next(args)
        elif arg == "--set":
            key, _, value = next(args).partition("=")
            *parents, leaf = key.split(".")
            node = values
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        elif arg in ("--create-namespace", "--install"):
            continue
        else:
            assert not arg.startswith("-"), f"a flag this test does not read: {arg}"
            positional.append(arg)
    name, chart = positional
    return name, REPO / chart, namespace, values


def test_the_documented_helm_commands_render_the_chart_as_written() -> None:
    """Issue 36: every install route the docs give is run by a test as written; Helm's
    own engine renders each `helm install`/`upgrade` of docs/deploy/eks.md with its
    release name, namespace and --set values."""
    commands = documented_helm_commands()
    assert len(commands) >= 2, commands
    for argv in commands:
        name, chart, namespace, values = _helm_args(argv)
        objs = manifests.objects(manifests.render_chart(
            values, chart=chart, name=name, namespace=namespace))
        daemonset = one(objs, "DaemonSet")
        assert daemonset["metadata"]["namespace"] == namespace, argv
        (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                        if c["name"] == "stepscope"]
        image = values.get("image", {})
        if "digest" in image:
            assert container["image"] == f"{image['repository']}@{image['digest']}"
        # the objects of the default values are checked against the schemas above
