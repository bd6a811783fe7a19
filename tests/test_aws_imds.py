"""The node's EC2 placement from IMDSv2, against a local IMDSv2 endpoint started here
(token PUT, then GETs that demand the token), and the exporter serving it."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stepscope.aws.metrics import node_families
from stepscope.aws.topology import NodeTopology, read_node_topology
from stepscope.core.exposition import render
from stepscope.core.labels import LabelSchemaBuilder
from tests.support import parse_samples, start_exporter, wait_for

TOKEN = "AQAEAtoken=="
IDENTITY = {
    "instanceId": "i-0abc1234def567890",
    "instanceType": "p5.48xlarge",
    "region": "us-east-2",
    "availabilityZone": "us-east-2b",
    "accountId": "123456789012",
}


class FakeImds(ThreadingHTTPServer):
    """IMDSv2 as EC2 serves it: PUT /latest/api/token with a TTL header gives a token;
    every GET without that token is 401."""

    def __init__(self, placement: dict[str, str], v2: bool = True) -> None:
        self.placement = placement
        self.v2 = v2
        self.requests: list[tuple[str, str, bool]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.holding = 0
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


class _Handler(BaseHTTPRequestHandler):
    server: FakeImds

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        srv = self.server
        srv.requests.append(("PUT", self.path, False))
        if not srv.hold.is_set():
            srv.holding += 1
            srv.hold.wait(30)
            srv.holding -= 1
        if not srv.v2 or self.path != "/latest/api/token":
            return self._send(403)
        if not self.headers.get("x-aws-ec2-metadata-token-ttl-seconds"):
            return self._send(400)
        self._send(200, TOKEN)

    def do_GET(self) -> None:
        srv = self.server
        authed = self.headers.get("x-aws-ec2-metadata-token") == TOKEN
        srv.requests.append(("GET", self.path, authed))
        if not authed:
            return self._send(401)
        if self.path == "/latest/dynamic/instance-identity/document":
            return self._send(200, json.dumps(IDENTITY))
        prefix = "/latest/meta-data/placement/"
        name = self.path.removeprefix(prefix)
        if self.path.startswith(prefix) and name in srv.placement:
            return self._send(200, srv.placement[name])
        self._send(404, "Not Found")


def _serve(placement: dict[str, str], v2: bool = True) -> Iterator[FakeImds]:
    server = FakeImds(placement, v2)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.hold.set()
        server.shutdown()
        server.server_close()


FULL = {"availability-zone-id": "use2-az2", "group-name": "train-pg", "partition-number": "3"}


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    yield from _serve(FULL)


def _env(server: FakeImds) -> dict[str, str]:
    return {"AWS_EC2_METADATA_SERVICE_ENDPOINT": server.url}


def test_reads_instance_and_placement_with_an_imdsv2_token(imds: FakeImds) -> None:
    node = read_node_topology(env=_env(imds))
    assert node == NodeTopology(
        instance_id="i-0abc1234def567890",
        instance_type="p5.48xlarge",
        region="us-east-2",
        availability_zone="us-east-2b",
        availability_zone_id="use2-az2",
        placement_group="train-pg",
        placement_partition="3",
    )
    assert imds.requests[0] == ("PUT", "/latest/api/token", False)
    assert all(authed for method, _, authed in imds.requests if method == "GET")


def test_an_instance_outside_any_placement_group_has_empty_placement_labels() -> None:
    for server in _serve({"availability-zone-id": "use2-az2"}):
        node = read_node_topology(env=_env(server))
        assert node is not None
        assert (node.placement_group, node.placement_partition) == ("", "")
        assert node.availability_zone_id == "use2-az2"


def test_no_imdsv2_means_no_node_info_and_no_imdsv1_fallback() -> None:
    for server in _serve(FULL, v2=False):
        assert read_node_topology(env=_env(server)) is None
        assert [m for m, _, _ in server.requests] == ["PUT"], "never an unauthenticated GET"


def test_off_ec2_or_disabled_there_is_no_node_info(imds: FakeImds) -> None:
    # a closed port: connection refused at once
    closed = FakeImds({})
    port = closed.server_address[1]
    closed.server_close()
    assert (
        read_node_topology(env={"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{port}/"})
        is None
    )
    assert read_node_topology(env={**_env(imds), "AWS_EC2_METADATA_DISABLED": "true"}) is None
    assert imds.requests == []


def test_node_info_family_labels() -> None:
    node = NodeTopology("i-1", "p5.48xlarge", "us-east-2", "us-east-2b", "use2-az2", "pg", "3")
    text = render(node_families(node, LabelSchemaBuilder().build("node-a", ()))).decode()
    ((labels, value),) = parse_samples(text)["stepscope_node_info"]
    assert value == 1.0
    assert labels == {
        "Hostname": "node-a",
        "instance_id": "i-1",
        "instance_type": "p5.48xlarge",
        "region": "us-east-2",
        "availability_zone": "us-east-2b",
        "availability_zone_id": "use2-az2",
        "placement_group": "pg",
        "placement_partition": "3",
    }


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
