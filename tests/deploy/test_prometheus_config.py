"""Prometheus scrape configurations for EC2 and Kubernetes, checked by promtool, and the
EC2 one run by a real Prometheus against moto's EC2 server holding a ParallelCluster-shaped
fleet: which instances become targets, and with which labels."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import REPO, promtool, wait_for
from tests.support.moto import CREDS, _client_creds, _moto
from tests.support.ports import free_port
from tests.support.tools import prometheus_binary

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


def _ec2_job(cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    cfg = cfg or _load("prometheus-ec2.yml")
    job: dict[str, Any] = next(j for j in cfg["scrape_configs"] if j["job_name"] == "stepscope")
    return job


def test_ec2_config_finds_running_nodes_by_tag_on_port_9400() -> None:
    job = _ec2_job()
    assert job["honor_labels"] is False, "Prometheus' job/instance win; ours is training_job"
    (sd,) = job["ec2_sd_configs"]
    assert sd["port"] == 9400
    filters = {f["name"]: f["values"] for f in sd["filters"]}
    assert filters["instance-state-name"] == ["running"]
    assert any(name.startswith("tag:") for name in filters)
    relabel = job["relabel_configs"]
    assert {
        "source_labels": ["__meta_ec2_instance_state"],
        "regex": "running",
        "action": "keep",
    } in relabel
    targets = {r.get("target_label") for r in relabel}
    assert {"instance_id", "instance_type", "availability_zone", "__address__"} <= targets


def _uncommented_remote_write(text: str) -> str:
    """The commented-out remote_write block, uncommented as a user would."""
    lines = text.splitlines()
    start = lines.index("# remote_write:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        block.append(line[2:])
    return "\n".join(block) + "\n"


def test_remote_write_ships_commented_out() -> None:
    # an active remote_write to a placeholder workspace fails every send, forever
    assert "remote_write" not in _load("prometheus-ec2.yml")


def test_the_remote_write_example_uncommented_is_valid_config(tmp_path: Path) -> None:
    text = (PROM / "prometheus-ec2.yml").read_text()
    block = yaml.safe_load(_uncommented_remote_write(text))
    (amp,) = block["remote_write"]
    assert "aps-workspaces" in amp["url"] and amp["sigv4"]["region"]
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(text + _uncommented_remote_write(text))
    run = check_config(cfg)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr


def test_kubernetes_config_passes_promtool(tmp_path: Path) -> None:
    path = PROM / "prometheus-kubernetes.yml"
    run = check_config(path)
    if "field kubernetes_sd_configs not found" not in run.stdout + run.stderr:
        assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
        return
    # Debian's promtool is built without Kubernetes discovery: check everything else
    # (relabelling, globals, rule files) with promtool and the discovery block by hand.
    cfg = yaml.safe_load(path.read_text())
    (job,) = [j for j in cfg["scrape_configs"] if "kubernetes_sd_configs" in j]
    (sd,) = job.pop("kubernetes_sd_configs")
    assert sd["role"] == "pod" and sd["selectors"][0]["role"] == "pod"
    assert sd["selectors"][0]["label"] == "app.kubernetes.io/name=stepscope"
    job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    stripped = tmp_path / "prometheus-kubernetes.yml"
    stripped.write_text(yaml.safe_dump(cfg))
    run = check_config(stripped)
    assert run.returncode == 0 and "SUCCESS" in run.stdout, run.stdout + run.stderr
    assert job["honor_labels"] is False


# ---- the EC2 job run by Prometheus against moto's EC2


PCLUSTER_TAGS = {
    "stepscope": "true",
    "Name": "Compute",  # ParallelCluster's Name tag on every compute instance
    "parallelcluster:cluster-name": "train",
    "parallelcluster:node-type": "Compute",
}


@pytest.fixture(scope="module")
def moto_ec2() -> Iterator[str]:
    yield from _moto()


def _launch(ec2: Any, made: dict[str, dict[str, str]], itype: str, tags: dict[str, str],
            what: str) -> str:
    out = ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType=itype,
        TagSpecifications=[{
            "ResourceType": "instance",
            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        }],
    )
    instance = out["Instances"][0]
    made[instance["InstanceId"]] = {
        "what": what, "type": itype, "dns": instance["PrivateDnsName"],
        "ip": instance["PrivateIpAddress"],
    }
    return str(instance["InstanceId"])


@pytest.fixture(scope="module")
def fleet(moto_ec2: str) -> tuple[str, dict[str, dict[str, str]]]:
    """A ParallelCluster cluster's instances in moto: instance id -> what it is."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto_ec2, **_client_creds())
    made: dict[str, dict[str, str]] = {}
    for itype, queue, resource, what in (
        ("p5.48xlarge", "gpu", "p5", "gpu"),
        ("p5.48xlarge", "gpu", "p5", "gpu"),
        ("p6-b200.48xlarge", "gpu", "b200", "gpu"),
        ("g6e.12xlarge", "inference", "g6e", "gpu"),
        ("trn1.32xlarge", "trainium", "trn1", "no NVIDIA GPU"),
        ("g4ad.16xlarge", "amd", "g4ad", "no NVIDIA GPU"),
        ("p5.48xlarge", "gpu", "p5", "stopped"),
    ):
        tags = {**PCLUSTER_TAGS, "parallelcluster:queue-name": queue,
                "parallelcluster:compute-resource-name": resource}
        instance_id = _launch(ec2, made, itype, tags, what)
        if what == "stopped":
            ec2.stop_instances(InstanceIds=[instance_id])
    head_tags = {**PCLUSTER_TAGS, "Name": "HeadNode", "parallelcluster:node-type": "HeadNode"}
    _launch(ec2, made, "c5.2xlarge", head_tags, "head node")
    _launch(ec2, made, "p5.48xlarge", {"Name": "someone-else"}, "not tagged for stepscope")
    return moto_ec2, made


