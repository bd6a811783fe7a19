"""Finished ranks: a training process that has ended reads ``finished`` and drops out.

The ingest keeps a silent rank for ``rank_expiry`` (default 300 s), since a rank may
just be slow; the diagnosis tells an ended run apart sooner, from what the node shows:

- the rank's process was seen alive (its pid readable by the host source) and is gone
  now, while the host source still reads: it exited;
- or, where the pid was never visible (another PID namespace), no step for a whole
  window while the rank's GPU is idle and its framebuffer released: a hung process
  still holds its memory, an ended one does not.

A rank that steps again is live again (but steps its exited process sent just before it
ended, received after the exit was seen, leave it finished). :class:`FinishedTracker`
keeps this across passes (sampler thread only); per pass O(ranks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from stepscope.core.snapshot import Snapshot
from stepscope.gpu.model import GPU_PART
from stepscope.host.model import HOST_PART
from stepscope.ingest.aggregate import INGEST_PART

# A GPU whose framebuffer is below this share in use holds no training process's memory
# (the driver keeps a few hundred MiB of 80-141 GiB): a process that held it has ended.
RELEASED_MEMORY = 0.05
# GPU util (%) below which no kernel runs (the idle rule's default).
IDLE_UTIL = 5.0


@dataclass(frozen=True)
class FinishedRank:
    """A rank whose training process has ended: since when (monotonic), and how we know.

    ``ended``: when (monotonic) the rank stopped holding its GPU, as well as the node
    can tell: halfway between the last pass that saw its process and the first that did
    not (but not before its last step's end), or its last step's end when no process
    was seen; None: ``since``."""

    since: float
    reason: str
    steps: int  # the rank's step count when it was seen finished
    ended: float | None = None
    pid: int | None = None  # the process seen exiting (the pid rule)

    @property
    def held_until(self) -> float:
        """When the rank stopped holding its GPU, as far as the node can tell."""
        return self.since if self.ended is None else min(self.ended, self.since)


class FinishedTracker:
    """Which ranks have finished, by (job, rank)."""

    def __init__(self) -> None:
        # pid seen running, and when (monotonic) it was last seen
        self._alive: dict[tuple[str, int], tuple[int, float]] = {}
        self._finished: dict[tuple[str, int], FinishedRank] = {}

    def update(self, snapshot: Snapshot, window: float) -> Mapping[tuple[str, int], FinishedRank]:
        """Fold in ``snapshot``; the finished ranks now."""
        training = snapshot.part(INGEST_PART)
        if training is None:
            return dict(self._finished)
        host = snapshot.part(HOST_PART)
        gpus = snapshot.part(GPU_PART)
        now = snapshot.monotonic
        present = training.by_key
        for key in [k for k in self._finished if k not in present]:
            del self._finished[key]  # expired from the ingest
        for key in [k for k in self._alive if k not in present]:
            del self._alive[key]
        for key, r in present.items():
            mark = self._finished.get(key)
            pid = r.proc_pid  # its process in this exporter's /proc, if visible
            if mark is not None:
                if r.steps == mark.steps:
                    continue
                if (r.steps > mark.steps and mark.pid is not None and pid == mark.pid
                        and (host is None or pid not in host.processes)):
                    # the last steps its process sent before it exited, received late
                    self._finished[key] = replace(mark, steps=r.steps)
                    continue
                del self._finished[key]  # stepping again, or restarted
            if pid is not None and host is not None:
                if pid in host.processes:
                    self._alive[key] = (pid, now)
                    continue
                alive = self._alive.get(key)
                if alive is not None and alive[0] == pid:
                    del self._alive[key]
                    # it exited between the pass that last saw it and this one (the
                    # middle, as the estimate), and not before its last step's end
                    last_step = now - max(0.0, snapshot.timestamp - r.last_step_timestamp)
                    self._finished[key] = FinishedRank(
                        now, f"its process (pid {r.pid}) exited", r.steps,
                        max((alive[1] + now) / 2, last_step), pid)  # fmt: skip
                    continue
            if key in self._alive or r.uuid is None or gpus is None:
                continue
            gpu = gpus.by_uuid.get(r.uuid)
            silent = snapshot.timestamp - r.last_step_timestamp
            if gpu is None or not gpu.up or silent < window:
                continue
            used, free = gpu.values.get("fb_used"), gpu.values.get("fb_free")
            util = gpu.values.get("gpu_util")
            if used is None or not free or util is None:
                continue
            if used / (used + free) < RELEASED_MEMORY and util < IDLE_UTIL:
                self._finished[key] = FinishedRank(
                    now, f"no step for {silent:.0f} s and its GPU is idle with its memory "
                    "released", r.steps, now - silent)  # fmt: skip
        return dict(self._finished)
