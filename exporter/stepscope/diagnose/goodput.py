"""Goodput and badput: where each GPU-second a training job held on this node went.

A rank holds its GPU from its process's start until the process ends (or the ingest
forgets it). The time before its first step (imports, model and checkpoint loading,
NCCL set-up, compilation before the loop) is ``program_startup``; where the process
cannot be seen (UDP, another PID namespace), the node did not see its first steps (its
warm-up: an exporter started mid-run), or the process reported for another rank or job
before, the hold starts at the first step's start. Every second held is booked
once, to productive step time (goodput) or to one cause of loss (badput), in GPU-seconds
per job on the node, so a job's goodput and badput add up to the time its ranks held
their GPUs.

The bill is the exporter's clock; the senders' figures only split it. Both ends of a
hold are the exporter's: its start is the process's start as /proc says for the pid the
kernel named, or the first step's start as the ingest judged it
(:attr:`~stepscope.ingest.aggregate.RankView.held_since`: never before the first
datagram of a process it cannot see), and never before the end of the rank's previous
hold on this node (a takeover, a rank forgotten and back); its end is a pass of the
exporter's. So a job's books never exceed the wall time its ranks were held here,
whatever the steps' ``t`` and ``dur`` say (tests/unit/diagnose/test_goodput_books.py).

Each pass, the :class:`GoodputLedger` adds the time elapsed to each live rank's
*pending* time (held, not yet explained) and books what the rank's counters explain
since the last pass, out of that pending time:

- the measured steps' phases: ``compute`` is goodput (``host_bound`` or
  ``transfer_bound`` while the rank's verdict says so: the step body ran, the GPU
  mostly did not), ``data_wait`` is ``data_loading_sync``, ``comm`` is
  ``exposed_communication``, and ``other`` (time outside the step body) goes to the
  span the SDK named (``checkpoint`` is ``unproductive_checkpoint_save_time``,
  ``evaluation``, ``logging``) or to ``other``;
- warm-up steps (compilation, autotuning, the first steps) are ``program_startup``;
- steps a restarted process redoes (numbered at or below the highest step its
  predecessor reported) are ``wasted_progress_from_disruption``, whatever their phases;
- everything, while the rank's GPU has a hardware fault, is ``hardware_fault``.

A step's time is explained when the step reports, so pending time is about one step
on a running rank. When the rank ends (its process exits, it stops stepping with its GPU
released, a restart takes it over, or the ingest forgets it), its pending time is booked
as ``idle`` (``hardware_fault`` on a faulted GPU): held, and nothing the node saw used it.
Steps that report more time than has passed since the last pass (a step reported late,
clocks that differ) are scaled to the pending time, so the books never hold more than
the wall time.

The cause names follow Google's ml-goodput-measurement ``BadputType`` where they mean
the same (``DATA_LOADING_SYNC``, ``PROGRAM_STARTUP``, ``UNPRODUCTIVE_CHECKPOINT_SAVE_TIME``,
``WASTED_PROGRESS_FROM_DISRUPTION``, ``OTHER``), lower-cased; the rest are this
exporter's. docs/metrics.md#goodput-and-badput has the families.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from stepscope.diagnose.finished import FinishedRank
from stepscope.diagnose.model import JobGoodput
from stepscope.ingest.aggregate import RankView, TrainingView
from stepscope.shared.datagram import SPANS, Phases

# Every cause of badput, in the order they are served.
BADPUT_TYPES: tuple[str, ...] = (
    "data_loading_sync",
    "exposed_communication",
    "host_bound",
    "transfer_bound",
    "unproductive_checkpoint_save_time",
    "evaluation",
    "logging",
    "other",
    "program_startup",
    "idle",
    "hardware_fault",
    "wasted_progress_from_disruption",
)
# The SDK's named spans between steps (stepscope.shared.datagram.SPANS), as causes.
SPAN_CAUSES: Mapping[str, str] = {
    "checkpoint": "unproductive_checkpoint_save_time",
    "evaluation": "evaluation",
    "logging": "logging",
    "other": "other",
}
# Verdicts under which a step body's time is lost, not productive.
BODY_CAUSES: Mapping[str, str] = {"host_bound": "host_bound", "transfer_bound": "transfer_bound"}
FAULT_KIND = "gpu_fault"
# A job's books stay served this long after its last rank left the ingest, so the last
# of its time (booked when its ranks end) is scraped before the series go.
JOB_LINGER = 300.0
# A rank seen ended is closed this long after: its last datagrams, sent just before its
# process exited, may be aggregated after the pass that saw the exit.
END_GRACE = 1.0
# The most time before a first step booked as its process's startup; a longer gap is
# not believed (an exporter started long after the process), and the hold starts at
# the first step.
MAX_STARTUP = 6 * 3600.0

_SPAN_INDEX = tuple(SPAN_CAUSES[name] for name in SPANS)


_NO_SPANS: tuple[float, ...] = (0.0,) * len(SPANS)


class _Counters(NamedTuple):
    """What a rank's view says it spent, cumulative (zero for a new book)."""

    phases: tuple[float, float, float, float]
    spans: tuple[float, ...]
    warmup: float
    redo: float

    @classmethod
    def of(cls, r: RankView) -> _Counters:
        phases, spans = r.phase_seconds, r.span_seconds or _NO_SPANS
        tail = r.tail_spans
        if tail is not None:  # named after the last step: time between steps, by its name
            data, compute, comm, other = phases
            phases = Phases(data, compute, comm, other + r.tail_seconds)
            spans = tuple(a + b for a, b in zip(spans, tail, strict=True))
        return cls(phases, spans, r.warmup_seconds, r.redo_seconds)


