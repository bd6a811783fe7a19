"""The chart as GitOps tools and chart repositories get it: real files only (Flux's
source-controller drops symbolic links), rules and dashboards that cannot drift from
their sources, a packaged archive that lints clean and renders everything, and the Pod
Security level and NetworkPolicy an operator needs to know about."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from generate import chart_copies, chart_package
from generate.constants import CHART, KUBE_VERSION
from tests.support import REPO
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


def _rule_groups(directory: Path) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.yml")):
        groups += yaml.safe_load(path.read_text())["groups"]
    return groups


# ---- real files, one source


def test_the_chart_holds_no_symbolic_links() -> None:
    links = [p.relative_to(CHART) for p in CHART.rglob("*") if p.is_symlink()]
    assert links == [], "GitOps tools drop symbolic links: the chart must hold real files"


def test_the_chart_copies_of_rules_and_dashboards_equal_their_sources() -> None:
    assert chart_copies.drift() == [], "run: python -m generate"
    assert sorted(p.name for p in (CHART / "rules").iterdir()) == sorted(
        p.name for p in RULES.glob("*.yml")
    )
    assert sorted(p.name for p in (CHART / "dashboards").iterdir()) == sorted(
        p.name for p in DASHBOARDS.glob("*.json")
    )


def test_generator_check_fails_on_drift_and_a_rerun_repairs_it(tmp_path: Path) -> None:
    chart = tmp_path / "stepscope"
    shutil.copytree(CHART, chart)
    rule = next((chart / "rules").glob("*.yml"))
    rule.write_text(rule.read_text() + "# edited in the chart, not at the source\n")
    (chart / "dashboards" / "stepscope-gone.json").write_text("{}")
    dashboard = next((chart / "dashboards").glob("stepscope-fleet.json"))
    dashboard.unlink()
    problems = chart_copies.drift(chart)
    assert f"rules/{rule.name}: differs from its source" in problems
    assert "dashboards/stepscope-gone.json: no longer in its source" in problems
    assert "dashboards/stepscope-fleet.json: missing" in problems
    chart_copies.write(chart)
    assert chart_copies.drift(chart) == []


def test_a_copy_with_symbolic_links_dropped_renders_the_same(tmp_path: Path) -> None:
    # what Flux's source-controller hands helm-controller: the tree without its links
    flux = tmp_path / "stepscope"
    shutil.copytree(CHART, flux, symlinks=True)
    for path in flux.rglob("*"):
        if path.is_symlink():
            path.unlink()
    assert rendered_objects(chart=flux) == rendered_objects()


# ---- the packaged chart


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run = subprocess.run(
        [sys.executable, "-m", "generate", "--check", "--package", str(out)],
        cwd=REPO, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    path = Path(run.stdout.strip().splitlines()[-1])
    assert path.parent == out and path.name == "stepscope-0.1.0.tgz"
    return path


def test_the_archive_holds_real_files_only(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
    assert not [m.name for m in members if m.issym() or m.islnk()]
    names = {m.name for m in members}
    for src in [*RULES.glob("*.yml"), *DASHBOARDS.glob("*.json")]:
        folder = "rules" if src.suffix == ".yml" else "dashboards"
        assert f"stepscope/{folder}/{src.name}" in names, src.name


def test_the_archive_lints_clean_with_every_ci_values_file(archive: Path) -> None:
    import helm_python

    for values in [None, *CI_VALUES]:
        report = helm_python.lint(
            archive, ci_values(values) if values else None, strict=True,
            kube_version=f"v{KUBE_VERSION}",
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, (values, problems)


def test_the_archive_renders_the_rules_and_dashboards_of_the_repository(
    archive: Path,
) -> None:
    objs = rendered_objects(chart=archive)
    assert one(objs, "PrometheusRule")["spec"]["groups"] == _rule_groups(RULES)
    dashboards = {
        key
        for o in by_kind(objs, "ConfigMap")
        if o["metadata"]["labels"].get("grafana_dashboard") == "1"
        for key in o["data"]
    }
    assert dashboards == {p.name for p in DASHBOARDS.glob("*.json")}
    assert objs == rendered_objects()


def test_packaging_refuses_a_chart_whose_copies_drifted(tmp_path: Path) -> None:
    chart = tmp_path / "stepscope"
    shutil.copytree(CHART, chart)
    next((chart / "rules").glob("*.yml")).write_text("groups: []\n")
    with pytest.raises(SystemExit, match="chart copies are stale"):
        chart_package.package(tmp_path / "dist", chart=chart)
    assert not (tmp_path / "dist").exists()


# ---- Pod Security Standards

# The controls of kubernetes.io/docs/concepts/security/pod-security-standards that the
# chart's values can reach, evaluated on the rendered pod independently of the chart's
# own stepscope.podSecurityLevel helper.
_BASELINE_CAPS = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
    "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}


def pod_security_violations(pod: dict[str, Any], level: str) -> list[str]:
    """Controls of ``level`` ("baseline" or "restricted") the pod spec violates."""
    found = []
    containers = pod.get("initContainers", []) + pod["containers"]
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            found.append(key)
    for vol in pod.get("volumes", []):
        if "hostPath" in vol:
            found.append(f"hostPath volume {vol['name']}")
    for c in containers:
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            found.append(f"{c['name']}: privileged")
        added = set(sc.get("capabilities", {}).get("add", []))
        if added - _BASELINE_CAPS:
            found.append(f"{c['name']}: capabilities {sorted(added - _BASELINE_CAPS)}")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                found.append(f"{c['name']}: hostPort")
    if level == "baseline":
        return found
    psc = pod.get("securityContext", {})
    for vol in pod.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            found.append(f"volume {vol['name']}: {sorted(kinds)}")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    for c in containers:
        sc = c.get("securityContext", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            found.append(f"{c['name']}: capabilities not dropped")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{c['name']}: adds capabilities")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            found.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault",
                                                                        "Localhost"):
            found.append(f"{c['name']}: seccompProfile")
    return found


def required_level(pod: dict[str, Any]) -> str:
    for level in ("restricted", "baseline"):
        if not pod_security_violations(pod, level):
            return level
    return "privileged"


VALUE_SETS = [pytest.param(None, id="default")] + [
    pytest.param(p, id=p.name.removesuffix("-values.yaml")) for p in CI_VALUES
]


@pytest.mark.parametrize("values_file", VALUE_SETS)
def test_the_announced_pod_security_level_is_the_one_the_pod_needs(
    values_file: Path | None,
) -> None:
    objs = rendered_objects(ci_values(values_file) if values_file else None)
    ds = one(objs, "DaemonSet")
    announced = ds["metadata"]["annotations"]["stepscope.io/pod-security-level"]
    assert announced == required_level(pod_spec(objs))


def test_defaults_need_privileged_and_without_host_access_restricted_suffices() -> None:
    # the ingest socket is a hostPath: no namespace below "privileged" admits it
    assert required_level(pod_spec(rendered_objects())) == "privileged"
    restricted = ci_values(CHART / "ci" / "restricted-values.yaml")
    assert required_level(pod_spec(rendered_objects(restricted))) == "restricted"


def test_the_install_notes_tell_the_namespace_label_to_set() -> None:
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(name="stepscope", namespace="gpu-monitoring")
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert (
        "kubectl label namespace gpu-monitoring "
        "pod-security.kubernetes.io/enforce=privileged" in notes
    )
    # what a training pod needs to report, and what pod attribution adds
    assert "securityContext.supplementalGroups: [10001]" in notes
    assert "Pod attribution is on" in notes and "runs as uid 0" in notes


def test_plain_manifests_label_their_namespace_with_the_level() -> None:
    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "stepscope.yaml").read_text()))
    ns = next(d for d in docs if d and d["kind"] == "Namespace")
    ds = next(d for d in docs if d and d["kind"] == "DaemonSet")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == required_level(
        ds["spec"]["template"]["spec"]
    )


# ---- NetworkPolicy


def test_network_policy_admits_only_the_listed_scrapers_to_the_metrics_port() -> None:
    objs = rendered_objects(ci_values(CHART / "ci" / "bottlerocket-values.yaml"))
    policy = one(objs, "NetworkPolicy")["spec"]
    pod_labels = one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": 9400, "protocol": "TCP"}]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }
    ]
    assert not by_kind(rendered_objects(), "NetworkPolicy"), "off by default"


def test_network_policy_without_peers_is_refused_not_opened_to_everyone() -> None:
    import helm_python

    # an ingress rule with no "from" admits every source: the chart fails instead
    with pytest.raises(helm_python.HelmError, match=r"networkPolicy\.enabled needs"):
        rendered_objects({"networkPolicy": {"enabled": True}})


def test_the_kubernetes_schema_accepts_the_network_policy() -> None:
    import kubernetes_validate

    objs = rendered_objects(ci_values(CHART / "ci" / "bottlerocket-values.yaml"))
    kubernetes_validate.validate(one(objs, "NetworkPolicy"), KUBE_VERSION, strict=True)
