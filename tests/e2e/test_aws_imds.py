"""A running exporter's EC2 node info, from a fake IMDSv2."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tests.support import parse_samples, start_exporter, wait_for
from tests.support.imds import FakeImds, _env, _no_botocore


def test_exporter_serves_node_info_and_starts_before_imds_answers(imds: FakeImds) -> None:
    imds.hold.clear()  # the token PUT hangs until released
    exp = start_exporter(
        ["--simulate", "1", "--hostname", "node-a",
         "--ingest", f"unix://{tempfile.mkdtemp()}/i.sock"],
        env={**_env(imds), "AWS_METADATA_SERVICE_TIMEOUT": "30"},
    )
    try:
        # serving while IMDS has not answered: the read never delays the start
        wait_for(lambda: imds.holding == 1)
        assert "stepscope_node_info" not in exp.metrics()
        imds.hold.set()
        samples = wait_for(lambda: parse_samples(exp.metrics()).get("stepscope_node_info"))
        ((labels, _),) = samples
        assert labels["Hostname"] == "node-a"
        assert labels["placement_group"] == "train-pg"
        assert labels["availability_zone_id"] == "use2-az2"
    finally:
        assert exp.stop() == 0


def test_exporter_serves_without_botocore(tmp_path: Path) -> None:
    # a botocore that cannot be imported, as on an image without boto3
    fake = tmp_path / "botocore"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no botocore here')\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    exp = start_exporter(
        ["--simulate", "1", "--ingest", f"unix://{tempfile.mkdtemp()}/i.sock"],
        env={"PYTHONPATH": path, "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:9/"},
    )
    try:
        samples = parse_samples(exp.metrics())
        assert len(samples["stepscope_gpu_up"]) == 1
        assert "stepscope_node_info" not in samples
    finally:
        assert exp.stop() == 0


def test_the_exporter_serves_node_info_without_boto3_or_botocore(
    imds: FakeImds, tmp_path: Path
) -> None:
    exp = start_exporter(
        ["--simulate", "1", "--hostname", "node-a", "--ingest", f"unix://{tmp_path}/i.sock"],
        env={**_no_botocore(tmp_path), **_env(imds)},
    )
    try:
        ((labels, _),) = wait_for(lambda: parse_samples(exp.metrics()).get("stepscope_node_info"))
        assert labels["instance_id"] == "i-0abc1234def567890"
        assert labels["placement_group"] == "train-pg"
    finally:
        assert exp.stop() == 0
    assert imds.requests[0] == ("PUT", "/latest/api/token", False)
