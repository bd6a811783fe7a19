"""The Grafana dashboards: generated from code, consistent, and reading what exists.

No Grafana server runs here: the dashboards are proven by their structure, by their
generator, by their meaning (panels, queries, variables, options) held still across the
builders that write them, and (tests/e2e/test_prometheus.py) by every query returning data
from a real Prometheus scraping simulated nodes.

    python -m tests.deploy.test_dashboards    # after a deliberate change: rewrite MEANING
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from generate import dashboards
from stepscope.core.labels import with_host_label
from tests.support import REPO

DASHBOARDS = REPO / "dashboards"
# What the dashboards mean: each one as Grafana reads it, keys at Grafana's defaults
# dropped (normalised below), from the hand-built JSON the typed builders replaced
MEANING = REPO / "tests" / "fixtures" / "dashboards"
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


# Keys Grafana reads as this value when they are absent (its schema's and panel plugins'
# defaults, Grafana 10.4): grafana-foundation-sdk writes them, the hand-built JSON before it
# did not, so they are dropped before the meaning is compared, and only at that value. A
# dotted key is nested. A new SDK that writes another default fails the meaning test
# naming it: add it here once Grafana's default says it changes nothing.
DEFAULTS: dict[str, dict[str, Any]] = {
    "dashboard": {"fiscalYearStartMonth": 0},
    "link": {"icon": "", "tooltip": "", "tags": [], "asDropdown": False, "targetBlank": False,
             "includeVars": False, "keepTime": False},
    # a data-source variable's current {} is "the default data source"; auto* belong to
    # interval variables and are ignored by the others
    "variable": {"current": {}, "skipUrlSync": False, "auto": False, "auto_count": 30,
                 "auto_min": "10s"},
    "panel": {"transparent": False, "repeatDirection": "h"},
    # options by panel type
    "stat": {"wideLayout": True, "showPercentChange": False},
    "table": {"frameIndex": 0, "showTypeIcons": False, "footer.reducer": []},
    # exponent and fill are read by the opacity colour mode only (ours is a scheme)
    "heatmap": {"exemplars": {"color": "rgba(255,0,255,0.7)"}, "filterValues": {"le": 1e-9},
                "color.exponent": 0.5, "color.fill": "dark-orange"},
    "state-timeline": {"alignValue": "left", "legend.calcs": [],
                       "tooltip": {"mode": "single", "sort": "none"}},
}


def _drop_defaults(node: dict[str, Any], defaults: dict[str, Any]) -> None:
    for dotted, value in defaults.items():
        *parents, key = dotted.split(".")
        parent = node
        for name in parents:
            parent = parent.get(name, {})
        if key in parent and parent[key] == value:
            del parent[key]


def meaning(dash: dict[str, Any]) -> dict[str, Any]:
    """The dashboard with every key that holds Grafana's default for it dropped."""
    dash = copy.deepcopy(dash)
    _drop_defaults(dash, DEFAULTS["dashboard"])
    for link in dash["links"]:
        _drop_defaults(link, DEFAULTS["link"])
    for variable in dash["templating"]["list"]:
        _drop_defaults(variable, DEFAULTS["variable"])
    for panel in panels(dash):
        _drop_defaults(panel, DEFAULTS["panel"])
        _drop_defaults(panel.get("options", {}), DEFAULTS.get(panel["type"], {}))
    return dash


def _first_difference(want: Any, got: Any, path: str = "") -> str:
    if isinstance(want, dict) and isinstance(got, dict):
        for key in sorted(set(want) | set(got)):
            if key not in got:
                return f"{path}.{key}: missing"
            if key not in want:
                return f"{path}.{key}: added, {json.dumps(got[key])[:200]}"
            found = _first_difference(want[key], got[key], f"{path}.{key}")
            if found:
                return found
        return ""
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            found = _first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return ""
    return "" if want == got else f"{path}: {json.dumps(want)[:200]} -> {json.dumps(got)[:200]}"


def expected_meaning(host_label: str) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(with_host_label(p.read_text(), host_label))
            for p in sorted(MEANING.glob("*.json"))}


@pytest.mark.parametrize(("host_label", "folder"), FOLDERS.items())
def test_the_dashboards_mean_what_they_meant(host_label: str, folder: str) -> None:
    """Same panels (titles, types, places, units, thresholds, options), same queries, same
    variables as the fixture, whatever defaults the builders add."""
    want = expected_meaning(host_label)
    got = {name: meaning(dash) for name, dash in committed(folder).items()}
    assert set(got) == set(want)
    for name in want:
        assert got[name] == want[name], f"{name}{_first_difference(want[name], got[name])}"


def test_meaning_drops_only_defaults() -> None:
    """A key at a value other than Grafana's default stays: it changes what is drawn."""
    fleet = committed()["stepscope-fleet.json"]
    stat = next(p for p in fleet["panels"] if p["type"] == "stat")
    heat = next(p for p in fleet["panels"] if p["type"] == "heatmap")
    assert "wideLayout" not in meaning(fleet)["panels"][0]["options"]
    stat["options"]["wideLayout"] = False
    heat["options"]["color"]["exponent"] = 2
    kept = {p["title"]: p["options"] for p in meaning(fleet)["panels"]}
    assert kept[stat["title"]]["wideLayout"] is False
    assert kept[heat["title"]]["color"]["exponent"] == 2
    assert "transparent" not in kept and "fiscalYearStartMonth" not in meaning(fleet)


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


if __name__ == "__main__":
    # after a deliberate change to a dashboard, once python -m generate has written it
    MEANING.mkdir(parents=True, exist_ok=True)
    for path in MEANING.glob("*.json"):
        path.unlink()
    for name, dash in committed().items():
        (MEANING / name).write_text(json.dumps(meaning(dash), indent=2, sort_keys=True) + "\n")
