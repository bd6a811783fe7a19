"""`stepscope discover` against moto's EC2 server started on loopback by the test:
filters, every page, an empty result, AWS errors as one line and status 2, and the file
Prometheus reads (checked by promtool)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.aws.discover import instance_filters, target_groups
from tests.support import promtool
from tests.support.moto import CREDS, _client_creds, _moto


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    yield from _moto()


@pytest.fixture(scope="module")
def fleet(moto: str) -> dict[str, Any]:
    """7 tagged p5 nodes (one reservation each, so pages split them), 2 untagged p5,
    1 tagged g6 node, 1 tagged p5 node that is stopped."""
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto, **_client_creds())

    def run(n: int, itype: str, tagged: bool, az: str = "us-east-1a") -> list[str]:
        ids = []
        for _ in range(n):
            kwargs: dict[str, Any] = {}
            if tagged:
                tags = [{"Key": "stepscope", "Value": "true"}, {"Key": "Name", "Value": "gpu"}]
                kwargs["TagSpecifications"] = [{"ResourceType": "instance", "Tags": tags}]
            out = ec2.run_instances(
                ImageId="ami-12c6146b",
                MinCount=1,
                MaxCount=1,
                InstanceType=itype,
                Placement={"AvailabilityZone": az},
                **kwargs,
            )
            ids.append(out["Instances"][0]["InstanceId"])
        return ids

    tagged = run(4, "p5.48xlarge", True) + run(3, "p5.48xlarge", True, "us-east-1b")
    run(2, "p5.48xlarge", False)
    g6 = run(1, "g6.12xlarge", True)
    stopped = run(1, "p5.48xlarge", True)
    ec2.stop_instances(InstanceIds=stopped)
    return {"p5": sorted(tagged), "g6": g6, "stopped": stopped}


def discover(
    args: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base["AWS_EC2_METADATA_DISABLED"] = "true"  # no credential lookup through IMDS here
    return subprocess.run(
        [sys.executable, "-m", "stepscope", "discover", *args],
        capture_output=True,
        text=True,
        env={**base, **(env if env is not None else CREDS)},
        timeout=60,
    )


def test_discover_lists_running_tagged_instances_of_the_type_across_pages(
    moto: str, fleet: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "sd" / "stepscope.json"
    run = discover(
        [
            "--endpoint-url", moto,
            "--tag", "stepscope=true",
            "--instance-type", "p5.48xlarge",
            "--page-size", "5",
            "-o", str(out),
        ]
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    groups = json.loads(out.read_text())
    assert [g["labels"]["instance_id"] for g in groups] == fleet["p5"]
    first = groups[0]
    assert len(first["targets"]) == 1 and first["targets"][0].endswith(":9400")
    assert first["labels"]["instance_type"] == "p5.48xlarge"
    assert first["labels"]["instance_name"] == "gpu"
    zones = {g["labels"]["availability_zone"] for g in groups}
    assert zones == {"us-east-1a", "us-east-1b"}
    assert not list(out.parent.glob(".*")), "no temporary file left beside it"


def test_moto_really_paginates_what_discover_reads(moto: str, fleet: dict[str, Any]) -> None:
    import boto3

    ec2 = boto3.client("ec2", endpoint_url=moto, **_client_creds())
    pages = list(
        ec2.get_paginator("describe_instances").paginate(
            Filters=instance_filters(["stepscope=true"], ["p5.48xlarge"]),
            PaginationConfig={"PageSize": 5},
        )
    )
    assert len(pages) == 2


def test_empty_result_is_an_empty_target_list(moto: str, fleet: dict[str, Any]) -> None:
    run = discover(["--endpoint-url", moto, "--tag", "team=nobody", "--port", "9500"])
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []


def test_the_file_passes_promtool_as_file_sd(
    moto: str, fleet: dict[str, Any], tmp_path: Path
) -> None:
    sd = tmp_path / "stepscope.json"
    run = discover(["--endpoint-url", moto, "--tag", "stepscope", "-o", str(sd)])
    assert run.returncode == 0, run.stderr
    assert len(json.loads(sd.read_text())) == 8  # 7 p5 and the g6, not the stopped one
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "scrape_configs:\n- job_name: stepscope\n  honor_labels: true\n"
        f"  file_sd_configs:\n  - files: [{sd}]\n"
    )
    check = subprocess.run(
        [promtool(), "check", "config", str(cfg)], capture_output=True, text=True
    )
    assert check.returncode == 0 and "WARNING" not in check.stdout + check.stderr, check.stdout


def test_no_credentials_is_one_line_and_status_2(moto: str, tmp_path: Path) -> None:
    nothing = str(tmp_path / "none")
    run = discover(
        ["--endpoint-url", moto, "--region", "us-east-1"],
        env={"AWS_CONFIG_FILE": nothing, "AWS_SHARED_CREDENTIALS_FILE": nothing},
    )
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert run.stderr.startswith("stepscope: error: ") and "credentials" in run.stderr
    assert run.stdout == ""


def test_access_denied_is_one_line_and_status_2() -> None:
    # moto enforcing IAM: an unknown access key is refused as on AWS
    for url in _moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"}):
        run = discover(["--endpoint-url", url, "--tag", "stepscope"])
        assert run.returncode == 2
        assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
        assert run.stderr.startswith("stepscope: error: EC2 DescribeInstances failed: ")


def test_bad_tag_is_a_usage_error(moto: str) -> None:
    run = discover(["--endpoint-url", moto, "--tag", "=x"])
    assert run.returncode == 2 and "--tag '=x'" in run.stderr


def test_placement_group_and_partition_become_labels() -> None:
    # moto keeps no placement groups, so this mapping is checked on EC2's response shape
    reservation = {
        "Instances": [
            {
                "InstanceId": "i-2",
                "InstanceType": "p5.48xlarge",
                "PrivateIpAddress": "10.0.0.2",
                "Placement": {
                    "AvailabilityZone": "us-east-1a",
                    "GroupName": "pg",
                    "PartitionNumber": 2,
                },
            },
            {"InstanceId": "i-1", "InstanceType": "p5.48xlarge", "Placement": {}},  # no IP
            {"InstanceId": "i-3", "PrivateIpAddress": "fd00::3", "Placement": {}},
        ]
    }
    groups = target_groups([reservation], 9400)
    assert groups == [
        {
            "targets": ["10.0.0.2:9400"],
            "labels": {
                "instance_id": "i-2",
                "instance_type": "p5.48xlarge",
                "availability_zone": "us-east-1a",
                "placement_group": "pg",
                "placement_partition": "2",
            },
        },
        {
            "targets": ["[fd00::3]:9400"],
            "labels": {
                "instance_id": "i-3",
                "instance_type": "",
                "availability_zone": "",
                "placement_group": "",
            },
        },
    ]
