"""The Grafana dashboards: generated from code, consistent, and reading what exists.

No Grafana server runs here: the dashboards are proven by their structure, by their
generator, and (tests/e2e/test_prometheus.py) by every query returning data from a real
Prometheus scraping simulated nodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from generate import dashboards
from tests.support import REPO

DASHBOARDS = REPO / "dashboards"
PANEL_TYPES = {"timeseries", "table", "heatmap", "stat", "state-timeline", "row"}
VARIABLES = {"datasource", "cluster", "training_job", "Hostname", "gpu"}
# host label -> the folder of its dashboards (one source: the generator)
FOLDERS = {label: folder.name for label, folder in dashboards.OUT_DIRS.items()}
METRIC = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*(?::[A-Za-z0-9_]+){2}|DCGM_FI_\w+|stepscope_\w+)\b")


def committed(folder: str = "json") -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((DASHBOARDS / folder).glob("*.json"))}


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dash: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for panel in panels(dash):
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


@pytest.mark.parametrize(("host_label", "folder"), FOLDERS.items())
def test_committed_json_is_what_the_generator_writes(host_label: str, folder: str) -> None:
    rendered = dashboards.render(host_label)
    on_disk = {p.name: p.read_text() for p in (DASHBOARDS / folder).glob("*.json")}
    assert set(on_disk) == set(rendered)
    for name, text in rendered.items():
        assert on_disk[name] == text, f"{name} is stale: run python -m generate"


def test_the_hostname_set_uses_only_the_lower_case_label() -> None:
    for name, dash in committed("json-hostname").items():
        text = json.dumps(dash)
        assert "Hostname" not in text, name
        variables = {v["name"] for v in dash["templating"]["list"]}
        assert variables == VARIABLES - {"Hostname"} | {"hostname"}
        assert all("$hostname" in e for t, e in queries(dash) if "ALERTS" not in e and
                   "training_job:" not in e.split("{")[0]), name


def test_three_dashboards_fleet_node_training() -> None:
    titles = {d["uid"]: d["title"] for d in committed().values()}
    assert set(titles) == {"stepscope-fleet", "stepscope-node", "stepscope-training"}


@pytest.mark.parametrize("name", sorted(committed()))
def test_structure_variables_types_units(name: str) -> None:
    dash = committed()[name]
    assert dash["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert set(variables) == VARIABLES
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    for panel in panels(dash):
        assert panel["type"] in PANEL_TYPES, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
        for override in panel["fieldConfig"]["overrides"]:
            props = {p["id"] for p in override["properties"]}
            assert "unit" in props, panel["title"]
    # panels do not overlap on the 24-column grid
    cells: set[tuple[int, int]] = set()
    for panel in panels(dash):
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"])
                for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, panel["title"]
        cells |= mine


def test_queries_use_the_variables_and_read_served_or_recorded_metrics() -> None:
    recorded = set()
    for path in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            recorded |= {r["record"] for r in group["rules"] if "record" in r}
    documented = (REPO / "docs" / "metrics.md").read_text()
    for dash in committed().values():
        for title, expr in queries(dash):
            for name in METRIC.findall(expr):
                if name in recorded:
                    continue
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                assert f"`{base}`" in documented, f"{title}: {name} is neither served nor recorded"
            if "ALERTS" not in expr:
                assert "$Hostname" in expr or "$training_job" in expr, f"{title}: {expr}"


def test_fleet_dashboard_shows_the_straggler_table_and_heatmap() -> None:
    fleet = committed()["stepscope-fleet.json"]
    table = next(p for p in panels(fleet) if p["title"].startswith("Stragglers"))
    assert table["type"] == "table"
    exprs = [t["expr"] for t in table["targets"]]
    assert exprs[0].startswith("Hostname:DCGM_FI_PROF_SM_ACTIVE:min")
    sort = next(t for t in table["transformations"] if t["id"] == "sortBy")
    assert sort["options"]["sort"] == [{"field": "Value #A", "desc": False}]
    assert any(p["type"] == "heatmap" for p in panels(fleet))


def test_provisioning_points_grafana_at_the_dashboards_and_prometheus() -> None:
    prov = DASHBOARDS / "provisioning"
    providers = yaml.safe_load((prov / "dashboards" / "stepscope.yaml").read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    sources = yaml.safe_load((prov / "datasources" / "stepscope-prometheus.yaml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"].startswith("http")


def test_docs_describe_every_dashboard_panel() -> None:
    doc = (REPO / "docs" / "dashboards.md").read_text()
    for dash in committed().values():
        assert dash["title"] in doc
        for panel in panels(dash):
            if panel["type"] != "row":
                assert panel["title"] in doc, panel["title"]
