"""Prometheus scrape configurations for EC2 and Kubernetes, checked by promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from conftest import REPO, promtool

PROM = REPO / "deploy" / "prometheus"


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), "check", "config", str(path)], capture_output=True, text=True
    )


def _load(name: str) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load((PROM / name).read_text())
    return cfg


def test_ec2_config_passes_promtool() -> None:
    run = check_config(PROM / "prometheus-ec2.yml")
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_ec2_config_finds_running_gpu_nodes_by_tag_and_type_on_port_9400() -> None:
    job = next(
        j for j in _load("prometheus-ec2.yml")["scrape_configs"] if j["job_name"] == "stepscope"
    )
    assert job["honor_labels"] is False, "Prometheus' job/instance win; ours is training_job"
    (sd,) = job["ec2_sd_configs"]
    assert sd["port"] == 9400
    filters = {f["name"]: f["values"] for f in sd["filters"]}
    assert filters["instance-state-name"] == ["running"]
    assert "p5.48xlarge" in filters["instance-type"]
    assert any(name.startswith("tag:") for name in filters)
    relabel = job["relabel_configs"]
    assert {
        "source_labels": ["__meta_ec2_instance_state"],
        "regex": "running",
        "action": "keep",
    } in relabel
    targets = {r.get("target_label") for r in relabel}
    assert {"instance_id", "instance_type", "availability_zone", "__address__"} <= targets


def test_remote_write_examples_for_amp_with_sigv4() -> None:
    (amp,) = _load("prometheus-ec2.yml")["remote_write"]
    assert "aps-workspaces" in amp["url"] and amp["sigv4"]["region"]


def test_kubernetes_config_passes_promtool(tmp_path: Path) -> None:
    path = PROM / "prometheus-kubernetes.yml"
    run = check_config(path)
    if "field kubernetes_sd_configs not found" not in run.stdout + run.stderr:
        assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
        return
    # Debian's promtool is built without Kubernetes discovery: check everything else
    # (relabelling, globals, rule files) with promtool and the discovery block by hand.
    cfg = yaml.safe_load(path.read_text())
    (job,) = cfg["scrape_configs"]
    (sd,) = job.pop("kubernetes_sd_configs")
    assert sd["role"] == "pod" and sd["selectors"][0]["role"] == "pod"
    assert sd["selectors"][0]["label"] == "app.kubernetes.io/name=stepscope"
    job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    stripped = tmp_path / "prometheus-kubernetes.yml"
    stripped.write_text(yaml.safe_dump(cfg))
    run = check_config(stripped)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    assert job["honor_labels"] is False
