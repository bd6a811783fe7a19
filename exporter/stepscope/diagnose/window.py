"""The bounded ring of recent snapshots the verdicts look back over."""

from __future__ import annotations

from collections import deque

from stepscope.core.snapshot import Snapshot

# A hard cap whatever the window and interval: memory stays bounded.
MAX_SNAPSHOTS = 3600


class SnapshotWindow:
    """Recent snapshots, oldest first, spanning at most ``window`` seconds.

    Owned by the sampler thread (not thread-safe). Snapshots are immutable, so the
    tuple :meth:`push` returns can be handed to pure functions as is.
    """

    def __init__(self) -> None:
        self._ring: deque[Snapshot] = deque(maxlen=MAX_SNAPSHOTS)

    def push(self, snapshot: Snapshot, window: float) -> tuple[Snapshot, ...]:
        """Add ``snapshot``, drop those older than ``window`` before it, return the rest."""
        ring = self._ring
        ring.append(snapshot)
        cutoff = snapshot.monotonic - window
        while ring and ring[0].monotonic < cutoff - 1e-6:
            ring.popleft()
        return tuple(ring)
