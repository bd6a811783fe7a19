"""The bounded window of recent snapshots the verdicts look back over, kept indexed.

Besides the snapshots, the window keeps what the rules read per subject, updated as a
snapshot arrives and as the oldest one expires, never rebuilt from the whole window: per
rank, its views since its last restart and the per-sample history of its step time and
phase shares (one entry added per pass); per GPU, its states; the host readings and, per
pid, its process readings. A pass touches each rank O(1) (plus the samples that expire),
so the diagnosis costs O(ranks) per pass, not O(ranks × window). Every figure is made
from the same operands, in the same order, as a computation over the whole window would
use: the verdicts are identical to one made from scratch (tests/test_diagnosis_incremental.py).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, overload

from stepscope.core.snapshot import Snapshot
from stepscope.datagram import PHASES, Phases
from stepscope.gpu.model import GPU_PART, GpuState
from stepscope.host.model import HOST_PART, HostReading, ProcessReading
from stepscope.ingest.aggregate import INGEST_PART, RankView

# A hard cap whatever the window and interval: memory stays bounded.
MAX_SNAPSHOTS = 3600

T = TypeVar("T")
K = TypeVar("K")
_SERIES = ("step_seconds", *PHASES)


class Series(Sequence[float | None]):
    """An immutable per-sample series: a view of a slice of an append-only list.

    Taking one is O(1) whatever the window: a verdict keeps it for the life of its
    snapshot while the window goes on appending to the list (never rewriting it)."""

    __slots__ = ("_start", "_stop", "_values")

    def __init__(self, values: list[float | None], start: int, stop: int) -> None:
        self._values = values
        self._start = start
        self._stop = stop

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, i: int) -> float | None: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[float | None, ...]: ...
    def __getitem__(self, i: int | slice) -> float | tuple[float | None, ...] | None:
        if isinstance(i, slice):
            return tuple(self)[i]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("series index out of range")
        return self._values[self._start + (i if i >= 0 else n + i)]

    def __iter__(self) -> Iterator[float | None]:
        return iter(self._values[self._start : self._stop])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Series, tuple, list)):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


class _Column:
    """The append-only list behind a rank's series and where the window starts in it."""

    __slots__ = ("start", "values")

    def __init__(self) -> None:
        self.values: list[float | None] = []
        self.start = 0

    def popleft(self) -> None:
        self.start += 1
        if self.start >= 32 and 2 * self.start >= len(self.values):
            # compact into a new list: series already taken keep the old one
            self.values = self.values[self.start :]
            self.start = 0

    def clear(self) -> None:
        self.values = []  # a new list, never cleared in place, for the same reason
        self.start = 0

    def series(self) -> Series:
        return Series(self.values, self.start, len(self.values))


@dataclass(frozen=True)
class RankWindow:
    """One rank's steps and phase seconds over the window."""

    view: RankView
    steps: int  # measured steps in the window
    all_steps: int  # warm-up included
    dur: float
    phases: Phases
    series: dict[str, Sequence[float | None]]

    def shares(self) -> Phases:
        """Each phase's share of the window's step time."""
        d = self.dur
        return Phases._make([p / d for p in self.phases] if d > 0 else _ZERO)

    def per_step(self) -> Phases:
        """Each phase's seconds per measured step."""
        n = self.steps
        return Phases._make([p / n for p in self.phases] if n else _ZERO)


_ZERO = Phases()


class _Rank:
    """A rank's views in the window since its last restart (``(seq, view)``, oldest first)
    and, per series, the entry between each two consecutive views."""

    __slots__ = ("series", "views")

    def __init__(self) -> None:
        self.views: deque[tuple[int, RankView]] = deque()
        self.series: tuple[_Column, ...] = tuple(_Column() for _ in _SERIES)

    def add(self, seq: int, view: RankView) -> None:
        views = self.views
        if views:
            a = views[-1][1]
            if view.steps < a.steps:  # restarted: counters from 0
                views.clear()
                for series in self.series:
                    series.clear()
            else:  # the step time and phase shares from the previous view to this one
                n = view.measured_steps - a.measured_steps
                d = view.step_seconds_sum - a.step_seconds_sum
                step_seconds, *shares = self.series
                step_seconds.values.append(d / n if n > 0 else None)
                for share, pa, pb in zip(shares, a.phase_seconds, view.phase_seconds, strict=True):
                    share.values.append((pb - pa) / d if n > 0 and d > 0 else None)
        views.append((seq, view))

    def expire(self, oldest: int) -> bool:
        """Drop the views of expired snapshots; whether any view is left."""
        views = self.views
        while views and views[0][0] < oldest:
            views.popleft()
            if views:  # the entries between the dropped view and the next
                for series in self.series:
                    series.popleft()
        return bool(views)

    def window(self) -> RankWindow:
        first = self.views[0][1]
        last = self.views[-1][1]
        return RankWindow(
            view=last,
            steps=last.measured_steps - first.measured_steps,
            all_steps=last.steps - first.steps,
            dur=last.step_seconds_sum - first.step_seconds_sum,
            phases=Phases._make(map(operator.sub, last.phase_seconds, first.phase_seconds)),
            series={name: c.series() for name, c in zip(_SERIES, self.series, strict=True)},
        )


