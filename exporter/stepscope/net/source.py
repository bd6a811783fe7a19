"""``RdmaSource``: the node's RDMA port counters (EFA, InfiniBand) from sysfs, each pass."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from stepscope.core.exposition import Family
from stepscope.core.labels import LabelSchema
from stepscope.core.source import ReadContext, Source
from stepscope.net.metrics import rdma_families
from stepscope.net.rdma import RDMA_PART, SYSFS_INFINIBAND, RdmaPort, read_rdma_ports


class RdmaSource(Source[tuple[RdmaPort, ...]]):
    """Every RDMA port under ``root`` (a node without RDMA has an empty part)."""

    key = RDMA_PART

    def __init__(self, root: Path = SYSFS_INFINIBAND) -> None:
        self._root = root

    def read(self, ctx: ReadContext) -> tuple[RdmaPort, ...]:
        return read_rdma_ports(self._root)

    def families(self, part: tuple[RdmaPort, ...], labels: LabelSchema) -> Iterable[Family]:
        return rdma_families(part)

    def evidence(self, part: tuple[RdmaPort, ...]) -> Sequence[str]:
        if not part:
            return ("no RDMA device (EFA, InfiniBand): traffic between nodes goes over TCP",)
        return (f"{len(part)} RDMA port(s): " + ", ".join(f"{p.device}/{p.port}" for p in part),)
