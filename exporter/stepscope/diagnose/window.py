"""The bounded window of recent snapshots the verdicts look back over, kept indexed.

Of the snapshots, the window keeps the newest whole and of the others what the rules
read per subject, updated as a snapshot arrives and as the oldest one expires, never
rebuilt from the whole window: per rank, its step counters since its last restart and
the per-sample history of its step time and phase shares (one entry added per pass); per
GPU, its states; the host readings and, per pid, its process readings; per snapshot,
its time and RDMA counters. A pass touches each rank O(1) (plus the samples that expire),
so the diagnosis costs O(ranks) per pass, not O(ranks × window). Every figure is made
from the same operands, in the same order, as a computation over the whole window would
use: the verdicts are identical to one made from scratch (tests/unit/diagnose/test_window.py).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, Generic, NamedTuple, TypeVar, overload

from stepscope.core.snapshot import Snapshot
from stepscope.gpu.model import GPU_PART, GpuState
from stepscope.host.model import HOST_PART, HostReading, ProcessReading
from stepscope.ingest.aggregate import INGEST_PART, RankView
from stepscope.net.rdma import RDMA_PART, RdmaPort
from stepscope.shared.datagram import PHASES, Phases

# A hard cap whatever the window and interval: memory stays bounded.
MAX_SNAPSHOTS = 3600

T = TypeVar("T")
K = TypeVar("K")
_SERIES = ("step_seconds", *PHASES)
_SERIES_INDEX = {name: i for i, name in enumerate(_SERIES)}


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


class RankSeries(Mapping[str, Sequence[float | None]]):
    """A rank's per-sample series by name (``step_seconds`` and the phase shares), and
    optionally more (its GPU's), each :class:`Series` made when read.

    Made per rank on every pass that makes verdicts, and read only when someone asks for
    ``/api/v1/diagnosis`` or the status page: one object instead of a dict and a view per
    name. ``lists`` are a rank's :class:`_Columns` as they were when it was made
    (compaction makes new lists), read from ``start`` to ``stop``."""

    __slots__ = ("_lists", "_more", "_start", "_stop")

    def __init__(
        self,
        lists: tuple[list[float | None], ...],
        start: int,
        stop: int,
        more: Mapping[str, Sequence[float | None]] | None = None,
    ) -> None:
        self._lists = lists
        self._start = start
        self._stop = stop
        self._more = more or {}

    def joined(self, more: Mapping[str, Sequence[float | None]]) -> RankSeries:
        """These series and ``more`` (names not among :data:`_SERIES`)."""
        return RankSeries(self._lists, self._start, self._stop, more)

    def __getitem__(self, name: str) -> Sequence[float | None]:
        i = _SERIES_INDEX.get(name)
        if i is None:
            return self._more[name]
        return Series(self._lists[i], self._start, self._stop)

    def __iter__(self) -> Iterator[str]:
        yield from _SERIES
        yield from self._more

    def __len__(self) -> int:
        return len(_SERIES) + len(self._more)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


class _Columns:
    """The append-only lists behind a rank's series (one per name of :data:`_SERIES`)
    and where the window starts in them: they are appended, trimmed and compacted
    together, so one ``start`` serves all."""

    __slots__ = ("lists", "start")

    def __init__(self) -> None:
        self.lists: tuple[list[float | None], ...] = tuple([] for _ in _SERIES)
        self.start = 0

    def popleft(self) -> None:
        self.start += 1
        if self.start >= 32 and 2 * self.start >= len(self.lists[0]):
            # compact into new lists: series already taken keep the old ones
            self.lists = tuple(values[self.start :] for values in self.lists)
            self.start = 0

    def clear(self) -> None:
        self.lists = tuple([] for _ in _SERIES)  # new lists, for the same reason
        self.start = 0

    def series(self) -> RankSeries:
        return RankSeries(self.lists, self.start, len(self.lists[0]))


class RankWindow(NamedTuple):
    """One rank's steps and phase seconds over the window. (A NamedTuple: one is made per
    rank on every pass that makes verdicts, and a frozen dataclass costs ~1 us more.)"""

    view: RankView
    steps: int  # measured steps in the window
    all_steps: int  # warm-up included
    dur: float
    phases: Phases
    series: RankSeries
    # seconds in each named span of SPANS over the window (part of phases.other);
    # None: the rank names none
    spans: tuple[float, ...] | None = None

    def shares(self) -> Phases:
        """Each phase's share of the window's step time."""
        d = self.dur
        return Phases._make([p / d for p in self.phases] if d > 0 else _ZERO)

    def per_step(self) -> Phases:
        """Each phase's seconds per measured step."""
        n = self.steps
        return Phases._make([p / n for p in self.phases] if n else _ZERO)


_ZERO = Phases()


# What the window keeps of each view of a rank: (seq, steps, measured steps, step
# seconds, the seconds of each phase, and those of each named span or None). Tuples of
# numbers, which the garbage collector stops tracking after its first look (a RankView, a
# NamedTuple, it tracks for good): at 512 ranks and a 30 s window, ~16,000 objects fewer
# for every full collection.
_Counts = tuple[int, int, int, float, float, float, float, float, tuple[float, ...] | None]
# their places (then the phases, in PHASES order)
_SEQ: Final = 0
_STEPS: Final = 1
_MEASURED: Final = 2
_DUR: Final = 3
_SPANS: Final = 8


