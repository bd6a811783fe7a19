"""The node's EC2 placement from IMDSv2, against a local IMDSv2 endpoint started here
(token PUT, then GETs that demand the token), and the exporter serving it."""

from __future__ import annotations

from stepscope.aws.metrics import node_families
from stepscope.aws.topology import NodeTopology, read_node_topology
from stepscope.core.exposition import render
from stepscope.core.labels import LabelSchemaBuilder
from tests.support import parse_samples
from tests.support.imds import FULL, FakeImds, _env, _serve


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
