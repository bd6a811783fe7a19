"""The Helm chart as the tests render it: the real Helm engine in-process
(helm-python-sdk, through ``generate.manifests``), and the objects picked out of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from generate import manifests
from generate.constants import CHART, KUBE_VERSION, MONITORING_API
from tests.support.paths import REPO

RULES = REPO / "deploy" / "prometheus" / "rules"
DASHBOARDS = REPO / "dashboards" / "json"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def rendered_objects(
    values: dict[str, Any] | None = None, *, operator: bool = True, chart: Path = CHART
) -> list[dict[str, Any]]:
    apis = (MONITORING_API,) if operator else ()
    out = manifests.render_chart(
        values, chart=chart, api_versions=apis, kube_version=f"v{KUBE_VERSION}"
    )
    objs: list[dict[str, Any]] = manifests.objects(out)
    return objs


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def ci_values(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text())
    return values



def pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objs, "DaemonSet")["spec"]["template"]["spec"]
    return spec
