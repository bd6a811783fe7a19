"""One source for every judgement made outside the process: the shipped rules are rendered
from stepscope.diagnose.fleet_rules, every number of it reaches them, and the node's own
defaults and the docs say the same numbers."""

from __future__ import annotations

import dataclasses
import re

import pytest

from stepscope.diagnose.fleet_rules import FLEET, FleetRules, duration_seconds, render
from stepscope.diagnose.thresholds import Thresholds
from tests.support import REPO

SOURCES = sorted((REPO / "deploy" / "prometheus" / "rules-src").glob("*.yml"))
SHIPPED = REPO / "deploy" / "prometheus" / "rules"


def rendered(rules: FleetRules = FLEET) -> str:
    return "".join(render(p.read_text(), rules) for p in SOURCES)


def test_the_shipped_rules_are_their_sources_rendered_with_the_fleet_thresholds() -> None:
    assert [p.name for p in SOURCES] == sorted(p.name for p in SHIPPED.glob("*.yml"))
    for source in SOURCES:
        body = render(source.read_text())
        assert "<%" not in body and "%>" not in body, source.name
        assert (SHIPPED / source.name).read_text().endswith(body), source.name


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(FleetRules)])
def test_every_fleet_threshold_reaches_the_rules(name: str) -> None:
    value = getattr(FLEET, name)
    other = "7m" if isinstance(value, str) else value * 1.5 + 0.01
    changed = rendered(dataclasses.replace(FLEET, **{name: other}))
    assert changed != rendered(), f"{name} is used by no rule source"


def test_descriptions_say_the_numbers_the_expressions_use() -> None:
    alerts = render((REPO / "deploy/prometheus/rules-src/stepscope-alerts.yml").read_text(),
                    dataclasses.replace(FLEET, rank_straggler_ratio=1.4, thermal_for="90s",
                                        throttle_share=0.15))  # fmt: skip
    assert "training_job_rank:stepscope_straggler_score:ratio > 1.4" in alerts
    assert "(threshold 1.4x) for 30 seconds" in alerts
    assert "ratio_rate2m > 0.15\n        for: 90s" in alerts
    assert "(threshold 15%) for 90 seconds" in alerts


def test_a_placeholder_the_module_lacks_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"unknown fleet threshold <% typo %>"):
        render("expr: x > <% typo %>")
    with pytest.raises(ValueError, match=r"unknown format 'percent'"):
        render("expr: x > <% throttle_share | percent %>")
    with pytest.raises(ValueError, match="expected a duration"):
        duration_seconds("1m30s")


def test_the_nodes_own_defaults_are_the_fleet_numbers_where_they_mean_the_same() -> None:
    th = Thresholds()
    assert th.throttle_share == FLEET.throttle_share
    assert th.sm_active_busy == FLEET.sm_active_busy
    assert th.pcie_replays_per_minute == FLEET.pcie_replays_per_minute


def test_docs_list_every_fleet_threshold_with_its_value() -> None:
    text = (REPO / "docs" / "diagnosis.md").read_text()
    section = text.split("## One source for every judgement", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", section, re.M))
    expected = {f.name: f"{getattr(FLEET, f.name):g}" if isinstance(getattr(FLEET, f.name),
                float) else getattr(FLEET, f.name) for f in dataclasses.fields(FleetRules)}
    assert rows == expected
