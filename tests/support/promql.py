"""The metric names a PromQL expression reads, and those the shipped rules, dashboards and
`stepscope diagnose --prometheus` read: what a remote-write keep list must let through.

No PromQL parser is at hand in Python, so this is a tokenizer that removes what is not a
selector's name (strings, label matchers, ranges, grouping clauses, functions, keywords,
Grafana variables); the test that uses it checks its answer against what an exporter
serves, so a name it missed or invented shows up there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

RULES = REPO / "deploy" / "prometheus" / "rules"
DASHBOARDS = REPO / "dashboards" / "json"
FLEET_CLI = REPO / "exporter" / "stepscope" / "diagnose" / "cli.py"
# series a ruler makes itself: never scraped, never remote-written by an agent
RULER_SERIES = frozenset({"ALERTS", "ALERTS_FOR_STATE"})
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
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    for m in re.finditer(r"(?<![\w:.])([A-Za-z_:][\w:]*)(\s*\()?", e):
        if m.group(2) is None and m.group(1) not in _KEYWORDS:
            found.add(m.group(1))
    return found


def _rules(rules_dir: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(rules_dir.glob("*.yml")):
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


def recorded_names(rules_dir: Path = RULES) -> set[str]:
    """The series the recording rules make."""
    return {rule["record"] for rule in _rules(rules_dir) if "record" in rule}


def names_read(exprs: Iterable[str], recorded: set[str]) -> set[str]:
    """Scraped names the expressions read: neither recorded nor made by the ruler."""
    names: set[str] = set()
    for expr in exprs:
        names |= expression_names(expr)
    return names - recorded - RULER_SERIES


def rule_exprs(rules_dir: Path = RULES) -> list[str]:
    """Every rule's expression."""
    return [rule["expr"] for rule in _rules(rules_dir)]


def dashboard_exprs(dashboards_dir: Path = DASHBOARDS) -> list[str]:
    """Every panel's and template variable's query of the shipped dashboards."""
    return [q for path in sorted(dashboards_dir.glob("*.json"))
            for q in _dashboard_queries(json.loads(path.read_text()))]  # fmt: skip


def fleet_cli_names(path: Path = FLEET_CLI) -> set[str]:
    """Scraped names `stepscope diagnose --prometheus` queries (its string constants)."""
    return set(re.findall(r"(?<![\w:])((?:stepscope|DCGM_FI)_\w+)(?![\w:])", path.read_text()))
