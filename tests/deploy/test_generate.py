"""`python -m generate`: every generated file of the repository from one command, and
`--check`, the command CI runs, naming each one that is out of date."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from generate import pipeline
from stepscope import __version__ as STEPSCOPE_VERSION
from stepscope.diagnose.fleet_rules import FleetRules
from tests.support import REPO


def generate(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "generate", *args],
        cwd=checkout, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_generator_check_is_the_command_ci_can_run() -> None:
    run = generate(REPO, "--check")
    assert run.returncode == 0, run.stderr


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of what the generators read and write, with the generators themselves."""
    shutil.copytree(REPO / "generate", tmp_path / "generate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for tree in pipeline.TREES:
        shutil.copytree(REPO / tree, tmp_path / tree, symlinks=True)
    for rel in pipeline.FILES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    return tmp_path


def test_check_names_an_edited_generated_file_and_a_run_repairs_it(checkout: Path) -> None:
    dashboard = checkout / "dashboards" / "json" / "stepscope-node.json"
    shipped = dashboard.read_bytes()
    dashboard.write_text(dashboard.read_text().replace('"title"', '"tittle"', 1))

    run = generate(checkout, "--check")
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "dashboards/json/stepscope-node.json: differs from what the generators make",
        "run: python -m generate",
    ]
    assert dashboard.read_bytes() != shipped, "--check writes nothing"

    run = generate(checkout)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["dashboards/json/stepscope-node.json: written"]
    assert dashboard.read_bytes() == shipped
    assert generate(checkout, "--check").returncode == 0
    assert generate(checkout).stdout == "", "a second run writes nothing"


def test_check_names_every_file_made_from_an_edited_source(checkout: Path) -> None:
    # a rule source: the rendered rule, its hostname and VictoriaMetrics variants, the
    # chart's copies of the first two, the PrometheusRule of the plain manifests, and the
    # fleet tier's vmalert ConfigMap and VMRule (the VictoriaMetrics variant) are made from it
    source = checkout / "deploy" / "prometheus" / "rules-src" / "stepscope-alerts.yml"
    source.write_text(source.read_text().replace("for: 5m", "for: 6m", 1))
    run = generate(checkout, "--check")
    assert run.returncode == 1
    differs = ": differs from what the generators make"
    assert run.stderr.splitlines() == [
        f"deploy/kubernetes/fleet.yaml{differs}",
        f"deploy/kubernetes/monitoring.yaml{differs}",
        f"deploy/kubernetes/victoriametrics-operator.yaml{differs}",
        f"deploy/prometheus/rules/stepscope-alerts.yml{differs}",
        f"deploy/prometheus/rules-hostname/stepscope-alerts.yml{differs}",
        f"deploy/prometheus/rules-victoriametrics/stepscope-alerts.yml{differs}",
        f"helm/stepscope/rules/stepscope-alerts.yml{differs}",
        f"helm/stepscope/rules-hostname/stepscope-alerts.yml{differs}",
        "run: python -m generate",
    ]


def test_a_threshold_edited_by_hand_in_the_rendered_rules_is_caught_and_restored(
    checkout: Path,
) -> None:
    # the rendered rules say the fleet module's numbers, never one of their own
    rule = checkout / "deploy" / "prometheus" / "rules" / "stepscope-alerts.yml"
    shipped = rule.read_text()
    ratio = FleetRules().rank_straggler_ratio
    assert f"training_job_rank:stepscope_straggler_score:ratio > {ratio}" in shipped
    edited = shipped.replace(f"straggler_score:ratio > {ratio}", "straggler_score:ratio > 1.5")
    rule.write_text(edited)
    run = generate(checkout, "--check")
    assert run.returncode == 1
    assert run.stderr.splitlines() == [
        "deploy/prometheus/rules/stepscope-alerts.yml: differs from what the generators make",
        "run: python -m generate",
    ]
    assert generate(checkout).returncode == 0
    assert rule.read_text() == shipped


def test_a_placeholder_the_fleet_module_lacks_is_one_line_naming_it(checkout: Path) -> None:
    source = checkout / "deploy" / "prometheus" / "rules-src" / "stepscope-alerts.yml"
    source.write_text(source.read_text().replace("<% rank_straggler_ratio %>",
                                                 "<% rank_straggler_factor %>", 1))
    run = generate(checkout, "--check")
    assert run.returncode == 1 and "Traceback" not in run.stderr
    (line,) = run.stderr.splitlines()
    assert line.startswith("python -m generate: stepscope-alerts.yml: unknown fleet "
                           "threshold <% rank_straggler_factor %>")  # fmt: skip


def test_check_names_a_missing_file_and_a_copy_left_behind(checkout: Path) -> None:
    (checkout / "deploy" / "kubernetes" / "monitoring.yaml").unlink()
    (checkout / "helm" / "stepscope" / "rules" / "stepscope-old.yml").write_text("groups: []\n")
    run = generate(checkout, "--check")
    assert run.returncode == 1
    assert "deploy/kubernetes/monitoring.yaml: missing" in run.stderr.splitlines()
    assert "helm/stepscope/rules/stepscope-old.yml: not generated" in run.stderr.splitlines()


@pytest.mark.parametrize(("module", "distribution"), pipeline.NEEDS)
def test_without_the_helm_engine_or_grafanas_sdk_the_command_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], module: str,
    distribution: str,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # not found, and import raises ImportError
    assert pipeline.main(["--check"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1
    assert f"not installed: {distribution}. pip install -e '.[test]'" in out.err


def _set_version(checkout: Path, version: str) -> None:
    init = checkout / "exporter" / "stepscope" / "__init__.py"
    text = init.read_text()
    init.write_text(text.replace(f'__version__ = "{STEPSCOPE_VERSION}"',
                                 f'__version__ = "{version}"'))


def test_a_version_bump_is_carried_to_the_chart_the_image_and_the_manifests(
    checkout: Path,
) -> None:
    _set_version(checkout, "0.2.0")
    run = generate(checkout, "--check")
    assert run.returncode == 1
    differs = ": differs from what the generators make"
    assert run.stderr.splitlines() == [
        f"Dockerfile{differs}",
        f"deploy/kubernetes/monitoring.yaml{differs}",
        f"deploy/kubernetes/stepscope.yaml{differs}",
        f"helm/stepscope/Chart.yaml{differs}",
        "run: python -m generate",
    ]
    assert generate(checkout).returncode == 0
    chart = (checkout / "helm" / "stepscope" / "Chart.yaml").read_text().splitlines()
    assert "version: 0.2.0" in chart and 'appVersion: "0.2.0"' in chart
    assert "ARG VERSION=0.2.0" in (checkout / "Dockerfile").read_text().splitlines()
    manifests = (checkout / "deploy" / "kubernetes" / "stepscope.yaml").read_text()
    assert "image: ghcr.io/stepscope/stepscope:0.2.0" in manifests
    assert f":{STEPSCOPE_VERSION}" not in manifests
    assert generate(checkout, "--check").returncode == 0


def test_a_version_the_chart_cannot_carry_is_refused_in_one_line(checkout: Path) -> None:
    _set_version(checkout, "0.2.0rc1")  # PEP 440, but Helm wants SemVer's 0.2.0-rc1
    for args in ((), ("--check",)):
        run = generate(checkout, *args)
        assert run.returncode == 1
        assert run.stderr == (
            "python -m generate: exporter/stepscope/__init__.py: __version__ = '0.2.0rc1' "
            "is not MAJOR.MINOR.PATCH (the chart's version must be SemVer and the image "
            "tag the same string)\n"
        )
