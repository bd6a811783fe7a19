"""The docs checked against the code, so they cannot drift (issue 27: pages said
`honor_labels: true` for a `job` label the exporter no longer served, listed dashboard
variables the dashboards did not have, and told users to set a key in a file the unit
never read). Every flag, setting and variable a doc names exists, every setting is in
the README's table, every label docs/metrics.md names is one a busy node serves, and
docs/dashboards.md names the dashboards' variables."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re

import yaml

from stepscope.app.cli import _parser
from stepscope.app.config import SETTINGS
from stepscope.diagnose.thresholds import Thresholds
from stepscope.web import config as web_config
from tests.support import REPO, parse_samples
from tests.support.node_shape import busy_node

README = REPO / "README.md"
# the pages a user reads to run stepscope (benchmarks, scaling and validation pages name
# the flags of their own scripts)
USER_DOCS = [
    README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "deploy").glob("*.md"))
]
ALL_DOCS = [README, *sorted((REPO / "docs").rglob("*.md"))]
SCRIPT_DOCS = {"benchmarks.md", "scaling.md", "diagnosis.md", "sdk.md"}  # their scripts' flags
# Other tools' flags the user docs name, and the tool.
OTHER_TOOLS = {
    "--api-versions": "helm", "--set": "helm", "--server-side": "kubectl",
    "--strict": "kubernetes-validate", "--build-arg": "docker/buildah",
    "--no-healthcheck": "docker run", "--now": "systemctl enable", "--without-pip": "venv",
    "--check": "python -m generate", "--package": "python -m generate",
    "--pid": "py-spy dump", "--format": "buildah bud",
    "--enable-feature": "prometheus",
    "--cpu-bind": "srun (Slurm)",
    "--cluster": "alertmanager (--cluster.peer, ...)", "--create-namespace": "helm",
}


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


def _script_options() -> set[str]:
    found: set[str] = set()
    for script in (REPO / "deploy" / "parallelcluster").glob("*.sh"):
        found.update(re.findall(r"(--[a-z][a-z0-9-]*)\)", script.read_text()))
        found.update(re.findall(r'"\$\{1:-\}" = (--[a-z][a-z0-9-]*)', script.read_text()))
    return found


def _readme_table() -> list[str]:
    text = README.read_text()
    start = text.index("| Flag / key |")
    return [ln for ln in text[start:].split("\n\n", 1)[0].splitlines()[2:]]


def test_every_serve_flag_and_setting_is_in_the_readme_table_and_the_table_names_no_other() -> None:
    serve = _options(_commands()["serve"]) - {"--help"}
    flags: set[str] = set()
    keys: set[str] = set()
    for row in _readme_table():
        cell = row.split("|")[1]
        flags.update(re.findall(r"`(--[a-z0-9-]+)", cell))
        keys.update(re.findall(r"/ `([a-z_]+)`", cell))
        keys.update(re.findall(r"^\s*`([a-z_]+)` \(file", cell))
    assert flags == serve
    assert keys == set(SETTINGS)


def test_every_stepscope_command_line_in_the_docs_uses_options_it_has() -> None:
    commands = _commands()
    wrong = []
    for doc in ALL_DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in re.finditer(r"stepscope (serve|diagnose|nccl-check|discover)\b([^`\n|#]*)",
                                 line):
                for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2)):
                    if option not in _options(commands[m.group(1)]):
                        wrong.append(f"{doc.relative_to(REPO)}:{n}: stepscope {m.group(1)} "
                                     f"has no {option}")
    assert wrong == []


def test_every_option_the_user_docs_name_exists() -> None:
    known = set().union(*(_options(p) for p in _commands().values()), _script_options())
    wrong = []
    for doc in USER_DOCS:
        if doc.name in SCRIPT_DOCS:
            continue
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                for option in re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)", span):
                    if option not in known and option not in OTHER_TOOLS:
                        wrong.append(f"{doc.relative_to(REPO)}:{n}: {option}")
    assert wrong == []


def test_every_stepscope_variable_the_docs_name_is_read_by_the_code() -> None:
    code = "\n".join(p.read_text() for p in (REPO / "exporter" / "stepscope").rglob("*.py"))
    in_code = set(re.findall(r"STEPSCOPE_[A-Z0-9_]+", code))
    settings = {"STEPSCOPE_" + key.upper() for key in SETTINGS}
    named = {(doc.relative_to(REPO), v) for doc in ALL_DOCS
             for v in re.findall(r"STEPSCOPE_[A-Z0-9_]*[A-Z0-9]", doc.read_text())}
    assert [f"{d}: {v}" for d, v in sorted(named) if v not in in_code | settings] == []


def test_keys_named_beside_a_config_file_are_settings() -> None:
    """`host_label` in `/etc/stepscope/config.yaml`, `slow_interval: 30`: a key a page
    names where it speaks of a config file is one the exporter reads (a setting, a
    diagnosis threshold, or a web config key), or Prometheus' own."""
    known = {
        *SETTINGS, *(f.name for f in dataclasses.fields(Thresholds)),
        *web_config._TOP_KEYS, *web_config._TLS_KEYS, *web_config._HTTP_KEYS,
        *web_config._RATE_KEYS, "honor_labels",
    }
    wrong = []
    for doc in USER_DOCS:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if not re.search(r"config\.yaml|config file|`--config`", line):
                continue
            for span in re.findall(r"`([^`]+)`", line):
                m = re.match(r"([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?::|$)", span)
                if m and m.group(1) not in known:
                    wrong.append(f"{doc.relative_to(REPO)}:{n}: {m.group(1)}")
    assert wrong == []


