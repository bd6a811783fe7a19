"""Per-(job, rank) aggregation of step records, and the immutable view the sampler takes.

The ingest listener calls :meth:`Aggregator.add` on the event-loop thread for every
valid datagram; the sampler thread calls :meth:`Aggregator.view` once per pass. Both
hold one short lock: ``add`` is a few dictionary and float updates, ``view`` copies
each rank into a frozen :class:`RankView` (a few microseconds per rank). Nothing
that serves ever reads the mutable state.

What is measured (see docs/ingest.md):

- Warm-up steps count in ``steps`` and ``warmup_steps`` and move the last-step
  timestamp, and nothing else: the step-time histogram, phase seconds, tokens,
  FLOPs and MFU come from measured (non-warm-up) steps only.
- Achieved FLOP/s over the MFU window: the FLOPs of the measured steps received in the
  last ``mfu_window`` seconds, divided by the time from the first of those steps'
  start to the last one's end (the SDK's clock). A rank that keeps stepping reads its
  true rate from its first step on; one that stops reads 0 once its steps leave the
  window. The window moves in whole seconds, so memory per rank is bounded.
- A rank that sends nothing for ``rank_expiry`` seconds is forgotten: its series
  disappear from the next snapshot; if it comes back its counters restart at 0.

Who may write what (docs/ingest.md#threat-model): a job belongs to the uid of its first
rank's sender and a rank to the process that sent its first datagram (its kernel pid,
when the kernel can name it in our PID namespace), until they expire; another sender
is rejected (``not_owner``). A rank's identity labels (local_rank, pid, world_size,
uuid, precision, group) are fixed by its first datagram (``identity_changed``), so no sender
can churn series. The NCCL transport is not identity (a rank learns it after its first
steps): the latest reported value is kept, one of a closed set of four, so one series.
A uid holds at most half of ``max_jobs`` while other uids report (``cap_uid``), and
gives back its least recently active job beyond that share when another uid needs a
slot: nobody squats every job slot. UDP carries no sender: all of it is one
unauthenticated principal (``sender=None``).

A step's end time and duration are the sender's clock; the exporter judges them against
its own (docs/ingest.md#clamped-steps): a step that ends after it was received, or long
before its rank's previous step or its own receipt, ends at its receipt instead
(``clock_ahead``, ``clock_behind``); one longer than the exporter has seen its rank (since
its process started, as /proc says for the pid the kernel named, else since its first
datagram) is cut to that time, its phases in proportion (``longer_than_seen``). Each is
counted by reason and the step accepted. The hold a rank's GPU is billed for
(:attr:`RankView.held_since`, the goodput ledger's start) comes from the same judgement.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import NamedTuple, cast

from stepscope.core.exposition import NativeHistogram
from stepscope.core.labels import RankIdentity
from stepscope.core.logbudget import LogBudget
from stepscope.core.procfs import ProcessStamp
from stepscope.core.source import PartKey
from stepscope.ingest.native import NativeCounts
from stepscope.ingest.peak_flops import DATASHEET_PEAKS, PeakTable
from stepscope.shared.datagram import (
    CLAMP_REASONS,
    DEFAULT_PRECISION,
    REJECT_REASONS,
    SPANS,
    Limits,
    Phases,
    StepRecord,
)

# Upper bounds (seconds) of the step-duration histogram, for training steps from
# 10 ms (small models, inference-like loops) to 2 min (huge global batches, pipeline
# flushes); denser around 0.1-2.5 s where most LLM and vision steps fall. +Inf is added.
# The histogram is kept per job on the node (``JobView``), not per rank: every query
# that reads buckets sums a job's ranks (docs/metrics.md#what-each-family-costs-per-node),
# so all 16 bounds cost 19 series a job instead of 19 a rank.
STEP_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.35,
    0.5,
    0.75,
    1.0,
    1.5,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)

# One host, one CLOCK_REALTIME: an honest step ends before the exporter receives it, a
# flush or two of the SDK's sender (50 ms each) later. A step past its receipt by more than
# this, or ending this much before its rank's previous one, is on a wrong (or lying) clock.
CLOCK_SLACK = 2.0
# An honest step is received within about a second of its end (the SDK drops what an
# absent exporter cannot take, it does not keep it); one received later than this ended
# on a clock that is behind.
MAX_LATE = 60.0

# How often a cap hit may trigger an expiry scan (a flood of new ranks beyond the cap
# must not cost O(ranks) per datagram).
_EXPIRY_SCAN_SECONDS = 1.0

log = logging.getLogger("stepscope.ingest")


class Sender(NamedTuple):
    """Who sent a datagram, as the kernel vouches for it (``SCM_CREDENTIALS``).

    ``uid`` and ``gid`` (the effective ones; supplementary groups are not sent) as seen
    from the exporter's user namespace; ``pid`` in the exporter's PID namespace, 0 when
    the sender is in one the exporter cannot see (another pod, or a sibling container).
    """

    uid: int
    gid: int
    pid: int


@dataclass(frozen=True)
class TrainingSettings:
    """What the aggregator enforces; a SIGHUP reload may swap it.

    ``allow_uids`` / ``allow_gids``: when either is non-empty, only senders whose uid
    or gid is listed may report (the listener checks, before parsing).
    """

    limits: Limits = field(default_factory=Limits)
    mfu_window: float = 30.0
    rank_expiry: float = 300.0
    peak_flops: PeakTable = DATASHEET_PEAKS
    allow_uids: frozenset[int] = frozenset()
    allow_gids: frozenset[int] = frozenset()

    @property
    def max_jobs_per_uid(self) -> int:
        """A uid's share of the job slots while other uids report: half, at least 1."""
        return max(1, self.limits.max_jobs // 2)


class JobView(NamedTuple):
    """The step-time histogram of one job's ranks on this node, since the job was first
    seen here: it keeps counting through a rank's restart or expiry (its steps stay
    counted), so it only grows while any rank of the job is tracked.

    ``bucket_counts`` are per bucket of :data:`STEP_BUCKETS` plus +Inf (not
    cumulative); measured (non-warm-up) steps only.
    """

    job: str
    step_seconds_sum: float
    bucket_counts: tuple[int, ...]
    # ranks of the job taken over by a new process after their old one exited
    restarts: int = 0
    # measured steps' seconds in each named span of SPANS (StepReporter.phase); None: none
    span_seconds: tuple[float, ...] | None = None

    @property
    def measured_steps(self) -> int:
        """Steps in the histogram."""
        return sum(self.bucket_counts)


class RankView(NamedTuple):
    """One rank as the latest snapshot saw it. Counters are since it was first seen.

    ``bucket_counts`` are per bucket of :data:`STEP_BUCKETS` plus +Inf (not
    cumulative): the rank's share of its job's histogram. ``phase_seconds``: the
    measured steps' seconds by phase.
    ``achieved_flops_per_second`` is None until a measured step was seen;
    ``has_flops`` says whether any measured step reported FLOPs > 0.

    A NamedTuple, not a frozen dataclass: every rank's view is made every pass, and a
    frozen dataclass of 20 fields costs ~3.2 us to make (one ``object.__setattr__`` a
    field), this ~0.8 us: at 512 ranks ~1.2 ms of each pass.
    """

    job: str
    rank: int
    local_rank: int
    uuid: str | None
    pid: int | None
    world_size: int | None
    precision: str
    steps: int
    warmup_steps: int
    step_seconds_sum: float
    bucket_counts: tuple[int, ...]
    phase_seconds: Phases
    tokens: int
    flops: float
    has_flops: bool
    last_step_timestamp: float
    sdk_dropped: int
    achieved_flops_per_second: float | None
    # the network NCCL chose, as the rank last reported it; None: never reported
    nccl_transport: str | None = None
    # the rank's identity, made once when it is first seen (identity is fixed)
    ident: RankIdentity | None = None
    # the measured steps' times in exponential buckets (served as a native histogram)
    native: NativeHistogram | None = None
    # the measured steps' seconds in each named span of SPANS (part of phase "other");
    # None: the rank never named one
    span_seconds: tuple[float, ...] | None = None
    # seconds of the warm-up steps (compilation, autotuning: the goodput ledger's
    # ``program_startup``)
    warmup_seconds: float = 0.0
    # seconds of measured steps that redo progress a restart lost: steps numbered at or
    # below the highest step an earlier process of this rank reported (the SDK's
    # ``start_step`` says where a resumed run starts)
    redo_seconds: float = 0.0
    # when this process's state of the rank was made (monotonic receive time): a
    # restart (takeover) makes a new one, with counters from 0
    created: float = 0.0
    # seconds after the rank's last step that it named (a final save or evaluation; the
    # SDK's "tail" datagram, sent when its reporter closes): in no step, so in no phase;
    # ``tail_spans`` splits them by SPANS (None: never sent)
    tail_seconds: float = 0.0
    tail_spans: tuple[float, ...] | None = None
    # when the rank's process started (monotonic), read from /proc at its first step for
    # the pid the kernel named; None: not seen (UDP, another PID namespace, unreadable)
    process_started: float | None = None
    # its first step's start on the exporter's clock (monotonic): the first receipt less
    # that step's duration as judged; a step of a process not seen is not believed
    # before its receipt (the goodput ledger's hold starts here)
    held_since: float = 0.0

    @property
    def proc_pid(self) -> int | None:
        """The rank's process in this exporter's /proc (RankIdentity.proc); None where
        the exporter cannot see it."""
        return self.identity.proc

    @property
    def measured_steps(self) -> int:
        """Steps that count for step time and MFU (not warm-up)."""
        return self.steps - self.warmup_steps

    @property
    def identity(self) -> RankIdentity:
        """What names this rank in labels, with its GPU and pid."""
        if self.ident is not None:
            return self.ident
        return RankIdentity(self.job, self.rank, self.local_rank, self.uuid, self.pid, self.pid)


@dataclass(frozen=True)
class TrainingView:
    """The training side at one instant: ingest health and every live rank."""

    ingest_up: bool
    accepted: int
    rejected: Mapping[str, int] = field(default_factory=dict)
    ranks: tuple[RankView, ...] = ()
    settings: TrainingSettings = field(default_factory=TrainingSettings)
    # the step-time histogram per job (those with a live rank), by job name
    jobs: tuple[JobView, ...] = ()
    # datagrams the kernel dropped on the socket (receive buffer full); None: not exposed
    kernel_dropped: int | None = None
    # steps accepted with their time judged down, by CLAMP_REASONS
    clamped: Mapping[str, int] = field(default_factory=dict)

    @cached_property
    def by_key(self) -> Mapping[tuple[str, int], RankView]:
        """The ranks by (job, rank), built once per view (the diagnosis looks them up)."""
        return {(r.job, r.rank): r for r in self.ranks}


@dataclass(slots=True)
class _JobState:
    """A job's owner (the uid of its first rank's sender; None: UDP), its rank count,
    and the step-time histogram of its ranks (measured steps)."""

    uid: int | None
    ranks: int = 0
    dur_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))

    restarts: int = 0
    spans: list[float] | None = None  # seconds per SPANS, once a rank names one

    def view(self, job: str) -> JobView:
        spans = tuple(self.spans) if self.spans is not None else None
        return JobView(job, self.dur_sum, tuple(self.buckets), self.restarts, spans)