def _counts(seq: int, view: RankView) -> _Counts:
    return (seq, view.steps, view.measured_steps, view.step_seconds_sum, *view.phase_seconds,
            view.span_seconds)  # fmt: skip


class _Rank:
    """A rank's counts in the window since its last restart (oldest first), its newest
    view, and per series the entry between each two consecutive counts."""

    __slots__ = ("latest", "series", "views")

    def __init__(self, latest: RankView) -> None:
        self.views: deque[_Counts] = deque()
        self.latest = latest
        self.series = _Columns()

    def add(self, seq: int, view: RankView) -> None:
        views = self.views
        counts = _counts(seq, view)
        if views:
            a = views[-1]
            if view.steps < a[_STEPS]:  # restarted: counters from 0
                views.clear()
                self.series.clear()
            else:  # the step time and phase shares from the previous view to this one
                n = counts[_MEASURED] - a[_MEASURED]
                d = counts[_DUR] - a[_DUR]
                step_seconds, data_wait, compute, comm, other = self.series.lists
                step_seconds.append(d / n if n > 0 else None)
                if n > 0 and d > 0:
                    data_wait.append((counts[4] - a[4]) / d)
                    compute.append((counts[5] - a[5]) / d)
                    comm.append((counts[6] - a[6]) / d)
                    other.append((counts[7] - a[7]) / d)
                else:
                    for share in (data_wait, compute, comm, other):
                        share.append(None)
        views.append(counts)
        self.latest = view

    def expire(self, oldest: int) -> bool:
        """Drop the views of expired snapshots; whether any view is left."""
        views = self.views
        while views and views[0][_SEQ] < oldest:
            views.popleft()
            if views:  # the entries between the dropped view and the next
                self.series.popleft()
        return bool(views)

    def window(self) -> RankWindow:
        first = self.views[0]
        last = self.views[-1]
        return RankWindow(
            view=self.latest,
            steps=last[_MEASURED] - first[_MEASURED],
            all_steps=last[_STEPS] - first[_STEPS],
            dur=last[_DUR] - first[_DUR],
            phases=Phases._make(
                map(operator.sub, last[_DUR + 1 : _SPANS], first[_DUR + 1 : _SPANS])
            ),
            series=self.series.series(),
            spans=_span_change(first[_SPANS], last[_SPANS]),
        )


def _span_change(
    first: tuple[float, ...] | None, last: tuple[float, ...] | None
) -> tuple[float, ...] | None:
    """Seconds per named span between two views (None: the rank names none)."""
    if last is None:
        return None
    if first is None:
        return last
    return tuple(b - a for a, b in zip(first, last, strict=True))


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
    """The recent snapshots, spanning at most ``window`` seconds: the newest one whole,
    and of them all the per-subject views the rules read.

    Owned by the sampler thread (not thread-safe). Snapshots are immutable, so what the
    accessors return can be handed to pure functions as is; they stay valid until the
    next :meth:`push`. Older snapshots are not kept: what the rules read of them is
    indexed here, and a snapshot holds every rank's view (~0.5 KB a rank: at 512 ranks
    and a 30 s window, 8 MB that nothing read).
    """

    def __init__(self) -> None:
        self._seq = 0
        # (seq, monotonic, RDMA ports) of each snapshot in the window, oldest first
        self._ring: deque[tuple[int, float, tuple[RdmaPort, ...]]] = deque()
        self._latest: Snapshot | None = None
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

    def push(self, snapshot: Snapshot, window: float) -> int:
        """Add ``snapshot``, drop those older than ``window`` before it; how many are left."""
        self._seq += 1
        seq = self._seq
        ring = self._ring
        ring.append((seq, snapshot.monotonic, snapshot.part(RDMA_PART) or ()))
        cutoff = snapshot.monotonic - window
        while len(ring) > MAX_SNAPSHOTS or ring[0][1] < cutoff - 1e-6:
            ring.popleft()
        oldest = ring[0][0]
        self._latest = snapshot

        ranks = self._ranks
        for key in [k for k, r in ranks.items() if not r.expire(oldest)]:
            del ranks[key]
        training = snapshot.part(INGEST_PART)
        for view in training.ranks if training is not None else ():
            key = (view.job, view.rank)
            track = ranks.get(key)
            if track is None:
                track = ranks[key] = _Rank(view)
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
        return len(ring)

    @property
    def latest(self) -> Snapshot | None:
        """The newest snapshot (None before the first push)."""
        return self._latest

    @property
    def samples(self) -> int:
        """How many snapshots the window spans."""
        return len(self._ring)

    @property
    def span(self) -> float:
        """Seconds from the oldest snapshot in the window to the newest."""
        ring = self._ring
        return ring[-1][1] - ring[0][1] if ring else 0.0

    def rdma_ends(self) -> tuple[tuple[RdmaPort, ...], tuple[RdmaPort, ...]]:
        """The RDMA ports in the oldest snapshot of the window and in the newest."""
        ring = self._ring
        return (ring[0][2], ring[-1][2]) if ring else ((), ())

    def rank(self, key: tuple[str, int]) -> RankWindow | None:
        """The rank's change over the window (from its last restart), None if absent now."""
        training = self._latest.part(INGEST_PART) if self._latest is not None else None
        if training is None or key not in training.by_key:
            return None
        return self._ranks[key].window()

    def ranks(self) -> list[RankWindow]:
        """Every rank of the newest snapshot over the window, in the snapshot's order."""
        training = self._latest.part(INGEST_PART) if self._latest is not None else None
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