_ZERO = _Counters((0.0, 0.0, 0.0, 0.0), _NO_SPANS, 0.0, 0.0)


@dataclass(slots=True)
class _Book:
    """One rank's account: what it has explained so far, and what it holds unexplained."""

    created: float  # the ingest's incarnation of the rank (a restart makes a new one)
    at: float  # monotonic time up to which held time is counted (or its process's end)
    # the latest time counted so far: time accrues from here (once, even after an end cut
    # ``at`` back), and a later hold of the rank starts after it
    reach: float
    seen: _Counters = _ZERO
    pending: float = 0.0
    kind: str = ""  # its latest verdict
    ended: bool = False
    steps: int = -1  # the rank's step count when last booked
    tail: float = 0.0  # and its seconds named after its last step


@dataclass(slots=True)
class _Job:
    goodput: float = 0.0
    badput: dict[str, float] = field(default_factory=dict)
    gone_since: float | None = None

    def add(self, cause: str, seconds: float) -> None:
        if seconds > 0.0:
            self.badput[cause] = self.badput.get(cause, 0.0) + seconds


def _explained(seen: _Counters, now: _Counters) -> tuple[_Counters, float]:
    """The counters' rise (never negative) and the seconds it explains (once per rank
    per verdict pass: unrolled, no generators)."""
    a, b = seen.phases, now.phases
    d0, d1, d2, d3 = b[0] - a[0], b[1] - a[1], b[2] - a[2], b[3] - a[3]
    phases = (d0 if d0 > 0.0 else 0.0, d1 if d1 > 0.0 else 0.0,
              d2 if d2 > 0.0 else 0.0, d3 if d3 > 0.0 else 0.0)  # fmt: skip
    if now.spans is _NO_SPANS:
        spans = _NO_SPANS
    else:
        spans = tuple(max(0.0, y - x) for x, y in zip(seen.spans, now.spans, strict=True))
    warmup = now.warmup - seen.warmup
    redo = now.redo - seen.redo
    d = _Counters(phases, spans, warmup if warmup > 0.0 else 0.0, redo if redo > 0.0 else 0.0)
    return d, phases[0] + phases[1] + phases[2] + phases[3] + d.warmup


