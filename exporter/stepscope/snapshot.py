"""The Snapshot: everything the exporter knows at one instant, immutable.

The sampler builds one per interval and swaps a reference; everything that
serves (``/metrics``, ``/readyz``, later the diagnosis) reads the latest one.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from dataclasses import dataclass, field

from stepscope.aws.topology import NodeTopology
from stepscope.diagnose.model import Diagnosis
from stepscope.gpu.model import GpuState
from stepscope.host.model import HostReading
from stepscope.net.rdma import RdmaPort
from stepscope.training.aggregate import TrainingView
from stepscope.training.peak_flops import DATASHEET_PEAKS, PeakTable


@dataclass(frozen=True)
class Snapshot:
    """One sampling pass.

    ``timestamp`` is wall-clock time (served), ``monotonic`` the monotonic time
    used for staleness. ``collect_errors`` are cumulative since start, by source.
    ``training`` is the training ingest's view (None when the exporter runs without
    one); ``peak_flops`` the peak table the MFU is computed with.
    """

    timestamp: float
    monotonic: float
    hostname: str
    backend: str
    interval: float
    slow_interval: float
    gpus: tuple[GpuState, ...] = ()
    collect_duration_seconds: float = 0.0
    collect_errors: Mapping[str, int] = field(default_factory=dict)
    training: TrainingView | None = None
    peak_flops: PeakTable = DATASHEET_PEAKS
    # host and RDMA readings (None / () where not read), and the verdicts over the
    # window ending at this snapshot (set by the sampler once the snapshot is built)
    host: HostReading | None = None
    rdma: tuple[RdmaPort, ...] = ()
    diagnosis: Diagnosis | None = None
    # GPU index -> HPC job id, when hpc_job_dir is set (None: the feature is off)
    hpc_jobs: Mapping[int, str] | None = None
    # the EC2 placement read from IMDSv2 at start (None off EC2 or until it is read)
    node: NodeTopology | None = None

    def age(self, now_monotonic: float) -> float:
        """Seconds since this snapshot was taken."""
        return now_monotonic - self.monotonic


class RenderedSnapshot:
    """A snapshot and its exposition bytes, rendered once and served many times.

    The gzip form is made on the first scrape that asks for it (Prometheus
    does) and kept, so a snapshot is compressed at most once.
    """

    __slots__ = ("_gzip", "body", "snapshot")

    def __init__(self, snapshot: Snapshot, body: bytes) -> None:
        self.snapshot = snapshot
        self.body = body
        self._gzip: bytes | None = None

    def gzipped(self) -> bytes:
        """The body gzip-compressed (level 1: the text compresses ~10x anyway)."""
        if self._gzip is None:
            self._gzip = gzip.compress(self.body, compresslevel=1, mtime=0)
        return self._gzip
