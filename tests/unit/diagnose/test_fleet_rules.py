"""One source for every judgement made outside the process: the shipped rules are rendered
from stepscope.diagnose.fleet_rules, every number of it reaches them, and the node's own
defaults and the docs say the same numbers."""

from __future__ import annotations

import dataclasses
import re

import pytest

from stepscope.diagnose.faults import CRITICAL_XIDS
from stepscope.diagnose.fleet_rules import (
    FLEET,
    FORMATS,
    FleetRules,
    duration_seconds,
    plain,
    render,
)
from stepscope.diagnose.kinds import BOTTLENECK_KINDS, KINDS
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
    if isinstance(value, tuple):
        other: object = (*value, 999)
    else:
        other = "7m" if isinstance(value, str) else value * 1.5 + 0.01
    changed = rendered(dataclasses.replace(FLEET, **{name: other}))
    assert changed != rendered(), f"{name} is used by no rule source"


def test_descriptions_say_the_numbers_the_expressions_use() -> None:
    alerts = render((REPO / "deploy/prometheus/rules-src/stepscope-alerts.yml").read_text(),
                    dataclasses.replace(FLEET, rank_straggler_ratio=1.4, thermal_for="90s",
                                        throttle_share=0.15))  # fmt: skip
    assert "training_job_rank:stepscope_straggler_score:ratio > 1.4" in alerts
    assert "(threshold 1.4x) for 2 minutes" in alerts
    assert "ratio_rate2m > 0.15\n        for: 90s" in alerts
    assert "(threshold 15%) for 90 seconds" in alerts


def test_the_stalled_low_mfu_and_xid_alerts_say_the_numbers_their_expressions_use() -> None:
    alerts = render((REPO / "deploy/prometheus/rules-src/stepscope-alerts.yml").read_text(),
                    dataclasses.replace(FLEET, stalled_step_factor=6.0, stalled_min_silence="5m",
                                        low_mfu_share=0.3, drain_xids=(48, 79)))  # fmt: skip
    assert "clamp_min(6 * (" in alerts and "), 300)" in alerts
    assert "stepscope_last_step_timestamp_seconds + 300\n" in alerts
    assert "more than 6 times its usual step time and at least 5 minutes" in alerts
    assert "training_job:stepscope_mfu_ratio:avg < 0.3\n" in alerts
    assert "(threshold 30%; 40-50% is good" in alerts
    assert alerts.count('{xid=~"48|79"}') == 2 and alerts.count('{xid!~"48|79"}') == 2


def test_the_bottleneck_alert_warns_on_every_bottleneck_kind_but_gpu_fault() -> None:
    """A kind the diagnosis adds to its bottlenecks is alerted on without a rule edit."""
    assert set(FLEET.bottleneck_kinds) == set(BOTTLENECK_KINDS) - {"gpu_fault"}
    assert set(FLEET.bottleneck_kinds) <= set(KINDS)
    shipped = (SHIPPED / "stepscope-alerts.yml").read_text()
    (kinds,) = re.findall(r'stepscope_bottleneck\{kind=~"([a-z_|]+)"\} == 1', shipped)
    assert set(kinds.split("|")) == set(BOTTLENECK_KINDS) - {"gpu_fault"}
    assert {"transfer_bound", "between_steps"} <= set(kinds.split("|"))


def test_a_placeholder_the_module_lacks_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"unknown fleet threshold <% typo %>"):
        render("expr: x > <% typo %>")
    with pytest.raises(ValueError, match=r"unknown format 'percent'"):
        render("expr: x > <% throttle_share | percent %>")
    with pytest.raises(ValueError, match="expected a duration"):
        duration_seconds("1m30s")
    with pytest.raises(ValueError, match="expected a list"):
        render("expr: x{xid=~\"<% low_mfu_share | regex %>\"}")


def test_the_nodes_own_defaults_are_the_fleet_numbers_where_they_mean_the_same() -> None:
    th = Thresholds()
    assert th.throttle_share == FLEET.throttle_share
    assert th.sm_active_busy == FLEET.sm_active_busy
    assert th.pcie_replays_per_minute == FLEET.pcie_replays_per_minute
    # the XIDs the node holds as gpu_fault are the ones the fleet drains, each described
    assert list(CRITICAL_XIDS) == list(FLEET.drain_xids)
    assert all(kind.action != "see NVIDIA's XID catalogue" for kind in CRITICAL_XIDS.values())


def test_docs_list_every_fleet_threshold_with_its_value() -> None:
    text = (REPO / "docs" / "diagnosis.md").read_text()
    section = text.split("## One source for every judgement", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)` \|", section, re.M))
    assert rows == {f.name: plain(getattr(FLEET, f.name)) for f in dataclasses.fields(FleetRules)}


def runbook(alert: str) -> str:
    text = (REPO / "docs" / "runbooks.md").read_text()
    return " ".join(text.split(f"\n## {alert}\n", 1)[1].split("\n## ", 1)[0].split())


def codes(text: str) -> set[int]:
    """The XIDs a text names: ``48``, ``119/120``, ``144-150``."""
    out: set[int] = set()
    for token in re.findall(r"\b\d+(?:[-/]\d+)?\b", text):
        if "-" in token:
            low, high = map(int, token.split("-"))
            out |= set(range(low, high + 1))
        else:
            out |= set(map(int, token.split("/")))
    return out


def test_the_runbooks_dashboards_and_xid_table_say_the_fleet_values() -> None:
    """The prose that states a threshold of the fleet module, checked against it."""
    words, pct = FORMATS["words"], FORMATS["pct"]
    stalled = runbook("StepscopeTrainingStalled")
    assert f"more than {plain(FLEET.stalled_step_factor)} times" in stalled
    assert f"and at least {words(FLEET.stalled_min_silence)}" in stalled
    assert f"warm-up steps, after {words(FLEET.stalled_min_silence)}" in stalled
    assert f"under {pct(FLEET.low_mfu_share)} for" in runbook("StepscopeLowMfu")
    dashboards = (REPO / "docs" / "dashboards.md").read_text()
    assert f"| MFU (mean over ranks) | stat | Red under {pct(FLEET.low_mfu_share)}," in dashboards
    bottleneck = runbook("StepscopeBottleneck")
    named = bottleneck.split("**Do**", 1)[0]
    for kind in FLEET.bottleneck_kinds:
        assert f"`{kind}`" in named and f"- `{kind}`:" in bottleneck, kind
    fires = runbook("StepscopeGpuXidDrain").split("Counted per code", 1)[0]
    assert codes(" ".join(re.findall(r"\*\*([\d/-]+)\*\*", fires))) == set(FLEET.drain_xids)
    diagnosis = (REPO / "docs" / "diagnosis.md").read_text()
    table = diagnosis.split("**Which XIDs are critical**", 1)[1].split("\nNot critical", 1)[0]
    first_cells = re.findall(r"^\| ([\d, -]+) \|", table, re.M)
    assert codes(" ".join(first_cells)) == set(FLEET.drain_xids)