class _Keyed(Generic[K, T]):
    """Per key, the ``(seq, value)`` pairs of the snapshots in the window that had one."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[K, deque[tuple[int, T]]] = {}

    def add(self, seq: int, items: Iterable[tuple[K, T]]) -> None:
        by_key = self._by_key
        for key, value in items:
            entries = by_key.get(key)
            if entries is None:
                entries = by_key[key] = deque()
            entries.append((seq, value))

    def expire(self, oldest: int) -> None:
        for key, entries in list(self._by_key.items()):
            while entries and entries[0][0] < oldest:
                entries.popleft()
            if not entries:
                del self._by_key[key]

    def get(self, key: K) -> deque[tuple[int, T]]:
        return self._by_key.get(key) or deque()

    def __len__(self) -> int:
        return len(self._by_key)


class SnapshotWindow:
    """Recent snapshots, oldest first, spanning at most ``window`` seconds, and the
    per-subject views of them the rules read.

    Owned by the sampler thread (not thread-safe). Snapshots are immutable, so what the
    accessors return can be handed to pure functions as is; they stay valid until the
    next :meth:`push`.
    """

    def __init__(self) -> None:
        self._seq = 0
        self._ring: deque[tuple[int, Snapshot]] = deque()
        self._snapshots: tuple[Snapshot, ...] = ()
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._gpus: _Keyed[str, tuple[float, GpuState]] = _Keyed()
        self._hosts: deque[tuple[int, HostReading]] = deque()
        self._procs: _Keyed[int, ProcessReading] = _Keyed()

    @classmethod
    def of(cls, snapshots: Iterable[Snapshot], window: float) -> SnapshotWindow:
        """A window built from scratch by pushing ``snapshots`` (oldest first)."""
        made = cls()
        for snapshot in snapshots:
            made.push(snapshot, window)
        return made

    def push(self, snapshot: Snapshot, window: float) -> tuple[Snapshot, ...]:
        """Add ``snapshot``, drop those older than ``window`` before it, return the rest."""
        self._seq += 1
        seq = self._seq
        ring = self._ring
        ring.append((seq, snapshot))
        cutoff = snapshot.monotonic - window
        while len(ring) > MAX_SNAPSHOTS or ring[0][1].monotonic < cutoff - 1e-6:
            ring.popleft()
        oldest = ring[0][0]
        self._snapshots = tuple(s for _, s in ring)

        ranks = self._ranks
        for key in [k for k, r in ranks.items() if not r.expire(oldest)]:
            del ranks[key]
        training = snapshot.part(INGEST_PART)
        for view in training.ranks if training is not None else ():
            key = (view.job, view.rank)
            track = ranks.get(key)
            if track is None:
                track = ranks[key] = _Rank()
            track.add(seq, view)

        self._gpus.expire(oldest)
        self._procs.expire(oldest)
        hosts = self._hosts
        while hosts and hosts[0][0] < oldest:
            hosts.popleft()
        gpus = snapshot.part(GPU_PART)
        if gpus is not None:
            now = snapshot.monotonic
            self._gpus.add(seq, ((g.info.uuid, (now, g)) for g in gpus.gpus))
        host = snapshot.part(HOST_PART)
        if host is not None:
            hosts.append((seq, host))
            self._procs.add(seq, host.processes.items())
        return self._snapshots

    @property
    def snapshots(self) -> tuple[Snapshot, ...]:
        """The snapshots in the window, oldest first."""
        return self._snapshots

    def rank(self, key: tuple[str, int]) -> RankWindow | None:
        """The rank's change over the window (from its last restart), None if absent now."""
        snapshots = self._snapshots
        training = snapshots[-1].part(INGEST_PART) if snapshots else None
        if training is None or key not in training.by_key:
            return None
        return self._ranks[key].window()

    def ranks(self) -> list[RankWindow]:
        """Every rank of the newest snapshot over the window, in the snapshot's order."""
        training = self._snapshots[-1].part(INGEST_PART) if self._snapshots else None
        ranks = self._ranks
        return [ranks[r.job, r.rank].window() for r in training.ranks] if training else []

    def gpu_states(self, uuid: str) -> list[tuple[float, GpuState]]:
        """``(monotonic, state)`` of the GPU in each snapshot of the window that has it."""
        return [v for _, v in self._gpus.get(uuid)]

    def host_readings(self) -> list[HostReading]:
        """The host readings in the window, oldest first."""
        return [v for _, v in self._hosts]

    def process_readings(self, pid: int) -> list[ProcessReading]:
        """The readings of process ``pid`` in the window, oldest first."""
        return [v for _, v in self._procs.get(pid)]

    def tracked(self) -> tuple[int, int, int]:
        """How many ranks, GPUs and pids have views in the window (its memory)."""
        return len(self._ranks), len(self._gpus), len(self._procs)