def _targets(prom_url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(prom_url + "/api/v1/targets", timeout=5) as resp:
        data = json.load(resp)["data"]
    active: list[dict[str, Any]] = data["activeTargets"]
    return active


def test_prometheus_scrapes_exactly_the_nvidia_gpu_nodes_labelled_by_cluster_queue_and_dns(
    fleet: tuple[str, dict[str, dict[str, str]]], tmp_path: Path
) -> None:
    moto_url, made = fleet
    cfg = _load("prometheus-ec2.yml")
    cfg.pop("rule_files")
    cfg["scrape_configs"] = [_ec2_job(cfg)]
    (sd,) = cfg["scrape_configs"][0]["ec2_sd_configs"]
    # the shipped discovery, pointed at moto with its credentials; nothing else changed
    sd.update(endpoint=moto_url, access_key=CREDS["AWS_ACCESS_KEY_ID"],
              secret_key=CREDS["AWS_SECRET_ACCESS_KEY"], refresh_interval="1s")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    check = check_config(path)
    assert check.returncode == 0, check.stdout + check.stderr
    prom_url = f"http://127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [prometheus_binary(), f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address={prom_url.removeprefix('http://')}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        gpu_nodes = {i: m for i, m in made.items() if m["what"] == "gpu"}

        def discovered() -> list[dict[str, Any]] | None:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                targets = _targets(prom_url)
            except OSError:
                return None
            return targets if len(targets) >= len(gpu_nodes) else None

        targets = wait_for(discovered, timeout=60, interval=0.5)
        by_id = {t["labels"]["instance_id"]: t for t in targets}
        assert set(by_id) == set(gpu_nodes), {
            made[i]["what"] for i in set(by_id) - set(gpu_nodes)
        }
        for instance_id, target in by_id.items():
            node, labels = made[instance_id], target["labels"]
            assert labels["instance"] == node["dns"], "unique per node, not the Name tag"
            assert re.fullmatch(r"ip-[0-9-]+\..+", labels["instance"])
            assert labels["instance_name"] == "Compute"
            assert labels["cluster"] == "train"
            assert labels["instance_type"] == node["type"]
            assert target["scrapeUrl"] == f"http://{node['ip']}:9400/metrics"
        queues = {(t["labels"]["queue"], t["labels"]["compute_resource"]) for t in targets}
        assert queues == {("gpu", "p5"), ("gpu", "b200"), ("inference", "g6e")}
        assert len({t["labels"]["instance"] for t in targets}) == len(targets)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()
