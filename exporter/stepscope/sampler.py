"""The sampler: reads every source on its own interval, off the event loop.

Each pass reads the FAST tier of every GPU (and the SLOW tier when it is due),
drains XID events, takes the training source's immutable view (when there is one),
builds an immutable Snapshot, renders it once and swaps the reference that the web
server serves. A scrape never touches NVML. Sources never call each other: the
sampler only gathers what each one gives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from stepscope.aws.topology import NodeTopology
from stepscope.diagnose.engine import diagnose
from stepscope.diagnose.thresholds import Thresholds
from stepscope.diagnose.window import SnapshotWindow
from stepscope.exposition import render
from stepscope.gpu.fields import SLOW_KEYS
from stepscope.gpu.hpc_jobs import read_hpc_jobs
from stepscope.gpu.model import GpuBackend, GpuInfo, GpuState, GpuUnavailable, Tier
from stepscope.host.model import HostReading
from stepscope.metrics import LabelCache, snapshot_families
from stepscope.net.rdma import RdmaPort
from stepscope.snapshot import RenderedSnapshot, Snapshot
from stepscope.training.aggregate import TrainingView
from stepscope.training.peak_flops import DATASHEET_PEAKS, PeakTable

log = logging.getLogger("stepscope.sampler")

_FAST = frozenset({Tier.FAST})
_BOTH = frozenset({Tier.FAST, Tier.SLOW})


@dataclass
class _GpuTrack:
    """Mutable per-GPU bookkeeping, private to the sampler thread."""

    info: GpuInfo
    up: bool = True
    values: dict[str, float] = field(default_factory=dict)
    xid_counts: dict[int, int] = field(default_factory=dict)
    last_xid: int = 0
    cpu_seconds: float = 0.0
    last_slow: float = float("-inf")
    last_error: str = ""

    def state(self) -> GpuState:
        return GpuState(
            info=self.info,
            up=self.up,
            values=dict(self.values) if self.up else {},
            xid_counts=dict(self.xid_counts),
            last_xid=self.last_xid,
            sample_cpu_seconds=self.cpu_seconds,
        )


@dataclass(frozen=True)
class SamplerSettings:
    """What a reload may change without restarting the sampler."""

    hostname: str
    interval: float
    slow_interval: float
    peak_flops: PeakTable = DATASHEET_PEAKS
    diagnosis: Thresholds = field(default_factory=Thresholds)
    hpc_job_dir: Path | None = None


class HostSource(Protocol):
    """Anything that reads the host for the given training pids (host.source.HostSource)."""

    def read(self, pids: Iterable[int] = ()) -> HostReading: ...


class TrainingSource(Protocol):
    """Anything that gives an immutable view of the training ranks (the Aggregator)."""

    def view(self) -> TrainingView: ...


class Sampler:
    """Owns the backend while running; the only thread that calls it."""

    def __init__(
        self,
        backend: GpuBackend,
        settings: SamplerSettings,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        training: TrainingSource | None = None,
        host: HostSource | None = None,
        rdma: Callable[[], tuple[RdmaPort, ...]] | None = None,
    ) -> None:
        self._backend = backend
        self._training = training
        self._host = host
        self._rdma = rdma
        self._window = SnapshotWindow()
        self._settings = settings
        self._clock = clock
        self._wall = wall_clock
        self._tracks = [_GpuTrack(info) for info in backend.devices()]
        self._by_index = {t.info.index: t for t in self._tracks}
        self._errors: dict[str, int] = {}
        self._labels = LabelCache()
        self._latest: RenderedSnapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        # EC2 placement, set once by the IMDS reader thread (a reference swap)
        self.node_topology: NodeTopology | None = None

    @property
    def latest(self) -> RenderedSnapshot | None:
        """The newest rendered snapshot (None before the first pass)."""
        return self._latest

    @property
    def settings(self) -> SamplerSettings:
        return self._settings

    def update(self, settings: SamplerSettings) -> None:
        """Apply reloaded settings from the next pass on (reference swap, no lock)."""
        self._settings = settings

    def _count_error(self, source: str, n: int = 1) -> None:
        self._errors[source] = self._errors.get(source, 0) + n

    def _read_gpu(self, track: _GpuTrack, now: float, slow_due: bool) -> None:
        settings = self._settings
        if not track.up and now - track.last_slow < settings.slow_interval:
            return  # a down GPU is retried on the slow cadence only
        tiers = _BOTH if (slow_due or not track.up) else _FAST
        t0 = time.thread_time()
        try:
            reading = self._backend.read(track.info.index, tiers)
        except GpuUnavailable as exc:
            if track.up:
                log.warning("GPU %d (%s) is down: %s", track.info.index, track.info.uuid, exc)
                self._count_error("gpu_down")
            track.up = False
            track.values.clear()
            track.last_slow = now
            track.last_error = str(exc)
            return
        except Exception as exc:  # a backend bug must not stop the other GPUs
            self._count_error("gpu")
            if str(exc) != track.last_error:
                log.exception("reading GPU %d failed", track.info.index)
            track.last_error = str(exc)
            return
        finally:
            track.cpu_seconds += time.thread_time() - t0
        if not track.up:
            log.warning("GPU %d (%s) is answering again", track.info.index, track.info.uuid)
            track.up = True
        if reading.errors:
            self._count_error("gpu", reading.errors)
        if Tier.SLOW in tiers:
            track.last_slow = now
            # a slow key missing from a slow read is no longer supported: drop it
            for key in SLOW_KEYS - reading.values.keys():
                track.values.pop(key, None)
            track.values.update(reading.values)
        else:
            for key in [k for k in track.values if k not in SLOW_KEYS]:
                if key not in reading.values:
                    del track.values[key]
            track.values.update(reading.values)

    def _drain_events(self) -> None:
        try:
            events = self._backend.events()
        except Exception:
            self._count_error("events")
            log.exception("reading XID events failed")
            return
        for ev in events:
            track = self._by_index.get(ev.index)
            if track is None:
                continue
            track.xid_counts[ev.xid] = track.xid_counts.get(ev.xid, 0) + 1
            track.last_xid = ev.xid
            log.warning("GPU %d reported XID %d", ev.index, ev.xid)

    def _read_training(self) -> TrainingView | None:
        if self._training is None:
            return None
        try:
            return self._training.view()
        except Exception:  # a bug there must not cost the GPU metrics
            self._count_error("training")
            log.exception("reading the training view failed")
            return None

    def _read_host(self, training: TrainingView | None) -> HostReading | None:
        if self._host is None:
            return None
        pids = {r.pid for r in training.ranks if r.pid} if training else set()
        try:
            return self._host.read(pids)
        except Exception:  # the host side must not cost the GPU metrics
            self._count_error("host")
            log.exception("reading the host failed")
            return None

    def _read_rdma(self) -> tuple[RdmaPort, ...]:
        if self._rdma is None:
            return ()
        try:
            return self._rdma()
        except Exception:
            self._count_error("net")
            log.exception("reading RDMA counters failed")
            return ()

    def _diagnose(self, snapshot: Snapshot) -> Snapshot:
        """The snapshot with the verdicts over the window that ends at it."""
        thresholds = self._settings.diagnosis
        window = self._window.push(snapshot, thresholds.window)
        try:
            return replace(snapshot, diagnosis=diagnose(window, thresholds))
        except Exception:  # a rule bug must not cost the metrics
            self._count_error("diagnosis")
            log.exception("diagnosis failed")
            return snapshot

    def sample_once(self) -> RenderedSnapshot:
        """Run one pass now, publish its snapshot and return it."""
        settings = self._settings
        start = self._clock()
        slow_due = any(
            start - t.last_slow >= settings.slow_interval - 1e-3 for t in self._tracks if t.up
        )
        self._drain_events()
        for track in self._tracks:
            self._read_gpu(track, start, slow_due)
        training = self._read_training()
        host = self._read_host(training)
        rdma = self._read_rdma()
        snapshot = Snapshot(
            timestamp=self._wall(),
            monotonic=self._clock(),
            hostname=settings.hostname,
            backend=self._backend.name,
            interval=settings.interval,
            slow_interval=settings.slow_interval,
            gpus=tuple(t.state() for t in self._tracks),
            collect_duration_seconds=self._clock() - start,
            collect_errors=dict(self._errors),
            training=training,
            peak_flops=settings.peak_flops,
            host=host,
            rdma=rdma,
            node=self.node_topology,
            hpc_jobs=read_hpc_jobs(settings.hpc_job_dir) if settings.hpc_job_dir else None,
        )
        snapshot = self._diagnose(snapshot)
        rendered = RenderedSnapshot(snapshot, render(snapshot_families(snapshot, self._labels)))
        self._latest = rendered
        self.passes += 1
        return rendered

    def _run(self) -> None:
        next_at = self._clock()
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception:  # never let the sampling thread die silently
                self._count_error("sampler")
                log.exception("sampling pass failed")
            interval = self._settings.interval
            next_at += interval
            now = self._clock()
            if next_at < now:  # fell behind (suspend, slow NVML): skip, don't burst
                next_at = now + interval
            self._stop.wait(next_at - now)

    def start(self) -> None:
        """Start the sampling thread (the first pass runs immediately)."""
        self._thread = threading.Thread(target=self._run, name="stepscope-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the backend."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._backend.close()