def _startup(r: RankView, first_start: float, floor: float) -> float:
    """Seconds from the rank's process start to ``first_start`` (monotonic), where the
    kernel named the process and its warm-up steps were seen (steps this node did not
    see would be counted as startup), and not before ``floor``; 0 otherwise, or when the
    gap is not sane."""
    if not r.warmup_steps or r.process_started is None:
        return 0.0
    gap = first_start - max(r.process_started, floor)
    return gap if 0.0 < gap <= MAX_STARTUP else 0.0


class _Pids:
    """The pids whose start-up has been booked: a process that reports for a second job
    (a sweep, or fine-tuning after pre-training, in one process) held its GPU for the
    first, not for the second's start-up. Bounded: the oldest half goes past ``limit``."""

    def __init__(self, limit: int = 65536) -> None:
        self._seen: dict[int, None] = {}
        self._limit = limit

    def first(self, pid: int | None) -> bool:
        """Whether ``pid`` is seen here for the first time (and remember it)."""
        if not pid or pid in self._seen:
            return False
        if len(self._seen) >= self._limit:
            for old in list(self._seen)[: self._limit // 2]:
                del self._seen[old]
        self._seen[pid] = None
        return True


def _book(job: _Job, d: _Counters, total: float, seconds: float, kind: str) -> None:
    """Book ``seconds`` of explained time in the proportions of the rise ``d`` (which
    explains ``total`` seconds, :func:`_explained`)."""
    if seconds <= 0.0 or total <= 0.0:
        return
    f = seconds / total
    if kind == FAULT_KIND:
        job.add("hardware_fault", seconds)
        return
    job.add("program_startup", d.warmup * f)
    measured = total - d.warmup
    redo = min(d.redo, measured)
    job.add("wasted_progress_from_disruption", redo * f)
    keep = f * (1.0 - redo / measured) if measured > 0.0 else 0.0
    data, compute, comm, other = d.phases
    job.add("data_loading_sync", data * keep)
    job.add("exposed_communication", comm * keep)
    body = BODY_CAUSES.get(kind)
    if body is None:
        job.goodput += compute * keep
    else:
        job.add(body, compute * keep)
    named = sum(d.spans) if d.spans is not _NO_SPANS else 0.0
    if named > 0.0:
        scale = min(1.0, other / named)  # the named spans are part of "other"
        for cause, s in zip(_SPAN_INDEX, d.spans, strict=True):
            job.add(cause, s * scale * keep)
        other -= named * scale
    job.add("other", other * keep)


class GoodputLedger:
    """Books every live rank's held time per pass (sampler thread only; O(ranks))."""

    def __init__(self) -> None:
        self._books: dict[tuple[str, int], _Book] = {}
        self._jobs: dict[str, _Job] = {}
        self._pids = _Pids()

    def update(
        self,
        training: TrainingView | None,
        now: float,
        kinds: Mapping[tuple[str, int], str],
        finished: Mapping[tuple[str, int], FinishedRank],
    ) -> tuple[JobGoodput, ...]:
        """Fold in the pass at monotonic ``now``: ``kinds``, each
        rank's verdict kind; ``finished``, the ranks whose process has ended. Returns
        every job's books.

        A job first seen on this pass is served at zero and booked from the next: a
        counter whose series is born at a value loses that value to ``rate()``."""
        ranks: Sequence[RankView] = training.ranks if training is not None else ()
        present: set[tuple[str, int]] = set()
        for r in ranks:
            key = (r.job, r.rank)
            present.add(key)
            job = self._jobs.get(r.job)
            if job is None:
                self._jobs[r.job] = _Job()
                continue
            job.gone_since = None
            self._update_rank(key, r, job, now, kinds.get(key, ""), finished.get(key))
        # forgotten by the ingest: ended, and kept while the job is (the end of its hold
        # on this node, should the rank come back)
        for key, book in self._books.items():
            if key not in present and not book.ended:
                self._end(book, self._jobs[key[0]], now)
        return self._views(now, {job for job, _ in present})

    def _update_rank(
        self, key: tuple[str, int], r: RankView, job: _Job, now: float, kind: str,
        mark: FinishedRank | None,
    ) -> None:  # fmt: skip
        book = self._books.get(key)
        if (book is not None and mark is None and book.steps == r.steps
                and book.tail == r.tail_seconds and book.created == r.created
                and not book.ended):
            # no step since the last pass: the time passed is held, unexplained yet
            book.pending += max(0.0, now - book.reach)
            book.at = book.reach = now
            if kind:
                book.kind = kind
            return
        counters = _Counters.of(r)
        # no hold of this rank starts before its last one here ended
        floor = float("-inf")
        if book is not None and book.created != r.created:  # a new process: a restart, or
            self._end(book, job, book.at)  # the rank forgotten and back
            floor = book.reach
            book = None
        fresh = book is None or (book.ended and mark is None)  # new, or stepping again
        new = book is None
        if book is None:
            book = self._books[key] = _Book(r.created, now, now)
        if book.ended and mark is not None:
            book.seen = counters  # ended: nothing more is held
            book.steps, book.tail = r.steps, r.tail_seconds
            return
        d, total = _explained(book.seen, counters)
        if fresh:  # held from its first step's start, on the exporter's clock
            if new:
                since = max(min(r.held_since, now), floor)
                if self._pids.first(r.proc_pid):  # and since its process started
                    startup = _startup(r, since, floor)
                    job.add("program_startup", startup)
            else:  # stepping again since it ended: the steps' time, none before the end
                since = max(book.reach, now - total)
            book.ended = False
            book.at = book.reach = now
            book.pending = now - since
        else:
            until = now if mark is None else max(book.at, mark.held_until)
            book.pending += max(0.0, until - book.reach)
            book.at = until
            book.reach = max(book.reach, until)
        if kind:
            book.kind = kind
        booked = min(total, book.pending)
        _book(job, d, total, booked, book.kind)
        book.pending -= booked
        book.seen = counters
        book.steps, book.tail = r.steps, r.tail_seconds
        if mark is not None:
            # time already counted past the end it was held until is not held
            book.pending = max(0.0, book.pending - max(0.0, book.at - mark.held_until))
            book.at = min(book.at, mark.held_until)
            if now - mark.since >= END_GRACE:
                self._end(book, job, book.at)

    @staticmethod
    def _end(book: _Book, job: _Job, until: float) -> None:
        """The rank no longer holds its GPU: its unexplained time is idle (or lost to
        the GPU's fault)."""
        if book.ended:
            return
        book.pending += max(0.0, until - book.reach)
        job.add("hardware_fault" if book.kind == FAULT_KIND else "idle", book.pending)
        book.pending = 0.0
        book.ended = True
        book.at = max(book.at, until)
        book.reach = max(book.reach, until)

    def _views(self, now: float, present: set[str]) -> tuple[JobGoodput, ...]:
        pending: dict[str, float] = {}
        live: dict[str, int] = {}
        for (name, _), book in self._books.items():
            live[name] = live.get(name, 0) + (0 if book.ended else 1)
            pending[name] = pending.get(name, 0.0) + book.pending
        out = []
        for name in sorted(self._jobs):
            job = self._jobs[name]
            if name not in present:  # no rank of it in the ingest
                if job.gone_since is None:
                    job.gone_since = now
                elif now - job.gone_since >= JOB_LINGER:
                    del self._jobs[name]
                    for key in [k for k in self._books if k[0] == name]:
                        del self._books[key]
                    continue
            badput = tuple((cause, job.badput.get(cause, 0.0)) for cause in BADPUT_TYPES)
            out.append(JobGoodput(name, job.goodput, badput, pending.get(name, 0.0),
                                  live.get(name, 0)))  # fmt: skip
        return tuple(out)
