"""stepscope diagnose against a running exporter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stepscope.app.cli import main
from tests.support import wait_for


def test_diagnose_reads_the_local_exporter_and_exits_by_what_it_found(
    exporter_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _write_config(
        tmp_path, {"gpus": 2, "timeline": [{"gpus": [1], "thermal": "sw"}]}
    )
    exp = exporter_factory(["--config", str(cfg)])

    def diagnosed() -> Any:
        _, _, body = exp.get("/api/v1/diagnosis")
        doc = json.loads(body)
        return doc if doc.get("window_seconds", 0) >= 1 else None

    doc = wait_for(diagnosed)
    assert doc["status"] == "bottleneck" and doc["thresholds"]["window"] == 2
    kinds = {v["subject"]["gpu"]: (v["kind"], v["modifiers"]) for v in doc["verdicts"]}
    assert kinds == {0: ("compute", []), 1: ("compute", ["thermal_throttle"])}
    assert main(["diagnose", "--exporter", exp.url]) == 1
    out = capsys.readouterr().out
    assert "compute+thermal_throttle" in out and "gpu 1: compute: Clocks lowered" in out
    assert main(["diagnose", "--exporter", exp.url, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["status"] == "bottleneck"
    assert "stepscope_bottleneck{" in exp.metrics()
    exp.stop()
    assert main(["diagnose", "--exporter", exp.url, "--timeout", "2"]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_diagnose_exits_0_on_a_healthy_node(
    exporter_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = exporter_factory(["--config", str(_write_config(tmp_path, {"gpus": 2}))])
    wait_for(lambda: json.loads(exp.get("/api/v1/diagnosis")[2])["samples"] >= 3)
    assert main(["diagnose", "--exporter", exp.url]) == 0
    assert "healthy" in capsys.readouterr().out


def _write_config(tmp_path: Path, scenario: dict[str, Any]) -> Path:
    (tmp_path / "scenario.yaml").write_text(json.dumps(scenario))
    cfg = tmp_path / "stepscope.yaml"
    cfg.write_text(
        f"interval: 0.2\nslow_interval: 1\nscenario: {tmp_path / 'scenario.yaml'}\n"
        f"ingest: unix://{tmp_path / 'ingest.sock'}\ndiagnosis: {{window: 2}}\n"
    )
    return cfg
