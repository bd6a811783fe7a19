"""The shipped Prometheus rules: valid, unit-tested alert by alert, and documented.

promtool's unit tests of both variants take ~20 s of CPU; their results do not depend on
when they run, so in a run that holds the scale-out tier's wait they are queued on the
background lane then (:func:`queue_early`, tests/support/background.py; this module then
runs after that wait) and the tests read what each printed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from generate import rules as hostname_rules
from stepscope.diagnose.faults import CRITICAL_XIDS
from tests.support import REPO, background, promtool
from tests.support.background import Lane

RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
TESTS_DIR = REPO / "deploy" / "prometheus" / "rules-tests"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_BASE = "https://github.com/stepscope/stepscope/blob/main/docs/runbooks.md#"
# the dead man's switch: always firing (stepscope-meta.yml)
WATCHDOG = "StepscopeWatchdog"
# level:metric:operations, https://prometheus.io/docs/practices/rules/
RECORD_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*:[A-Za-z_][A-Za-z0-9_]*:[a-z0-9_]+$")


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def rules() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def unit_tests() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(TESTS_DIR.glob("*_test.yml")):
        out.extend(yaml.safe_load(path.read_text())["tests"])
    return out


def test_promtool_check_rules_is_clean() -> None:
    result = subprocess.run([promtool(), "check", "rules", *map(str, rule_files())],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


HOSTNAME_RULES = REPO / "deploy" / "prometheus" / "rules-hostname"
HOSTNAME_TESTS = REPO / "deploy" / "prometheus" / "rules-tests-hostname"
# folder -> its promtool unit test files
UNIT_TEST_FILES = {TESTS_DIR: "*_test.yml", HOSTNAME_TESTS: "*.yml"}

Run = tuple[str, int, str]  # file name, exit status, output


def unit_test_files() -> list[tuple[Path, str]]:
    """(folder, file name) of every unit test file of both variants."""
    return [(folder, path.name) for folder, pattern in UNIT_TEST_FILES.items()
            for path in sorted(folder.glob(pattern))]  # fmt: skip


def _lane_name(folder: Path, name: str) -> str:
    return f"promtool test rules {folder.name}/{name}"


def queue_early(lane: Lane) -> None:
    """Queue every unit test file's promtool run on the background lane (none where
    promtool is missing: the tests then skip or fail as they do)."""
    tool = shutil.which("promtool")
    if tool is not None:
        for folder, name in unit_test_files():
            lane.add(_lane_name(folder, name), [tool, "test", "rules", name], folder)


@pytest.fixture(scope="module")
def unit_test_runs() -> dict[Path, list[Run]]:
    """`promtool test rules` of every unit test file of both variants, one process a
    file: read from the background lane where it ran them, else all started at once here
    (the longest file's time, stepscope-alerts_test.yml ~8 s, not the sum of both folders
    run file after file, ~21 s on 2 cores). Folder -> runs, in file order."""
    done = {key: background.result(_lane_name(*key)) for key in unit_test_files()}
    tool = promtool()
    procs: dict[tuple[Path, str], subprocess.Popen[str]] = {}
    try:
        for (folder, name), ran in done.items():
            if ran is None:
                procs[folder, name] = subprocess.Popen(
                    [tool, "test", "rules", name], cwd=folder, text=True,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        runs: dict[Path, list[Run]] = {folder: [] for folder in UNIT_TEST_FILES}
        for (folder, name), ran in done.items():
            if ran is None:
                proc = procs[folder, name]
                output, _ = proc.communicate(timeout=300)
                runs[folder].append((name, proc.returncode, output))
            else:
                runs[folder].append((name, ran.returncode, ran.output))
        return runs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_promtool_unit_tests_pass(unit_test_runs: dict[Path, list[Run]]) -> None:
    runs = unit_test_runs[TESTS_DIR]
    assert len(runs) == len(list(TESTS_DIR.glob("*_test.yml"))) > 0
    for name, status, output in runs:
        assert status == 0, f"{name}:\n{output}"
        assert output.count("SUCCESS") == 1, f"{name}:\n{output}"


def test_every_alert_is_proven_to_fire_and_to_stay_silent() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for test in unit_tests():
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - fires == set(), "alerts never shown to fire"
    # the dead man's switch is never silent: its test shows it firing with no series at all
    assert names - silent == {WATCHDOG}, "alerts never shown to stay silent"


def test_every_alert_has_severity_text_and_a_runbook_section() -> None:
    headings = {
        re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in RUNBOOKS.read_text().splitlines() if line.startswith("#")
    }
    for alert in alerts():
        name = alert["alert"]
        notes = alert["annotations"]
        assert set(notes) == {"summary", "description", "runbook_url"}, name
        if name == WATCHDOG:  # about no place and no value: `severity: none`, as
            # kube-prometheus' Watchdog, routed by its name to the heartbeat alone
            assert alert["labels"]["severity"] == "none"
        else:
            assert alert["labels"]["severity"] in {"critical", "warning", "info"}, name
            # the description names where it happened and what was measured
            names_where = r"\$labels\.(Hostname|instance|job|training_job|cluster)"
            assert re.search(names_where, notes["description"]), name
            assert "$value" in notes["description"] or "$labels" in notes["summary"], name
        url = notes["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), name
        assert url.removeprefix(RUNBOOK_BASE) == name.lower(), name
        assert name.lower() in headings, f"docs/runbooks.md has no section for {name}"


def test_recording_rules_follow_level_metric_operations() -> None:
    records = [r["record"] for r in rules() if "record" in r]
    assert records, "no recording rules"
    bad = [r for r in records if not RECORD_NAME.match(r)]
    assert bad == []
    assert len(records) == len(set(records))


def test_xid_alerts_split_the_drain_codes_from_the_rest() -> None:
    by_name = {a["alert"]: a for a in alerts()}
    drain = by_name["StepscopeGpuXidDrain"]
    assert drain["labels"]["severity"] == "critical"
    assert by_name["StepscopeGpuXid"]["labels"]["severity"] == "warning"
    codes = re.search(r'xid=~"([0-9|]+)"', drain["expr"])
    # NVIDIA's XID catalogue's reset/reboot codes, the set the diagnosis holds as gpu_fault
    assert codes and set(map(int, codes.group(1).split("|"))) == set(CRITICAL_XIDS)
    assert f'xid!~"{codes.group(1)}"' in by_name["StepscopeGpuXid"]["expr"]


def test_for_durations_fire_within_minutes_at_a_15_second_scrape() -> None:
    for alert in alerts():
        duration = alert.get("for", "0s")
        match = re.fullmatch(r"(\d+)([smh])", duration)
        assert match, (alert["alert"], duration)
        seconds = int(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]
        assert seconds <= 30 * 60, alert["alert"]


def test_the_hostname_variant_is_generated_from_the_canonical_rules() -> None:
    generated = hostname_rules.render()
    assert generated, "no canonical rules were read"
    for rel, text in generated.items():
        assert (REPO / rel).read_text() == text, f"{rel} is stale: run python -m generate"
    for path in [*HOSTNAME_RULES.glob("*.yml"), *HOSTNAME_TESTS.glob("*.yml")]:
        text = path.read_text()
        assert "GENERATED" in text.splitlines()[0]
        assert re.search(r"(?<![A-Za-z0-9_])Hostname(?![A-Za-z0-9])", text) is None, path.name


def test_the_hostname_variant_passes_its_promtool_checks_and_unit_tests(
    unit_test_runs: dict[Path, list[Run]],
) -> None:
    tool = promtool()
    check = subprocess.run([tool, "check", "rules", *map(str, HOSTNAME_RULES.glob("*.yml"))],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    runs = unit_test_runs[HOSTNAME_TESTS]
    assert len(runs) == len(list(HOSTNAME_TESTS.glob("*.yml"))) > 0
    for name, status, output in runs:
        assert status == 0, f"{name}:\n{output}"
