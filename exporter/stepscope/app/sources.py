"""Every source and analysis the exporter runs, registered in reading order.

This is the one place a new source is registered (one line): its own file holds the
rest (a :class:`~stepscope.core.source.Source` subclass: read, families, hooks). Order
matters only where a read uses what an earlier one named: the GPU source names the
GPUs, the ingest names the ranks, the host source reads those ranks' processes.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepscope.app.config import Config
from stepscope.attribution.hpc_jobs import HpcJobSource
from stepscope.attribution.kubernetes import KubernetesSource
from stepscope.aws.source import NodeTopologySource
from stepscope.core.registry import Registry
from stepscope.diagnose.analysis import DiagnosisAnalysis
from stepscope.gpu.model import GpuBackend
from stepscope.gpu.source import GpuSource
from stepscope.host.source import HostSource
from stepscope.ingest.aggregate import Aggregator
from stepscope.ingest.source import IngestSource
from stepscope.net.source import RdmaSource
from stepscope.web.auth import BasicAuth
from stepscope.web.guard import ConnectionGuard, HttpSource


@dataclass(frozen=True)
class Sources:
    """The registry, and the members a reload reconfigures."""

    registry: Registry
    diagnosis: DiagnosisAnalysis
    hpc_jobs: HpcJobSource | None


def build_sources(
    cfg: Config,
    backend: GpuBackend,
    aggregator: Aggregator,
    guard: ConnectionGuard | None = None,
    auth: BasicAuth | None = None,
) -> Sources:
    """The exporter's sources for ``cfg``; the GPU source takes ownership of ``backend``."""
    registry = Registry()
    registry.register(GpuSource(backend))
    registry.register(IngestSource(aggregator))
    registry.register(HostSource())
    registry.register(RdmaSource())
    hpc = registry.register(HpcJobSource(cfg.hpc_job_dir)) if cfg.hpc_job_dir else None
    if cfg.kubernetes_pod_resources:
        registry.register(KubernetesSource(str(cfg.kubernetes_pod_resources)))
    registry.register(NodeTopologySource())
    if guard is not None:
        registry.register(HttpSource(guard, auth))
    diagnosis = registry.register_analysis(DiagnosisAnalysis(cfg.diagnosis))
    return Sources(registry, diagnosis, hpc)  # type: ignore[arg-type]
