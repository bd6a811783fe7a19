"""The node's EC2 placement needs no AWS SDK: IMDSv2 over the standard library, against
the local IMDSv2 endpoint of test_aws_imds (token PUT, GETs that demand the token)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import parse_samples, start_exporter, wait_for
from tests.test_aws_imds import FULL, FakeImds, _env, _serve


@pytest.fixture
def imds_full() -> Iterator[FakeImds]:
    yield from _serve(FULL)


def _no_botocore(tmp_path: Path) -> dict[str, str]:
    """PYTHONPATH with a botocore and a boto3 that cannot be imported, as in the image."""
    for name in ("botocore", "boto3"):
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"raise ImportError('no {name} here')\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_the_exporter_serves_node_info_without_boto3_or_botocore(
    imds_full: FakeImds, tmp_path: Path
) -> None:
    exp = start_exporter(
        ["--simulate", "1", "--hostname", "node-a", "--ingest", f"unix://{tmp_path}/i.sock"],
        env={**_no_botocore(tmp_path), **_env(imds_full)},
    )
    try:
        ((labels, _),) = wait_for(lambda: parse_samples(exp.metrics()).get("stepscope_node_info"))
        assert labels["instance_id"] == "i-0abc1234def567890"
        assert labels["placement_group"] == "train-pg"
    finally:
        assert exp.stop() == 0
    assert imds_full.requests[0] == ("PUT", "/latest/api/token", False)


def test_reading_node_info_imports_no_aws_sdk_and_ignores_http_proxies(
    imds_full: FakeImds,
) -> None:
    # A proxy would answer with its own instance's metadata (or not at all): IMDS is
    # always asked directly. The proxy here is a closed port, so using it would fail.
    code = (
        "import sys\n"
        "from stepscope.aws.topology import read_node_topology\n"
        "node = read_node_topology()\n"
        "assert node is not None and node.placement_partition == '3', node\n"
        "assert not {'boto3', 'botocore'} & set(sys.modules), 'an AWS SDK was imported'\n"
    )
    env = {
        **os.environ,
        **_env(imds_full),
        "HTTP_PROXY": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "NO_PROXY": "",
        "no_proxy": "",
    }
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