def test_config_files_the_docs_show_hold_only_settings() -> None:
    """A YAML block that is a config file (a top-level key is a setting) or the Helm
    chart's `config:` value holds settings only, and its `diagnosis:` thresholds only."""
    thresholds = {f.name for f in dataclasses.fields(Thresholds)}
    wrong = []
    shown = 0
    for doc in USER_DOCS:
        for block in re.findall(r"```ya?ml\n(.*?)```", doc.read_text(), re.S):
            try:
                data = yaml.safe_load(block)
            except yaml.YAMLError:
                continue  # a fragment (templating, ellipses)
            if not isinstance(data, dict):
                continue
            configs = [data] if set(map(str, data)) & set(SETTINGS) else []
            if isinstance(data.get("config"), dict) and data["config"]:
                configs.append(data["config"])
            for config in configs:
                shown += 1
                wrong += [f"{doc.relative_to(REPO)}: {k}" for k in config if k not in SETTINGS]
                diagnosis = config.get("diagnosis")
                if isinstance(diagnosis, dict):
                    wrong += [f"{doc.relative_to(REPO)}: diagnosis.{k}" for k in diagnosis
                              if k not in thresholds]
    assert wrong == []
    assert shown >= 2


def test_docs_dashboards_md_names_the_variables_the_dashboards_have() -> None:
    doc = (REPO / "docs" / "dashboards.md").read_text()
    paragraph = doc[doc.index("Every dashboard has the variables"):].split("\n\n", 1)[0]
    documented = re.findall(r"\*\*`([A-Za-z_]+)`\*\*", paragraph)
    for path in sorted((REPO / "dashboards" / "json").glob("*.json")):
        variables = [v["name"] for v in json.loads(path.read_text())["templating"]["list"]]
        assert variables == documented, path.name
    for path in sorted((REPO / "dashboards" / "json-hostname").glob("*.json")):
        variables = [v["name"] for v in json.loads(path.read_text())["templating"]["list"]]
        assert variables == [("hostname" if v == "Hostname" else v) for v in documented]
    assert "`hostname`" in paragraph  # the variants' name for it is said too
    for name in documented:
        if name != "datasource":
            assert f"`${name}`" in doc, f"the panel-query test's substitution of ${name}"


# ---- labels: docs/metrics.md against what a busy node serves

METRICS_DOC = REPO / "docs" / "metrics.md"
# Labels the contract table lists that a busy node does not serve, and why.
NEEDS_A_SETTING = {
    "hpc_job": "--hpc-job-dir",
    "pod": "--kubernetes-pod-resources",
    "namespace": "--kubernetes-pod-resources",
    "container": "--kubernetes-pod-resources",
    "hostname": "--host-label hostname (Hostname by default)",
    "group": "StepReporter(group=...) or STEPSCOPE_GROUP (none: the job is one group)",
}
SET_BY_PROMETHEUS = {"cluster", "job", "instance"}


def _label_contract() -> list[str]:
    text = METRICS_DOC.read_text()
    table = text[text.index("| Label | On |"):].split("\n\n", 1)[0].splitlines()[2:]
    names: list[str] = []
    for row in table:
        names += re.findall(r"`([A-Za-z_]+)`", row.split("|")[1])
    return names


def _family_tables() -> dict[str, list[str]]:
    """Family -> the label names its row's Labels column lists (values in parentheses
    and references to other label sets left out)."""
    out: dict[str, list[str]] = {}
    labels_table = False
    lines = METRICS_DOC.read_text().splitlines()
    for row, below in zip(lines, [*lines[1:], ""], strict=True):
        cells = row.split("|")
        if below.startswith("| ---"):  # a table's header: is its third column the labels?
            labels_table = len(cells) > 3 and cells[3].strip().startswith("Labels")
            continue
        if not labels_table or len(cells) < 5 or not re.fullmatch(r" `[A-Za-z_:]+` ", cells[1]):
            continue
        labels = re.sub(r"\([^)]*\)", "", cells[3])
        out.setdefault(cells[1].strip(" `"), []).extend([
            name for name in re.findall(r"`([A-Za-z_]+)`", labels) if name != "DCGM_FI_"
        ])
    return out


def test_every_label_docs_metrics_md_names_is_one_a_busy_node_serves() -> None:
    with busy_node() as exp:
        text = exp.metrics()
    samples = parse_samples(text)
    served = {name for series in samples.values() for labels, _ in series for name in labels}
    contract = _label_contract()
    assert set(contract) - served - set(NEEDS_A_SETTING) - SET_BY_PROMETHEUS == set()
    assert served & SET_BY_PROMETHEUS == set(), "stepscope never serves job or instance"
    # every label the contract lists, no label it does not (but a family's own)
    family_labels = {n for names in _family_tables().values() for n in names}
    assert served - set(contract) - family_labels - {"le", "quantile"} == set()

    wrong = []
    checked = 0
    for family, names in _family_tables().items():
        series = [lbl for name, s in samples.items() if name == family
                  or name in (f"{family}_bucket", f"{family}_sum", f"{family}_count")
                  for lbl, _ in s]
        if not series:
            continue  # not served on this node shape (XIDs, EFA, ...)
        carried = {name for labels in series for name in labels}
        wrong += [f"{family}: {name}" for name in names if name not in carried]
        checked += bool(names)
    assert wrong == []
    assert checked >= 12  # the families with labels of their own a busy node serves
