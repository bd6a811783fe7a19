"""The node's EC2 placement needs no AWS SDK: IMDSv2 over the standard library, against
the local IMDSv2 endpoint of test_aws_imds (token PUT, GETs that demand the token)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.imds import FakeImds, _env


def test_reading_node_info_imports_no_aws_sdk_and_ignores_http_proxies(
    imds: FakeImds,
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
        **_env(imds),
        "HTTP_PROXY": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "NO_PROXY": "",
        "no_proxy": "",
    }
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