@dataclass(slots=True)
class _RankState:
    """Mutable per-rank accumulators, only touched under the aggregator's lock.

    The identity (local_rank to precision) and the owner are set once, at creation.
    """

    job: str
    rank: int
    local_rank: int = 0
    uuid: str | None = None
    pid: int | None = None
    world_size: int | None = None
    precision: str = DEFAULT_PRECISION
    group: str | None = None
    owner_uid: int | None = None
    owner_pid: int = 0  # the sender's kernel pid; 0: not known (another PID namespace)
    # the owner process as first seen (start time, uid): a process on the reused pid
    # is not it; None: /proc did not say
    owner_stamp: ProcessStamp | None = None
    ident: RankIdentity | None = None
    # its job's state, to count its steps in the job's histogram too (set at creation)
    job_state: _JobState | None = None
    steps: int = 0
    warmup_steps: int = 0
    dur_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(STEP_BUCKETS) + 1))
    data_wait: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    other: float = 0.0
    tokens: int = 0
    flops: float = 0.0
    has_flops: bool = False
    last_t: float = 0.0
    last_seen: float = 0.0
    dropped: int = 0
    nccl_transport: str | None = None
    native: NativeCounts = field(default_factory=NativeCounts)
    spans: list[float] | None = None  # seconds per SPANS, once the rank names one
    tail: float = 0.0  # seconds named after its last step ("tail" datagrams)
    tail_spans: list[float] | None = None
    warmup_seconds: float = 0.0
    redo_seconds: float = 0.0
    max_step: int = -1  # the highest step number reported
    # steps numbered up to this one redo what a restart lost (-1: not a restart)
    resume_until: int = -1
    created: float = 0.0
    # the hold's start on the exporter's clock (RankView.process_started, .held_since)
    started: float | None = None
    first_start: float = 0.0
    # (second, flops, first start, last end) per whole second of receive time: the
    # current second a list, updated in place; a complete one a tuple, which the garbage
    # collector stops tracking (at 512 ranks, ~16,000 objects fewer in each collection)
    window: deque[Sequence[float]] = field(default_factory=deque)
    # the window's FLOPs, and (second, value) of its complete seconds whose step start
    # is lowest / end highest from there on: the minimum and maximum are at the front
    win_flops: float = 0.0
    win_starts: deque[tuple[float, float]] = field(default_factory=deque)
    win_ends: deque[tuple[float, float]] = field(default_factory=deque)
    _pops: int = 0

    def same_identity(self, rec: StepRecord) -> bool:
        return (
            rec.local_rank == self.local_rank
            and rec.pid == self.pid
            and rec.world_size == self.world_size
            and rec.uuid == self.uuid
            and rec.precision == self.precision
            and rec.group == self.group
        )

    def observe(self, rec: StepRecord, now: float, window: float) -> None:
        self.last_seen = now
        if rec.dropped > self.dropped:  # the SDK's count only grows: a counter never falls
            self.dropped = rec.dropped
        if rec.nccl_transport is not None:  # a datagram without it says nothing new
            self.nccl_transport = rec.nccl_transport
        if rec.tail:  # not a step: named time after the last one
            self.tail += rec.dur
            if rec.spans is not None:  # the goodput ledger's, not the job's step spans
                mine = self.tail_spans
                if mine is None:
                    mine = self.tail_spans = [0.0] * len(SPANS)
                for i, v in enumerate(rec.spans):
                    mine[i] += v
            return
        self.last_t = rec.t
        self.steps += 1
        dur = rec.dur
        if rec.step > self.max_step:
            self.max_step = rec.step
        if rec.warmup:
            self.warmup_steps += 1
            self.warmup_seconds += dur
            return
        if rec.step <= self.resume_until:
            self.redo_seconds += dur
        bucket = bisect_left(STEP_BUCKETS, dur)
        self.buckets[bucket] += 1
        self.dur_sum += dur
        self.native.observe(dur)
        job = self.job_state
        if job is not None:
            job.buckets[bucket] += 1
            job.dur_sum += dur
        self.data_wait += rec.data_wait
        self.compute += rec.compute
        self.comm += rec.comm
        self.other += rec.other
        if rec.spans is not None:
            self._add_spans(rec.spans)
        self.tokens += rec.tokens
        self.flops += rec.flops
        # the SDK sends flops 0 when the job gave no FLOPs count: "none reported"
        if rec.flops > 0:
            self.has_flops = True
        sec = float(int(now))
        start = rec.t - dur
        win = self.window
        self.win_flops += rec.flops
        if win and win[-1][0] == sec:
            b = cast(list[float], win[-1])
            b[1] += rec.flops
            if start < b[2]:
                b[2] = start
            if rec.t > b[3]:
                b[3] = rec.t
        else:
            if win:  # the last second is complete: it joins the running min and max
                done = win[-1]
                _push_extreme(self.win_starts, done[0], done[2], lower=True)
                _push_extreme(self.win_ends, done[0], done[3], lower=False)
                win[-1] = tuple(done)
            win.append([sec, rec.flops, start, rec.t])
            self._expire_window(now - window - 1.0)

    def _add_spans(self, spans: tuple[float, ...]) -> None:
        """Count a step's named spans for the rank and its job."""
        mine = self.spans
        if mine is None:
            mine = self.spans = [0.0] * len(SPANS)
        job = self.job_state
        theirs = None
        if job is not None:
            theirs = job.spans
            if theirs is None:
                theirs = job.spans = [0.0] * len(SPANS)
        for i, v in enumerate(spans):
            mine[i] += v
            if theirs is not None:
                theirs[i] += v

    def _expire_window(self, cutoff: float) -> None:
        """Drop the seconds before ``cutoff`` from the window and its running figures."""
        win = self.window
        # the usual case, checked once per rank per pass: nothing to drop (the running
        # extremes only hold seconds still in the window: none is older than its first)
        if not win or win[0][0] >= cutoff:
            return
        while win and win[0][0] < cutoff:
            self.win_flops -= win.popleft()[1]
            self._pops += 1
        for extremes in (self.win_starts, self.win_ends):
            while extremes and extremes[0][0] < cutoff:
                extremes.popleft()
        if not win:
            self.win_flops = 0.0
            self._pops = 0
        elif self._pops >= len(win):  # re-add now and then: subtraction must not drift
            self.win_flops = math.fsum(b[1] for b in win)
            self._pops = 0

    def achieved(self, now: float, window: float) -> float | None:
        """FLOP/s over the window: its FLOPs over the time from its first step's start
        to its last step's end (O(1): running sum, sliding minimum and maximum)."""
        win = self.window
        self._expire_window(now - window - 1.0)
        if not win:
            return None if self.steps == self.warmup_steps else 0.0
        last = win[-1]
        first_start = min(self.win_starts[0][1], last[2]) if self.win_starts else last[2]
        last_end = max(self.win_ends[0][1], last[3]) if self.win_ends else last[3]
        span = last_end - first_start
        return self.win_flops / span if span > 0 else None

    def view(self, now: float, window: float) -> RankView:
        return RankView(
            self.job,
            self.rank,
            self.local_rank,
            self.uuid,
            self.pid,
            self.world_size,
            self.precision,
            self.steps,
            self.warmup_steps,
            self.dur_sum,
            tuple(self.buckets),
            Phases(self.data_wait, self.compute, self.comm, self.other),
            self.tokens,
            self.flops,
            self.has_flops,
            self.last_t,
            self.dropped,
            self.achieved(now, window),
            self.nccl_transport,
            self.ident,
            self.native.view(),
            tuple(self.spans) if self.spans is not None else None,
            self.warmup_seconds,
            self.redo_seconds,
            self.created,
            self.tail,
            tuple(self.tail_spans) if self.tail_spans is not None else None,
            self.started,
            self.first_start,
        )


