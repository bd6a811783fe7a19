"""``GpuSource``: every GPU of the node through a backend (NVML or simulated).

Each pass reads the FAST tier of every GPU and the SLOW tier when it is due (a slow
value is carried between its reads), and drains XID events. One GPU's failure is that
GPU's: ``GpuUnavailable`` marks it down (retried on the slow cadence only), any other
error from the backend for one GPU costs that GPU's reading this pass and counts as a
partial error of the ``gpu`` collector.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from stepscope.core.exposition import Family
from stepscope.core.labels import GpuIdentity, LabelSchema
from stepscope.core.source import ReadContext, Source, Tier
from stepscope.gpu.fields import ONCE_ACTIVE_KEYS, SLOW_KEYS
from stepscope.gpu.metrics import gpu_families
from stepscope.gpu.model import GPU_PART, GpuBackend, GpuInfo, GpuPart, GpuState, GpuUnavailable

log = logging.getLogger("stepscope.gpu")

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
    active_keys: frozenset[str] = frozenset()

    def state(self) -> GpuState:
        values = self.values
        if len(self.active_keys) < len(ONCE_ACTIVE_KEYS):
            seen = {k for k in ONCE_ACTIVE_KEYS if values.get(k)}
            if not seen <= self.active_keys:
                self.active_keys = self.active_keys | seen
        return GpuState(
            info=self.info,
            up=self.up,
            values=dict(self.values) if self.up else {},
            xid_counts=dict(self.xid_counts),
            last_xid=self.last_xid,
            sample_cpu_seconds=self.cpu_seconds,
            active_keys=self.active_keys,
        )


class GpuSource(Source[GpuPart]):
    """Owns the backend while the exporter runs; the sampler thread is its only caller."""

    key = GPU_PART

    def __init__(self, backend: GpuBackend) -> None:
        self._backend = backend
        self._tracks = [_GpuTrack(info) for info in backend.devices()]
        self._by_index = {t.info.index: t for t in self._tracks}
        self._identities = tuple(t.info.identity for t in self._tracks)

    def read(self, ctx: ReadContext) -> GpuPart:
        now = ctx.now
        slow_due = any(
            now - t.last_slow >= ctx.slow_interval - 1e-3 for t in self._tracks if t.up
        )
        self._drain_events(ctx)
        for track in self._tracks:
            self._read_gpu(track, ctx, slow_due)
        return GpuPart(self._backend.name, tuple(t.state() for t in self._tracks))

    def _read_gpu(self, track: _GpuTrack, ctx: ReadContext, slow_due: bool) -> None:
        now = ctx.now
        if not track.up and now - track.last_slow < ctx.slow_interval:
            return  # a down GPU is retried on the slow cadence only
        tiers = _BOTH if (slow_due or not track.up) else _FAST
        t0 = time.thread_time()
        try:
            reading = self._backend.read(track.info.index, tiers)
        except GpuUnavailable as exc:
            if track.up:
                log.warning("GPU %d (%s) is down: %s", track.info.index, track.info.uuid, exc)
                ctx.error()
            track.up = False
            track.values.clear()
            track.last_slow = now
            track.last_error = str(exc)
            return
        except Exception as exc:  # a backend bug must not stop the other GPUs
            ctx.error()
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
            ctx.error(reading.errors)
        values = track.values
        if Tier.SLOW in tiers:
            track.last_slow = now
            # a slow key missing from a slow read is no longer supported: drop it
            for key in SLOW_KEYS - reading.values.keys():
                values.pop(key, None)
        else:
            for key in [k for k in values if k not in SLOW_KEYS and k not in reading.values]:
                del values[key]
        values.update(reading.values)

    def _drain_events(self, ctx: ReadContext) -> None:
        try:
            events = self._backend.events()
        except Exception:
            ctx.error()
            log.exception("reading XID events failed")
            return
        fresh: dict[tuple[int, int], int] = {}
        for ev in events:
            track = self._by_index.get(ev.index)
            if track is None:
                continue
            track.xid_counts[ev.xid] = track.xid_counts.get(ev.xid, 0) + 1
            track.last_xid = ev.xid
            fresh[(ev.index, ev.xid)] = fresh.get((ev.index, ev.xid), 0) + 1
        # one line per GPU and code per pass, however many the driver reported (an XID
        # storm must not flood the log; the counts are in stepscope_xid_errors_total)
        for (index, xid), n in sorted(fresh.items()):
            if n == 1:
                log.warning("GPU %d reported XID %d", index, xid)
            else:
                log.warning("GPU %d reported XID %d (%d times)", index, xid, n)

    def families(self, part: GpuPart, labels: LabelSchema) -> Iterable[Family]:
        return gpu_families(part, labels)

    def gpus(self, part: GpuPart) -> Sequence[GpuIdentity]:
        return self._identities

    def close(self) -> None:
        self._backend.close()
