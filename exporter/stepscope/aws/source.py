"""``NodeTopologySource``: the node's EC2 placement from IMDSv2, read once in the
background (a host off EC2 starts as fast as any other and simply has no node info)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence

from stepscope.aws.metrics import node_families
from stepscope.aws.topology import NodeTopology, read_node_topology
from stepscope.core.exposition import Family
from stepscope.core.labels import LabelSchema
from stepscope.core.source import PartKey, ReadContext, Source

log = logging.getLogger("stepscope.aws")

NODE_PART: PartKey[NodeTopology] = PartKey("node_topology")


class NodeTopologySource(Source[NodeTopology]):
    """Reads IMDSv2 once; the part is absent off EC2."""

    key = NODE_PART
    tier = math.inf
    background = True

    def read(self, ctx: ReadContext) -> NodeTopology | None:
        node = read_node_topology()
        if node is not None:
            log.info(
                "EC2 instance %s (%s) in %s%s",
                node.instance_id,
                node.instance_type,
                node.availability_zone,
                f", placement group {node.placement_group}" if node.placement_group else "",
            )
        return node

    def families(self, part: NodeTopology, labels: LabelSchema) -> Iterable[Family]:
        return node_families(part, labels)

    def evidence(self, part: NodeTopology) -> Sequence[str]:
        where = part.availability_zone_id or part.availability_zone
        group = f", placement group {part.placement_group}" if part.placement_group else ""
        return (f"EC2 {part.instance_type} {part.instance_id} in {where}{group}",)