def _push_extreme(
    extremes: deque[tuple[float, float]], sec: float, value: float, lower: bool
) -> None:
    """Add a complete second to a sliding minimum (``lower``) or maximum: values it
    outlasts and beats can never be the extreme again."""
    while extremes and (extremes[-1][1] >= value if lower else extremes[-1][1] <= value):
        extremes.pop()
    extremes.append((sec, value))


def _new_rank(
    rec: StepRecord,
    uid: int | None,
    kpid: int,
    job_state: _JobState,
    now: float,
    stamp: ProcessStamp | None = None,
) -> _RankState:
    """A rank's state from its first step: its identity, its owner and its job."""
    return _RankState(
        rec.job,
        rec.rank,
        local_rank=rec.local_rank,
        uuid=rec.uuid,
        pid=rec.pid,
        world_size=rec.world_size,
        precision=rec.precision,
        group=rec.group,
        owner_uid=uid,
        owner_pid=kpid,
        owner_stamp=stamp,
        # the process to read in /proc: the one the kernel named (in a namespace below
        # ours it reports another pid), or over UDP (no credentials) the one it reports
        ident=RankIdentity(rec.job, rec.rank, rec.local_rank, rec.uuid, rec.pid,
                           kpid or (rec.pid if uid is None else None), rec.group),
        job_state=job_state,
        created=now,
    )


