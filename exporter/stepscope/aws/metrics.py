"""``stepscope_node_info``: the EC2 placement of this node as one info series. Pure."""

from __future__ import annotations

from stepscope.aws.topology import NodeTopology
from stepscope.core.exposition import GAUGE, Family
from stepscope.core.labels import LabelSchema


def node_families(node: NodeTopology, labels: LabelSchema) -> list[Family]:
    """One ``stepscope_node_info`` sample for the node's topology."""
    family = Family(
        "stepscope_node_info",
        GAUGE,
        "EC2 placement of this node from IMDSv2 (read once at start); the value is always "
        "1. Join on Hostname to group GPUs by availability zone or placement group.",
    )
    family.add(
        labels.extend(
            labels.node(),
            (
                ("instance_id", node.instance_id),
                ("instance_type", node.instance_type),
                ("region", node.region),
                ("availability_zone", node.availability_zone),
                ("availability_zone_id", node.availability_zone_id),
                ("placement_group", node.placement_group),
                ("placement_partition", node.placement_partition),
            ),
        ),
        1.0,
    )
    return [family]
