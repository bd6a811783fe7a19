"""RDMA port counters as ``stepscope_rdma_*`` families, labels ``device`` and ``port``."""

from __future__ import annotations

from stepscope.core.exposition import COUNTER, GAUGE, Family, label_string
from stepscope.net.rdma import RDMA_COUNTERS, RdmaPort

_READ = " Read from sysfs by the exporter every interval, not at scrape time."


def rdma_families(ports: tuple[RdmaPort, ...]) -> list[Family]:
    """One family per counter of :data:`RDMA_COUNTERS` that some port has."""
    if not ports:
        return []
    labels = [label_string((("device", p.device), ("port", p.port))) for p in ports]
    fams: list[Family] = []
    for spec in RDMA_COUNTERS:
        fam = Family(spec.name, COUNTER, spec.help + _READ)
        for p, lbl in zip(ports, labels, strict=True):
            v = p.counters.get(spec.key)
            if v is not None:
                fam.add(lbl, v)
        if fam.samples:
            fams.append(fam)
    lifespan = Family(
        "stepscope_rdma_counter_lifespan_seconds",
        GAUGE,
        "How long the kernel caches the port's hw_counters before asking the device again "
        "(a setting, from hw_counters/lifespan).",
    )
    for p, lbl in zip(ports, labels, strict=True):
        if p.lifespan_seconds is not None:
            lifespan.add(lbl, p.lifespan_seconds)
    if lifespan.samples:
        fams.append(lifespan)
    return fams