class Aggregator:
    """Every live rank's accumulators and the ingest counters, behind one lock.

    ``clock`` is monotonic seconds (receive time, expiry and the MFU window);
    ``wall_clock`` Unix time, to judge the steps' end times by. ``process_stamp``: the
    process of a kernel pid as /proc shows it (its start time, uid and start as Unix
    time), read once per rank process at its first step: ownership and the bill read it.
    """

    def __init__(
        self,
        settings: TrainingSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        process_exited: Callable[[int, ProcessStamp | None], bool] | None = None,
        process_stamp: Callable[[int], ProcessStamp | None] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings or TrainingSettings()
        self._clock = clock
        self._wall = wall_clock
        # whether the process of a kernel pid, first seen as a stamp, has exited, and
        # the stamp of a live one (both read /proc: stepscope.core.procfs); without them
        # a rank is never taken over before it expires
        self._process_exited = process_exited or (lambda pid, stamp: False)
        self._process_stamp = process_stamp or (lambda pid: None)
        # takeovers and evictions are caused by senders: their lines are on a budget
        self._log = LogBudget(log, clock=clock)
        self._lock = threading.Lock()
        self._ranks: dict[tuple[str, int], _RankState] = {}
        self._jobs: dict[str, _JobState] = {}
        self._jobs_per_uid: dict[int | None, int] = {}
        self._accepted = 0
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._clamped = dict.fromkeys(CLAMP_REASONS, 0)
        self._drop_counter: Callable[[], int | None] | None = None
        self._listening: str | None = None
        self._last_scan = float("-inf")

    @property
    def settings(self) -> TrainingSettings:
        """The settings in force (the listener reads the allow-lists from them)."""
        return self._settings

    @property
    def limits(self) -> Limits:
        """The current limits (the listener validates datagrams against them)."""
        return self._settings.limits

    def update(self, settings: TrainingSettings) -> None:
        """Apply reloaded settings: caps to new ranks, window and expiry to the next view."""
        self._settings = settings

    def set_listening(self, address: str | None) -> None:
        """Record whether the ingest socket is bound (``stepscope_ingest_up``)."""
        self._listening = address

    def set_drop_counter(self, read: Callable[[], int | None] | None) -> None:
        """How to read the socket's cumulative kernel drop count, once per view (None:
        the kernel has none, or no socket)."""
        self._drop_counter = read

    def reject(self, reason: str) -> None:
        """Count a datagram dropped before aggregation (reason from REJECT_REASONS)."""
        with self._lock:
            self._rejected[reason] += 1

    def add(self, rec: StepRecord, sender: Sender | None = None) -> str | None:
        """Aggregate one valid record from ``sender`` (None: UDP, unauthenticated).

        Returns the reject reason if it was dropped: the job or rank is another
        sender's, the rank's identity labels changed, or a cap is reached.
        """
        now = self._clock()
        wall = self._wall()
        settings = self._settings
        uid = sender.uid if sender is not None else None
        kpid = sender.pid if sender is not None else 0
        with self._lock:
            state = self._ranks.get((rec.job, rec.rank))
            if state is None and rec.tail:  # a rank is made by its steps: nothing to add to
                self._accepted += 1
                return None
            if state is None:
                reason = self._admit(rec.job, uid, now, settings)
                if reason is not None:
                    self._rejected[reason] += 1
                    return reason
                state = self._ranks[(rec.job, rec.rank)] = _new_rank(
                    rec, uid, kpid, self._jobs[rec.job], now, self._stamp(kpid)
                )
                self._jobs[rec.job].ranks += 1
            elif state.owner_uid != uid or (state.owner_pid and kpid != state.owner_pid):
                # a tail takes nothing over: a new process's rank is made by its steps
                if rec.tail or not self._taken_over(state, uid, kpid):
                    self._rejected["not_owner"] += 1
                    return "not_owner"
                state = self._restart(state, rec, uid, kpid, now)
            elif not state.same_identity(rec):
                self._rejected["identity_changed"] += 1
                return "identity_changed"
            rec = self._judge(state, rec, now, wall, kpid)
            state.observe(rec, now, settings.mfu_window)
            self._accepted += 1
        return None

    def _judge(
        self, state: _RankState, rec: StepRecord, now: float, wall: float, kpid: int
    ) -> StepRecord:
        """``rec`` as the exporter's clocks allow, each change counted by its reason
        (CLAMP_REASONS); at a rank process's first step, when its hold started.

        The end (``t``) must lie between the rank's previous step's end and the receipt
        (``wall``), give or take :data:`CLOCK_SLACK`, and at most :data:`MAX_LATE` before
        the receipt; else it is the receipt. The duration must fit in the time since the
        process started (/proc, for the pid the kernel named) or, where the process is not
        seen, since the rank's first datagram; else it is cut to that, phases and spans in
        proportion. A first step of an unseen process has nothing to be judged against:
        its counters keep it, but its hold starts at its receipt."""
        first = state.steps == 0
        if first and kpid:
            state.started = self._started_at(state.owner_stamp, now, wall)
        t, dur = rec.t, rec.dur
        if t > wall + CLOCK_SLACK:
            t = wall
            self._clamped["clock_ahead"] += 1
        elif t < wall - MAX_LATE or (not first and t < state.last_t - CLOCK_SLACK):
            t = wall
            self._clamped["clock_behind"] += 1
        since = state.started
        if since is None and not first:
            since = state.created
        if since is not None and dur > now - since + CLOCK_SLACK:
            dur = max(0.0, now - since)
            self._clamped["longer_than_seen"] += 1
        if first:  # from its end as judged (steps may come in slices), never before its
            # process started, slack or not
            end = now - max(0.0, wall - t)
            state.first_start = now if state.started is None else max(end - dur, state.started)
        if dur == rec.dur:
            return rec if t == rec.t else rec._replace(t=t)
        f = dur / rec.dur
        spans = tuple(v * f for v in rec.spans) if rec.spans is not None else None
        return rec._replace(
            t=t, dur=dur, data_wait=rec.data_wait * f, compute=rec.compute * f,
            comm=rec.comm * f, other=rec.other * f, spans=spans,
        )  # fmt: skip

    @staticmethod
    def _started_at(stamp: ProcessStamp | None, now: float, wall: float) -> float | None:
        """When the rank's process (as stamped at its first step) started, on the
        monotonic clock; None where /proc did not say, or says a time to come."""
        start = stamp.started if stamp is not None else None
        if start is None or not math.isfinite(start) or start > wall:
            return None
        return now - (wall - start)

    def _taken_over(self, state: _RankState, uid: int | None, kpid: int) -> bool:
        """A restart: the same user's new process reports a rank whose process exited.

        Only between processes the kernel names (a known pid each; UDP has none), and
        only once the old one is gone: while it lives, the rank stays its own."""
        return (
            uid is not None
            and uid == state.owner_uid
            and state.owner_pid != 0
            and kpid != 0
            and self._process_exited(state.owner_pid, state.owner_stamp)
        )

    def _stamp(self, kpid: int) -> ProcessStamp | None:
        return self._process_stamp(kpid) if kpid > 0 else None

    def _restart(
        self, old: _RankState, rec: StepRecord, uid: int | None, kpid: int, now: float
    ) -> _RankState:
        """The rank anew for the process that took it over: counters from 0, identity
        from its first step, one more restart counted for its job. Its steps up to the
        highest number the old process reported redo lost progress."""
        job_state = self._jobs[rec.job]
        job_state.restarts += 1
        state = self._ranks[(rec.job, rec.rank)] = _new_rank(
            rec, uid, kpid, job_state, now, self._stamp(kpid)
        )
        state.resume_until = max(old.max_step, old.resume_until)
        self._log.log(
            "takeover", logging.INFO,
            "ingest: rank %d of job %r taken over by pid %d: its process (pid %d) has "
            "exited (restart %d of this job here)",
            rec.rank, rec.job, kpid, old.owner_pid, job_state.restarts,
        )  # fmt: skip
        return state

    def _admit(
        self, job: str, uid: int | None, now: float, settings: TrainingSettings
    ) -> str | None:
        """Whether a new (job, rank) of ``uid`` may be tracked; creates the job if new.

        A cap hit first expires stale ranks (at most once a second), then a new job
        may take the slot of a uid over its share (:meth:`_evict_for`).
        """
        reason = self._check(job, uid, settings)
        if reason in ("cap_jobs", "cap_ranks", "cap_uid") and (
            now - self._last_scan >= _EXPIRY_SCAN_SECONDS
        ):
            self._last_scan = now
            self._expire(now, settings.rank_expiry)
            reason = self._check(job, uid, settings)
        if reason == "cap_jobs" and self._evict_for(uid, settings):
            reason = None
        if reason is None and job not in self._jobs:
            self._jobs[job] = _JobState(uid)
            self._jobs_per_uid[uid] = self._jobs_per_uid.get(uid, 0) + 1
        return reason

    def _check(self, job: str, uid: int | None, settings: TrainingSettings) -> str | None:
        limits = settings.limits
        state = self._jobs.get(job)
        if state is not None:
            if state.uid != uid:
                return "not_owner"
            return "cap_ranks" if state.ranks >= limits.max_ranks_per_job else None
        mine = self._jobs_per_uid.get(uid, 0)
        others = len(self._jobs_per_uid) - (1 if mine else 0)
        if others and mine >= settings.max_jobs_per_uid:
            return "cap_uid"
        if len(self._jobs) >= limits.max_jobs:
            return "cap_jobs"
        return None

    def _evict_for(self, uid: int | None, settings: TrainingSettings) -> bool:
        """Free a job slot for ``uid`` (under its share) from the uid furthest over its
        share: that uid's least recently active job is forgotten. False if none is over.

        A uid gets more than its share only while it is alone; this gives the slots
        back when another uid needs one, so a squatter alone first cannot keep them.
        """
        share = settings.max_jobs_per_uid
        if self._jobs_per_uid.get(uid, 0) >= share:
            return False
        over = [(n, u) for u, n in self._jobs_per_uid.items() if u != uid and n > share]
        if not over:
            return False
        _, victim = max(over, key=lambda item: item[0])
        last: dict[str, float] = {}
        for (job, _), st in self._ranks.items():
            if self._jobs[job].uid == victim:
                last[job] = max(last.get(job, 0.0), st.last_seen)
        if not last:  # pragma: no cover - a job always has a rank
            return False
        job = min(last, key=last.__getitem__)
        for key in [k for k in self._ranks if k[0] == job]:
            del self._ranks[key]
        self._forget_job(job)
        self._log.log(
            "evicted_job", logging.WARNING,
            "ingest: job %r of uid %s forgotten: that uid held %d job slots, more than its "
            "share of %d, and uid %s needed one (docs/ingest.md#caps-and-expiry)",
            job,
            victim,
            self._jobs_per_uid.get(victim, 0) + 1,
            share,
            uid,
        )
        return True

    def _forget_job(self, job: str) -> None:
        uid = self._jobs.pop(job).uid
        left = self._jobs_per_uid[uid] - 1
        if left:
            self._jobs_per_uid[uid] = left
        else:
            del self._jobs_per_uid[uid]

    def _expire(self, now: float, expiry: float) -> None:
        stale = [key for key, st in self._ranks.items() if now - st.last_seen > expiry]
        for key in stale:
            del self._ranks[key]
            job = self._jobs[key[0]]
            job.ranks -= 1
            if not job.ranks:
                self._forget_job(key[0])

    def view(self) -> TrainingView:
        """An immutable copy of the current state, expired ranks dropped first."""
        now = self._clock()
        settings = self._settings
        counter = self._drop_counter
        dropped = counter() if counter is not None else None
        with self._lock:
            self._expire(now, settings.rank_expiry)
            ranks = tuple(
                self._ranks[key].view(now, settings.mfu_window) for key in sorted(self._ranks)
            )
            jobs = tuple(self._jobs[job].view(job) for job in sorted(self._jobs))
            accepted = self._accepted
            rejected = MappingProxyType(dict(self._rejected))
            clamped = MappingProxyType(dict(self._clamped))
        return TrainingView(
            ingest_up=self._listening is not None,
            accepted=accepted,
            rejected=rejected,
            ranks=ranks,
            settings=settings,
            jobs=jobs,
            kernel_dropped=dropped,
            clamped=clamped,
        )


INGEST_PART: PartKey[TrainingView] = PartKey("ingest")
